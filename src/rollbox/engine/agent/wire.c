/* Frames and I/O on descriptors: what every part of the exec agent reads and writes with. */
#include "agent.h"

void die(const char *what) {
    dprintf(2, "rollbox-agent: %s: %s\n", what, strerror(errno));
    _exit(111);
}

int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {
                struct pollfd w = {.fd = fd, .events = POLLOUT};
                poll(&w, 1, 1000);
                continue;
            }
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int send_frame(int fd, char type, const void *data, uint32_t len) {
    unsigned char hdr[5] = {(unsigned char)type, len >> 24, len >> 16, len >> 8, len};
    if (write_all(fd, hdr, 5) < 0) return -1;
    return len ? write_all(fd, data, len) : 0;
}

static int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) { /* a background process's clients are non-blocking */
            struct pollfd r = {.fd = fd, .events = POLLIN};
            if (poll(&r, 1, 1000) <= 0) return -1;
            continue;
        }
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads one frame; returns its type, or -1 on EOF or error. *data is NUL-terminated. */
int read_frame(int fd, char **data, uint32_t *len) {
    unsigned char hdr[5];
    if (read_all(fd, hdr, 5) < 0) return -1;
    *len = (uint32_t)hdr[1] << 24 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 8 | hdr[4];
    if (*len > MAX_FRAME) return -1;
    *data = malloc(*len + 1);
    if (!*data) return -1;
    if (*len && read_all(fd, *data, *len) < 0) {
        free(*data);
        return -1;
    }
    (*data)[*len] = 0;
    return hdr[0];
}

long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void push(char ***list, size_t *count, char *item) {
    if (*count + 2 > MAX_ITEMS) return;
    *list = realloc(*list, (*count + 2) * sizeof(char *));
    (*list)[(*count)++] = item;
    (*list)[*count] = NULL;
}

void append_stdin(struct request *rq, const char *data, uint32_t len) {
    rq->stdin_buf = realloc(rq->stdin_buf, rq->stdin_len + len);
    memcpy(rq->stdin_buf + rq->stdin_len, data, len);
    rq->stdin_len += len;
}

void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }
