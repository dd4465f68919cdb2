/* A command that runs while its connection waits (x without B): its output streamed as it comes, stdin and
 * signals taken as they come, its whole tree killed at its timeout or when the host goes away. */
#include "agent.h"

/* Forwards what is readable on a stream; returns 0 at EOF, 1 otherwise. */
static int pump(struct stream *s, int conn, long long cap, char *buf) {
    ssize_t n = read(s->fd, buf, CHUNK);
    if (n < 0) return (errno == EAGAIN || errno == EINTR) ? 1 : 0;
    if (n == 0) return 0;
    long long room = cap - s->sent;
    long long keep = n < room ? n : room;
    if (keep < n) s->truncated = 1;
    if (keep > 0) {
        send_frame(conn, s->type, buf, (uint32_t)keep);
        s->sent += keep;
    }
    return 1;
}

void run_request(int conn, struct request *rq, int sigfd) {
    int in[2], out[2], err[2], report[2], ready[2] = {-1, -1}, go[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
        pipe2(report, O_CLOEXEC) || (rq->isolated && (pipe2(ready, O_CLOEXEC) || pipe2(go, O_CLOEXEC))))
        die("pipe");
    int subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
    int unused;
    unsigned long long since = 0;
    read_stat(getpid(), &unused, &since);
    det_command_start();
    pid_t pid = fork();
    if (pid < 0) {
        const char *msg = "rollbox-agent: fork failed (process limit reached?)\n";
        send_frame(conn, 'r', msg, (uint32_t)strlen(msg));
        send_frame(conn, 'z', "126 0 0 0 0", 11);
        return;
    }
    if (pid == 0) exec_command(rq, in[0], out[1], err[1], report[1], ready[1], go[0]);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    close(report[1]);
    if (rq->isolated) {
        close(ready[1]);
        close(go[0]);
        map_isolated(pid, ready[0], go[1]);
        close(ready[0]);
    }

    char buf[CHUNK];
    ssize_t n = read(report[0], buf, sizeof buf - 1);
    close(report[0]);
    if (n >= 3) {
        /* exec never happened: the child reported "NNN" (exit status) and a message. */
        send_frame(conn, 'r', buf + 3, (uint32_t)(n - 3));
        waitpid(pid, NULL, 0);
        char z[32];
        send_frame(conn, 'z', z, (uint32_t)snprintf(z, sizeof z, "%.3s 0 0 0 0", buf));
        return;
    }

    char pidtxt[16];
    send_frame(conn, 'p', pidtxt, (uint32_t)snprintf(pidtxt, sizeof pidtxt, "%d", pid));
    set_nonblock(out[0]);
    set_nonblock(err[0]);
    set_nonblock(in[1]);
    struct stream streams[2] = {{out[0], 'o', 0, 0}, {err[0], 'r', 0, 0}};
    int stdin_fd = in[1];
    long long deadline = rq->timeout_ms > 0 ? now_ms() + rq->timeout_ms : 0;
    int status = 0, exited = 0, timed_out = 0, conn_open = 1;

    while (!exited) {
        if (stdin_fd >= 0 && rq->stdin_off == rq->stdin_len && rq->stdin_close) {
            close(stdin_fd);
            stdin_fd = -1;
        }
        struct pollfd fds[5] = {
            {streams[0].fd, POLLIN, 0},
            {streams[1].fd, POLLIN, 0},
            {rq->stdin_off < rq->stdin_len ? stdin_fd : -1, POLLOUT, 0},
            {conn_open ? conn : -1, POLLIN, 0},
            {sigfd, POLLIN, 0},
        };
        int wait = -1;
        if (deadline) {
            long long left = deadline - now_ms();
            wait = left > 0 ? (int)(left < 60000 ? left : 60000) : 0;
        }
        int ready = poll(fds, 5, wait);
        if (ready < 0 && errno != EINTR) die("poll");
        if (deadline && now_ms() >= deadline) {
            timed_out = 1;
            kill_tree(pid, subreaper, since);
            break;
        }
        for (int i = 0; i < 2; i++)
            if (streams[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                !pump(&streams[i], conn, rq->out_cap, buf)) {
                close(streams[i].fd);
                streams[i].fd = -1;
            }
        if (fds[2].revents & (POLLOUT | POLLERR | POLLHUP)) {
            ssize_t w = write(stdin_fd, rq->stdin_buf + rq->stdin_off, rq->stdin_len - rq->stdin_off);
            if (w > 0) rq->stdin_off += (size_t)w;
            else if (w < 0 && errno != EAGAIN) rq->stdin_off = rq->stdin_len;
        }
        if (fds[3].revents & (POLLIN | POLLHUP | POLLERR)) {
            char *data;
            uint32_t len;
            int type = read_frame(conn, &data, &len);
            if (type < 0) {
                /* The host went away: nobody will read the result, so stop the command. */
                conn_open = 0;
                kill_tree(pid, subreaper, since);
                break;
            }
            if (type == 'i') append_stdin(rq, data, len);
            else if (type == 'c') rq->stdin_close = 1;
            else if (type == 's') kill(-pid, atoi(data));
            free(data);
        }
        if (fds[4].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) > 0) {
            }
            pid_t done;
            int st;
            while ((done = waitpid(-1, &st, WNOHANG)) > 0)
                if (done == pid) {
                    status = st;
                    exited = 1;
                }
        }
    }
    if (!exited) waitpid(pid, &status, 0);
    det_command_end();
    /* Output the command wrote before it ended is already in the pipes: forward it. What
     * background processes write later is drained and dropped below, so they never see EPIPE. */
    for (int i = 0; i < 2; i++)
        while (streams[i].fd >= 0 && pump(&streams[i], conn, rq->out_cap, buf)) {
            struct pollfd p = {streams[i].fd, POLLIN, 0};
            if (poll(&p, 1, 0) <= 0) break;
        }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    char z[64];
    int zl = snprintf(z, sizeof z, "%d %d %d %d %d", timed_out ? -1 : code, sig, timed_out,
                      streams[0].truncated, streams[1].truncated);
    if (conn_open) send_frame(conn, 'z', z, (uint32_t)zl);
    close(conn);
    if (go[1] >= 0) close(go[1]);
    if (stdin_fd >= 0) close(stdin_fd);
    for (;;) {
        struct pollfd fds[2] = {{streams[0].fd, POLLIN, 0}, {streams[1].fd, POLLIN, 0}};
        if (fds[0].fd < 0 && fds[1].fd < 0) break;
        if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
        for (int i = 0; i < 2; i++)
            if (fds[i].revents && read(streams[i].fd, buf, CHUNK) <= 0) {
                close(streams[i].fd);
                streams[i].fd = -1;
            }
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}
