/* The supervisor of a background process: it reads the command's output into the ring whether or not anyone
 * follows it, and serves its clients (host connections handed over by handlers), each from its own offset. */
#include "agent.h"

static int queue(struct client *c, char type, const void *data, uint32_t len) {
    if (c->sent > 0) {
        memmove(c->out, c->out + c->sent, c->used - c->sent);
        c->used -= c->sent;
        c->sent = 0;
    }
    if (c->used + 5 + len > OUTBUF) return -1;
    unsigned char hdr[5] = {(unsigned char)type, len >> 24, len >> 16, len >> 8, len};
    memcpy(c->out + c->used, hdr, 5);
    memcpy(c->out + c->used + 5, data, len);
    c->used += 5 + len;
    return 0;
}

static void drop_client(struct supervisor *s, int i) {
    close(s->clients[i].fd);
    free(s->clients[i].out);
    s->clients[i] = s->clients[--s->nclients];
}

static void ack(struct supervisor *s, struct client *c, long long offset) {
    char text[64];
    queue(c, 'k', text, (uint32_t)snprintf(text, sizeof text, "%d %lld", s->pid, offset));
}

/* Where a follower asking for `offset` starts: the record holding it, within the output kept. */
static long long follow_from(struct supervisor *s, struct client *c, long long offset) {
    struct ring *r = &s->ring;
    if (offset < 0 || offset > r->end) offset = r->end;
    if (offset < r->first) {
        offset = r->first;
        c->missed = 1;
    }
    c->pos = r->tail;
    c->skip = 0;
    while (c->pos < r->head) {
        char t;
        uint32_t l;
        long long o;
        ring_header(r, c->pos, &t, &l, &o);
        if (o + l > offset) {
            c->skip = offset > o ? (uint32_t)(offset - o) : 0;
            break;
        }
        c->pos += REC_HEADER + l;
    }
    c->follow = 1;
    return offset;
}

/* Reads one batch frame from a client; returns -1 when the client is done (or the process is forgotten). */
static int client_frame(struct supervisor *s, int i) {
    struct client *c = &s->clients[i];
    char *data;
    uint32_t len;
    int type = read_frame(c->fd, &data, &len);
    if (type < 0) return -1;
    struct request *rq = s->rq;
    switch (type) {
    case 'f':
        if (c->follow == 0) c->follow = -1; /* resolved at x */
        c->asked = atoll(data);
        break;
    case 'i':
        if (s->stdin_fd >= 0 && !rq->stdin_close) append_stdin(rq, data, len);
        break;
    case 'c': rq->stdin_close = 1; break;
    case 's': if (s->running) kill(-s->pid, atoi(data)); break;
    case 'S': if (s->running) signal_descendants(s->pid, atoi(data)); break;
    case 'w':
        if (s->master >= 0) {
            struct winsize ws = {0};
            if (sscanf(data, "%hu %hu", &ws.ws_row, &ws.ws_col) == 2) ioctl(s->master, TIOCSWINSZ, &ws);
        }
        break;
    case 'K': {
        kill_tree(s->pid, s->subreaper, s->since);
        char text[MAX_ID + 4];
        snprintf(text, sizeof text, "F %s", rq->background);
        tell_main(text, -1);
        send_frame(c->fd, 'k', "", 0);
        _exit(0);
    }
    case 'x':
        if (c->follow == -1) {
            ack(s, c, follow_from(s, c, c->asked));
        } else {
            ack(s, c, s->ring.end);
        }
        break;
    }
    free(data);
    return 0;
}

/* Moves what a client may have next into its buffer: the next record, a gap, or the end. */
static void refill(struct supervisor *s, struct client *c) {
    struct ring *r = &s->ring;
    if (c->follow != 1 || c->ending || c->used - c->sent > 0) return;
    if (c->pos < r->tail) {
        char text[32];
        c->pos = r->tail;
        c->skip = 0;
        c->missed = 1;
        queue(c, 'g', text, (uint32_t)snprintf(text, sizeof text, "%lld", r->first));
        return;
    }
    if (c->pos < r->head) {
        char t;
        uint32_t l;
        long long o;
        ring_header(r, c->pos, &t, &l, &o);
        char *data = malloc(l);
        if (!data) return;
        ring_copy(r, c->pos + REC_HEADER, data, l, 1);
        queue(c, t, data + c->skip, l - c->skip);
        free(data);
        c->pos += REC_HEADER + l;
        c->skip = 0;
        return;
    }
    if (!s->running) {
        int st = s->status, dropped = c->missed;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        char z[64];
        queue(c, 'z', z, (uint32_t)snprintf(z, sizeof z, "%d %d %d %d %d", s->timed_out ? -1 : code, sig,
                                             s->timed_out, dropped, dropped));
        c->ending = 1;
    }
}

static void command_ended(struct supervisor *s, int status) {
    s->running = 0;
    s->status = status;
    /* What the command wrote before it ended is in the pipes: keep it. Later output (of processes it left
     * behind) is read and dropped, so that they never block on a full pipe. */
    char buf[CHUNK];
    for (int i = 0; i < 2; i++)
        while (s->streams[i].fd >= 0) {
            ssize_t n = read(s->streams[i].fd, buf, CHUNK);
            if (n <= 0) break;
            ring_put(&s->ring, s->streams[i].type, buf, (uint32_t)n);
        }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char text[MAX_ID + 64];
    snprintf(text, sizeof text, "X %s %d %d %d", s->rq->background, s->timed_out ? -1 : code,
             WIFSIGNALED(status) ? WTERMSIG(status) : 0, s->timed_out);
    tell_main(text, -1);
}

void supervise(struct supervisor *s, int sigfd) {
    struct request *rq = s->rq;
    long long deadline = rq->timeout_ms > 0 ? now_ms() + rq->timeout_ms : 0;
    char buf[CHUNK];
    for (;;) {
        if (s->stdin_fd >= 0 && rq->stdin_off == rq->stdin_len) {
            rq->stdin_off = rq->stdin_len = 0;
            if (rq->stdin_close) {
                if (s->master >= 0) {
                    write(s->stdin_fd, "\x04", 1); /* end of file on a terminal */
                } else {
                    close(s->stdin_fd);
                    s->stdin_fd = -1;
                }
                rq->stdin_close = 0;
            }
        }
        for (int i = 0; i < s->nclients; i++) refill(s, &s->clients[i]);
        struct pollfd fds[5 + MAX_CLIENTS];
        int base = 5;
        fds[0] = (struct pollfd){s->streams[0].fd, POLLIN, 0};
        fds[1] = (struct pollfd){s->streams[1].fd, POLLIN, 0};
        fds[2] = (struct pollfd){rq->stdin_off < rq->stdin_len ? s->stdin_fd : -1, POLLOUT, 0};
        fds[3] = (struct pollfd){sigfd, POLLIN, 0};
        fds[4] = (struct pollfd){s->inbox, POLLIN, 0};
        for (int i = 0; i < s->nclients; i++) {
            struct client *c = &s->clients[i];
            short events = rq->stdin_len < STDIN_MAX && !c->ending ? POLLIN : 0;
            if (c->used > c->sent) events |= POLLOUT;
            fds[base + i] = (struct pollfd){c->fd, events, 0};
        }
        int wait = -1;
        if (deadline && s->running) {
            long long left = deadline - now_ms();
            wait = left > 0 ? (int)(left < 60000 ? left : 60000) : 0;
        }
        int ready = poll(fds, (nfds_t)(base + s->nclients), wait);
        if (ready < 0 && errno != EINTR) die("poll");
        if (deadline && s->running && now_ms() >= deadline) {
            s->timed_out = 1;
            kill_tree(s->pid, s->subreaper, s->since); /* reaps the command too */
            if (s->running) command_ended(s, SIGKILL);
        }
        for (int i = 0; i < 2; i++) {
            struct stream *st = &s->streams[i];
            if (st->fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(st->fd, buf, CHUNK);
            if (n > 0 && s->running) ring_put(&s->ring, st->type, buf, (uint32_t)n);
            else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                close(st->fd);
                if (st->fd == s->master) s->master = -1;
                if (st->fd == s->stdin_fd) s->stdin_fd = -1;
                st->fd = -1;
            }
        }
        if (fds[2].revents & (POLLOUT | POLLERR | POLLHUP)) {
            ssize_t w = write(s->stdin_fd, rq->stdin_buf + rq->stdin_off, rq->stdin_len - rq->stdin_off);
            if (w > 0) rq->stdin_off += (size_t)w;
            else if (w < 0 && errno != EAGAIN) rq->stdin_off = rq->stdin_len;
        }
        if (fds[3].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) > 0) {
            }
            pid_t done;
            int st;
            while ((done = waitpid(-1, &st, WNOHANG)) > 0)
                if (done == s->pid && s->running) command_ended(s, st);
        }
        for (int i = s->nclients - 1; i >= 0; i--) {
            struct client *c = &s->clients[i];
            short revents = fds[base + i].revents;
            if (revents & POLLOUT) {
                ssize_t w = write(c->fd, c->out + c->sent, c->used - c->sent);
                if (w > 0) c->sent += (size_t)w;
                else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                    drop_client(s, i);
                    continue;
                }
                if (c->ending && c->sent == c->used) {
                    drop_client(s, i);
                    continue;
                }
            }
            if ((revents & (POLLIN | POLLHUP | POLLERR)) && client_frame(s, i) < 0) drop_client(s, i);
        }
        if (fds[4].revents & (POLLHUP | POLLERR)) { /* the agent forgot this process */
            kill_tree(s->pid, s->subreaper, s->since);
            _exit(0);
        }
        /* New clients, handed over by handlers through the inbox. */
        while (fds[4].revents & POLLIN) {
            char byte, control[CMSG_SPACE(sizeof(int))];
            struct iovec iov = {&byte, 1};
            struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                                 .msg_controllen = sizeof control};
            if (recvmsg(s->inbox, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) <= 0) break;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            if (!cm && byte == 'H') { /* the agent holds for a checkpoint: see let_go_of_clients() */
                while (s->nclients > 0) drop_client(s, 0);
                send(s->inbox, "h", 1, MSG_DONTWAIT);
                continue;
            }
            if (!cm || cm->cmsg_type != SCM_RIGHTS) continue;
            int fd;
            memcpy(&fd, CMSG_DATA(cm), sizeof fd);
            if (s->nclients >= MAX_CLIENTS) {
                send_error(fd, "too many clients of this process");
                close(fd);
                continue;
            }
            set_nonblock(fd);
            struct client *c = &s->clients[s->nclients++];
            *c = (struct client){.fd = fd, .out = malloc(OUTBUF)};
            if (!c->out) die("malloc");
        }
    }
}
