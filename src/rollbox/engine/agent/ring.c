/* A background process's output, kept to be read back in a ring of bounded size (agent.h has its layout). */
#include "agent.h"

void ring_copy(struct ring *r, unsigned long long pos, void *dst, size_t n, int out) {
    size_t at = (size_t)(pos % r->cap), first = n < r->cap - at ? n : r->cap - at;
    if (out) {
        memcpy(dst, r->buf + at, first);
        memcpy((char *)dst + first, r->buf, n - first);
    } else {
        memcpy(r->buf + at, dst, first);
        memcpy(r->buf, (char *)dst + first, n - first);
    }
}

void ring_header(struct ring *r, unsigned long long pos, char *type, uint32_t *len, long long *offset) {
    char h[REC_HEADER];
    ring_copy(r, pos, h, REC_HEADER, 1);
    *type = h[0];
    memcpy(len, h + 1, 4);
    memcpy(offset, h + 5, 8);
}

void ring_put(struct ring *r, char type, const char *data, uint32_t len) {
    long long offset = r->end;
    r->end += len;
    if (len + REC_HEADER > r->cap) { /* keep the newest part of a record larger than the whole ring */
        uint32_t keep = (uint32_t)(r->cap - REC_HEADER);
        offset += len - keep;
        data += len - keep;
        len = keep;
    }
    while (r->head - r->tail + REC_HEADER + len > r->cap) {
        char t;
        uint32_t l;
        long long o;
        ring_header(r, r->tail, &t, &l, &o);
        r->tail += REC_HEADER + l;
    }
    char h[REC_HEADER];
    h[0] = type;
    memcpy(h + 1, &len, 4);
    memcpy(h + 5, &offset, 8);
    ring_copy(r, r->head, h, REC_HEADER, 0);
    ring_copy(r, r->head + REC_HEADER, (void *)data, len, 0);
    r->head += REC_HEADER + len;
    if (r->tail == r->head) {
        r->first = r->end;
    } else {
        char t;
        uint32_t l;
        ring_header(r, r->tail, &t, &l, &r->first);
    }
}
