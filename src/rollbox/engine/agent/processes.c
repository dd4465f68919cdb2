/*
 * Background processes of the exec agent. Part of agent.c's translation unit (included from it, after the
 * helpers it shares), so it is compiled and versioned with it.
 *
 * A background process outlives the connection that started it. The handler forked for that connection
 * becomes its supervisor: it forks the command (on pipes or on a terminal), keeps its output in a ring of
 * bounded size (in the sandbox's memory, accounted to its cgroup, never the host's), and serves clients:
 * host connections handed to it, each of which may follow the output from an offset and send stdin,
 * signals and terminal sizes. Output is read from the command whether or not anyone follows it, so a
 * client that stops reading never blocks the process; a client that falls behind the ring skips ahead.
 *
 * The agent's main process keeps the table of background processes, so that a later connection can find
 * one: each supervisor registers over a SOCK_SEQPACKET "registry" with one end of its inbox, a socket
 * pair on which handlers pass it their connections (SCM_RIGHTS). A handler forks with a copy of the
 * table, which it reads to list processes and to find an inbox. Main drains the registry before it
 * accepts a connection, so a process whose start was answered is found by the next request.
 *
 * Host -> agent, on a new connection
 *   B id       run the command (the usual a/e/d/u/t/l/i/c frames, then x) in the background as `id`;
 *              T "rows cols" runs it on a terminal; n tag; S marks a shell session.
 *              Answer: q (its info), or E message.
 *   L          list: q per process, then k.
 *   A id       hand the connection to process `id`'s supervisor (E message if there is none). Then any
 *              number of batches, each ended by x and answered by k "pid offset":
 *              f offset (follow its output from there; -1: from now) | i stdin | c close stdin |
 *              s signal (its process group) | S signal (everything it started, not itself) |
 *              w "rows cols" (resize) | K (kill it and forget it; the answer k is the last frame)
 *   Following:  o stdout | r stderr | g offset (output was dropped: it resumes there) |
 *              z "exit signal timed_out missed missed" once it ended and everything kept was sent (missed:
 *              output this client asked for had been dropped).
 * q: id, pid, running, exit, signal, timed_out, pty, shell, started (ms since the epoch), cwd, tag,
 * argv..., each ended by NUL.
 */

#define MAX_PROCS 1024
#define MAX_ENDED 256 /* ended processes kept to be read back; the oldest goes first */
#define MAX_CLIENTS 64
#define STDIN_MAX (1 << 20)
#define MAX_ID 64
#define MAX_DESC 32768
#define OUTBUF (CHUNK + 1024) /* one record and room for acknowledgements */
#define REC_HEADER 13         /* type, length (4), offset (8) */

struct proc_entry {
    char id[MAX_ID + 1];
    pid_t supervisor, pid;
    int inbox; /* main's end of the supervisor's inbox */
    int running, code, sig, timed_out, pty, shell;
    long long started;
    unsigned long long ended_order;
    char *desc; /* cwd, tag, argv..., NUL-separated */
    uint32_t desc_len;
};

static struct proc_entry procs[MAX_PROCS];
static int nprocs;
static unsigned long long ended_counter;
static int registry[2] = {-1, -1};

static int valid_id(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n > MAX_ID) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') || (id[i] >= '0' && id[i] <= '9') ||
              id[i] == '-' || id[i] == '_'))
            return 0;
    return 1;
}

static struct proc_entry *find_proc(const char *id) {
    for (int i = 0; i < nprocs; i++)
        if (strcmp(procs[i].id, id) == 0) return &procs[i];
    return NULL;
}

static void send_error(int conn, const char *msg) { send_frame(conn, 'E', msg, (uint32_t)strlen(msg)); }

/* -- the table, in the main process -------------------------------------------------------------- */

static void registry_open(void) {
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, registry) < 0) die("registry");
    set_nonblock(registry[0]);
}

static void forget_entry(struct proc_entry *e) {
    close(e->inbox);
    free(e->desc);
    *e = procs[--nprocs];
}

/* Reads what supervisors told: R (registered, with its inbox), X (its command ended), F (forget it). */
static void registry_drain(void) {
    for (;;) {
        char buf[MAX_DESC + 256];
        char control[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {buf, sizeof buf - 1};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t n = recvmsg(registry[0], &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n <= 0) return;
        buf[n] = 0;
        int fd = -1;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
        char id[MAX_ID + 1];
        if (buf[0] == 'R') {
            struct proc_entry e = {.inbox = fd, .running = 1};
            int used = 0;
            if (fd < 0 || nprocs >= MAX_PROCS ||
                sscanf(buf + 1, "%64s %d %d %d %d %d %d %d %d %lld%n", e.id, &e.supervisor, &e.pid, &e.running,
                       &e.code, &e.sig, &e.timed_out, &e.pty, &e.shell, &e.started, &used) != 10) {
                if (fd >= 0) close(fd);
                continue;
            }
            const char *desc = buf + 1 + used + 1;
            e.desc_len = (uint32_t)(n - (desc - buf));
            e.desc = malloc(e.desc_len + 1);
            if (!e.desc) die("malloc");
            memcpy(e.desc, desc, e.desc_len);
            if (!e.running) e.ended_order = ++ended_counter;
            procs[nprocs++] = e;
        } else if (buf[0] == 'X') {
            struct proc_entry e = {0};
            if (sscanf(buf + 1, "%64s %d %d %d", id, &e.code, &e.sig, &e.timed_out) != 4) continue;
            struct proc_entry *found = find_proc(id);
            if (!found) continue;
            found->running = 0;
            found->code = e.code;
            found->sig = e.sig;
            found->timed_out = e.timed_out;
            found->ended_order = ++ended_counter;
        } else if (buf[0] == 'F') {
            struct proc_entry *found = sscanf(buf + 1, "%64s", id) == 1 ? find_proc(id) : NULL;
            if (found) forget_entry(found);
        }
        if (fd >= 0 && buf[0] != 'R') close(fd);
        /* Too many ended processes kept: end the supervisor of the oldest (reaped below). */
        int ended = 0, oldest = -1;
        for (int i = 0; i < nprocs; i++)
            if (!procs[i].running) {
                ended++;
                if (oldest < 0 || procs[i].ended_order < procs[oldest].ended_order) oldest = i;
            }
        if (ended > MAX_ENDED) {
            kill(procs[oldest].supervisor, SIGKILL);
            forget_entry(&procs[oldest]);
        }
    }
}

/* The host's connections that supervisors follow output on cannot be checkpointed either: main asks each
 * supervisor (H on its inbox) to drop its clients, and waits a little for each to say it has (h). A dropped
 * client is the host's follower, which follows again from its offset once the sandbox listens again. */
static void let_go_of_clients(void) {
    for (int i = 0; i < nprocs; i++) send(procs[i].inbox, "H", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    long long deadline = now_ms() + 1000;
    for (int i = 0; i < nprocs; i++) {
        struct pollfd answer = {procs[i].inbox, POLLIN, 0};
        char byte = 0;
        while (byte != 'h' && now_ms() < deadline && poll(&answer, 1, (int)(deadline - now_ms())) > 0)
            if (recv(procs[i].inbox, &byte, 1, MSG_DONTWAIT) <= 0) break;
    }
}

/* A reaped child of the main process: if it was a supervisor, its process is gone. */
static void proc_reaped(pid_t pid) {
    for (int i = 0; i < nprocs; i++)
        if (procs[i].supervisor == pid) {
            forget_entry(&procs[i]);
            return;
        }
}

/* -- requests a handler answers from its copy of the table --------------------------------------- */

static int info_frame(int conn, const struct proc_entry *e) {
    char head[256];
    int n = snprintf(head, sizeof head, "%s%c%d%c%d%c%d%c%d%c%d%c%d%c%d%c%lld", e->id, 0, e->pid, 0, e->running, 0,
                     e->code, 0, e->sig, 0, e->timed_out, 0, e->pty, 0, e->shell, 0, e->started);
    char *frame = malloc((size_t)n + 1 + e->desc_len);
    if (!frame) return -1;
    memcpy(frame, head, (size_t)n + 1);
    memcpy(frame + n + 1, e->desc, e->desc_len);
    int rc = send_frame(conn, 'q', frame, (uint32_t)(n + 1 + e->desc_len));
    free(frame);
    return rc;
}

static void list_procs(int conn) {
    for (int i = 0; i < nprocs; i++)
        if (info_frame(conn, &procs[i]) < 0) return;
    send_frame(conn, 'k', "", 0);
}

/* Hands the connection to the supervisor of `id`, which reads the rest of it. */
static void attach_proc(int conn, const char *id) {
    struct proc_entry *e = find_proc(id);
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct iovec iov = {"C", 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &conn, sizeof conn);
    if (!e || sendmsg(e->inbox, &msg, MSG_NOSIGNAL) < 0) send_error(conn, "no such process");
}

/* -- the supervisor ------------------------------------------------------------------------------- */

/* Output kept to be read back: records (type, length, offset, data) in a circular buffer of bounded size;
 * positions grow without end and index the buffer modulo its size. Offsets count output bytes. */
struct ring {
    char *buf;
    size_t cap;
    unsigned long long tail, head;
    long long first, end; /* offset of the oldest byte kept, and past the newest */
};

static void ring_copy(struct ring *r, unsigned long long pos, void *dst, size_t n, int out) {
    size_t at = (size_t)(pos % r->cap), first = n < r->cap - at ? n : r->cap - at;
    if (out) {
        memcpy(dst, r->buf + at, first);
        memcpy((char *)dst + first, r->buf, n - first);
    } else {
        memcpy(r->buf + at, dst, first);
        memcpy(r->buf, (char *)dst + first, n - first);
    }
}

static void ring_header(struct ring *r, unsigned long long pos, char *type, uint32_t *len, long long *offset) {
    char h[REC_HEADER];
    ring_copy(r, pos, h, REC_HEADER, 1);
    *type = h[0];
    memcpy(len, h + 1, 4);
    memcpy(offset, h + 5, 8);
}

static void ring_put(struct ring *r, char type, const char *data, uint32_t len) {
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

struct client {
    int fd, follow, ending, missed; /* missed: output it asked for was dropped before it was sent */
    long long asked; /* the offset asked for by f, applied at x */
    unsigned long long pos; /* the next record to send */
    uint32_t skip;          /* bytes of that record already covered by the offset asked for */
    char *out;
    size_t used, sent;
};

struct supervisor {
    struct request *rq;
    pid_t pid;
    int running, status, timed_out, subreaper;
    unsigned long long since;
    int stdin_fd, master; /* master: the terminal's, or -1 */
    int inbox;            /* where handlers hand over clients */
    struct stream streams[2];
    struct ring ring;
    struct client clients[MAX_CLIENTS];
    int nclients;
};

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

static void signal_descendants(pid_t root, int sig) {
    DIR *proc = opendir("/proc");
    if (!proc) return;
    struct dirent *entry;
    while ((entry = readdir(proc))) {
        pid_t pid = (pid_t)atoi(entry->d_name);
        if (pid > 1 && pid != root && is_descendant(pid, root)) kill(pid, sig);
    }
    closedir(proc);
}

static void tell_main(const char *text, int fd) {
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct iovec iov = {(void *)text, strlen(text)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    while (sendmsg(registry[1], &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
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

static void supervise(struct supervisor *s, int sigfd) {
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

/* Starts `rq` in the background and supervises it until it is forgotten (this handler's process). */
static void run_background(int conn, struct request *rq, int sigfd) {
    if (!valid_id(rq->background)) return send_error(conn, "process id: use 1 to 64 letters, digits, - or _");
    if (find_proc(rq->background)) return send_error(conn, "a process with this id exists in the sandbox");
    if (nprocs >= MAX_PROCS) return send_error(conn, "too many background processes in the sandbox");
    int inbox[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, inbox) < 0)
        return send_error(conn, "no socket for the process (descriptor limit reached?)");
    for (int i = 0; i < nprocs; i++) close(procs[i].inbox);
    nprocs = 0;

    struct supervisor s = {.rq = rq, .master = -1, .running = 1, .inbox = inbox[1]};
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, report[2];
    int child_in, child_out, child_err;
    if (pipe2(report, O_CLOEXEC)) return send_error(conn, "no pipe for the process");
    if (rq->pty) {
        int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC), unlock = 0, number = -1;
        char path[64];
        if (master < 0 || ioctl(master, TIOCSPTLCK, &unlock) < 0 || ioctl(master, TIOCGPTN, &number) < 0)
            return send_error(conn, "no terminal in the sandbox (/dev/ptmx)");
        snprintf(path, sizeof path, "/dev/pts/%d", number);
        int slave = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (slave < 0) return send_error(conn, "no terminal in the sandbox (/dev/pts)");
        struct winsize ws = {.ws_row = (unsigned short)rq->rows, .ws_col = (unsigned short)rq->cols};
        ioctl(master, TIOCSWINSZ, &ws);
        s.master = master;
        child_in = child_out = child_err = slave;
        s.stdin_fd = master;
        s.streams[0] = (struct stream){master, 'o', 0, 0};
        s.streams[1] = (struct stream){-1, 'r', 0, 0};
    } else {
        if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
            return send_error(conn, "no pipes for the process (descriptor limit reached?)");
        child_in = in[0];
        child_out = out[1];
        child_err = err[1];
        s.stdin_fd = in[1];
        s.streams[0] = (struct stream){out[0], 'o', 0, 0};
        s.streams[1] = (struct stream){err[0], 'r', 0, 0};
    }
    size_t cap = rq->out_cap < (1LL << 30) ? (size_t)rq->out_cap : (size_t)1 << 30;
    s.ring.cap = cap + REC_HEADER + 1;
    s.ring.buf = malloc(s.ring.cap);
    if (!s.ring.buf) return send_error(conn, "no memory for the process's output (memory limit reached?)");
    s.subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
    int unused;
    read_stat(getpid(), &unused, &s.since);
    s.pid = fork();
    if (s.pid < 0) return send_error(conn, "fork failed (process limit reached?)");
    if (s.pid == 0) exec_command(rq, child_in, child_out, child_err, report[1], -1, -1);
    close(child_in);
    if (child_out != child_in) close(child_out);
    if (child_err != child_in) close(child_err);
    close(report[1]);
    char buf[1024];
    ssize_t n = read(report[0], buf, sizeof buf - 1);
    close(report[0]);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct proc_entry e = {.pid = s.pid, .supervisor = getpid(), .running = 1, .pty = rq->pty, .shell = rq->shell,
                           .started = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000};
    snprintf(e.id, sizeof e.id, "%s", rq->background);
    if (n >= 3) { /* exec never happened: it ended at once, with the child's message as its stderr */
        int status;
        waitpid(s.pid, &status, 0);
        ring_put(&s.ring, 'r', buf + 3, (uint32_t)(n - 3));
        s.running = 0;
        s.status = (atoi(buf) & 0xff) << 8;
        e.running = 0;
        e.code = atoi(buf);
    }
    /* Register: the header, then cwd, tag and argv. */
    char *msg = malloc(MAX_DESC + 256);
    if (!msg) die("malloc");
    int len = snprintf(msg, 256, "R%s %d %d %d %d %d %d %d %d %lld", e.id, e.supervisor, e.pid, e.running, e.code,
                       e.sig, e.timed_out, e.pty, e.shell, e.started);
    msg[len++] = 0;
    e.desc = msg + len;
    const char *parts[2] = {rq->cwd ? rq->cwd : "", rq->tag ? rq->tag : ""};
    for (size_t i = 0; i < 2 + rq->argc; i++) {
        const char *part = i < 2 ? parts[i] : rq->argv[i - 2];
        size_t l = strlen(part) + 1;
        if ((size_t)len + l > MAX_DESC + 255) break;
        memcpy(msg + len, part, l);
        len += (int)l;
    }
    e.desc_len = (uint32_t)(msg + len - e.desc);
    msg[len] = 0;
    struct iovec iov = {msg, (size_t)len};
    char control[CMSG_SPACE(sizeof(int))] = {0};
    struct msghdr reg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    struct cmsghdr *c = CMSG_FIRSTHDR(&reg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &inbox[0], sizeof(int));
    while (sendmsg(registry[1], &reg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
    close(inbox[0]);
    info_frame(conn, &e);
    free(msg);
    close(conn);
    if (s.stdin_fd >= 0) set_nonblock(s.stdin_fd);
    for (int i = 0; i < 2; i++)
        if (s.streams[i].fd >= 0) set_nonblock(s.streams[i].fd);
    if (!s.running && s.stdin_fd >= 0 && s.master < 0) {
        close(s.stdin_fd);
        s.stdin_fd = -1;
    }
    supervise(&s, sigfd);
}
