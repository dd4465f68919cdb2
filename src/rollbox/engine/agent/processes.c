/*
 * Background processes of the exec agent: their table, in the main process, and the requests a handler
 * answers from its copy of it (background.c starts a process, supervisor.c follows it, ring.c keeps its
 * output).
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
#include "agent.h"

struct proc_entry procs[MAX_PROCS];
int nprocs;
static unsigned long long ended_counter;
int registry[2] = {-1, -1};

int valid_id(const char *id) {
    size_t n = strlen(id);
    if (n == 0 || n > MAX_ID) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') || (id[i] >= '0' && id[i] <= '9') ||
              id[i] == '-' || id[i] == '_'))
            return 0;
    return 1;
}

struct proc_entry *find_proc(const char *id) {
    for (int i = 0; i < nprocs; i++)
        if (strcmp(procs[i].id, id) == 0) return &procs[i];
    return NULL;
}

void send_error(int conn, const char *msg) { send_frame(conn, 'E', msg, (uint32_t)strlen(msg)); }

/* -- the table, in the main process -------------------------------------------------------------- */

void registry_open(void) {
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, registry) < 0) die("registry");
    set_nonblock(registry[0]);
}

static void forget_entry(struct proc_entry *e) {
    close(e->inbox);
    free(e->desc);
    *e = procs[--nprocs];
}

/* Reads what supervisors told: R (registered, with its inbox), X (its command ended), F (forget it). */
void registry_drain(void) {
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
void let_go_of_clients(void) {
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
void proc_reaped(pid_t pid) {
    for (int i = 0; i < nprocs; i++)
        if (procs[i].supervisor == pid) {
            forget_entry(&procs[i]);
            return;
        }
}

/* -- requests a handler answers from its copy of the table --------------------------------------- */

int info_frame(int conn, const struct proc_entry *e) {
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

void list_procs(int conn) {
    for (int i = 0; i < nprocs; i++)
        if (info_frame(conn, &procs[i]) < 0) return;
    send_frame(conn, 'k', "", 0);
}

/* Hands the connection to the supervisor of `id`, which reads the rest of it. */
void attach_proc(int conn, const char *id) {
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

void tell_main(const char *text, int fd) {
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
