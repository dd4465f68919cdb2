/* Starting a background process: its pipes or terminal, its fork, and its entry in main's table; the handler
 * that started it then becomes its supervisor. */
#include "agent.h"

/* Starts `rq` in the background and supervises it until it is forgotten (this handler's process). */
void run_background(int conn, struct request *rq, int sigfd) {
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
    det_command_start();
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
