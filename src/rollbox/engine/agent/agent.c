/*
 * rollbox exec agent: the init process of every sandbox.
 *
 * The host hands it a listening unix socket (by fd, so the socket never appears inside the
 * sandbox, or by path where the runtime cannot pass fds). Each connection carries one request:
 * a ping, or one command to run. Commands are forked from the agent, so they inherit the
 * sandbox's namespaces, cgroup and seccomp filter; they lose every capability before exec.
 *
 * Wire format, both directions: 1 byte type, 4 bytes big-endian length, payload.
 *   host -> agent  a argv item | e env "K=V" | d cwd | u "uid gid [group...]" | t timeout ms
 *                  l output cap per stream | i stdin bytes | c close stdin | s signal | x run | P ping
 *                  I isolated: run in a throw-away copy of the sandbox (see isolate() in command.c)
 *                  H hold: close the socket while the host checkpoints (see hold() below)
 *                  D set / Q read a deterministic sandbox's clock, streams and file times (det.c)
 *                  N port: open a port of the sandbox's loopback for the host (port.c; F first: pass the socket)
 *   agent -> host  p pid | o stdout | r stderr | z "exit signal timed_out out_trunc err_trunc" | P pong
 * Background processes (B, L, A), which outlive their connection, are described in processes.c.
 * Closing the connection before the command ends kills the command's process tree.
 *
 * This file listens and reads a connection's frames; agent.h says which file does the rest.
 */
#include "agent.h"

char self_exe[256];

static void handle(int conn, int sigfd) {
    struct request rq = {0};
    rq.out_cap = 1LL << 60;
    for (;;) {
        char *data;
        uint32_t len;
        int type = read_frame(conn, &data, &len);
        if (type < 0) return;
        switch (type) {
        case 'P':
            send_frame(conn, 'P', VERSION, sizeof VERSION - 1);
            free(data);
            return;
        case 'H':
            kill(getppid(), SIGUSR1);
            send_frame(conn, 'H', "", 0);
            free(data);
            return;
        case 'F': rq.pass_socket = 1; break;
        case 'N':
            open_port(conn, data, rq.pass_socket);
            free(data);
            return;
        case 'a': push(&rq.argv, &rq.argc, data); continue;
        case 'e': push(&rq.envp, &rq.envc, data); continue;
        case 'd': rq.cwd = data; continue;
        case 'u': rq.user = data; continue;
        case 't': rq.timeout_ms = atoll(data); break;
        case 'l': rq.out_cap = atoll(data); break;
        case 'i': append_stdin(&rq, data, len); break;
        case 'c': rq.stdin_close = 1; break;
        case 'I': rq.isolated = 1; break;
        case 'B': rq.background = data; continue;
        case 'n': rq.tag = data; continue;
        case 'T': rq.pty = sscanf(data, "%d %d", &rq.rows, &rq.cols) == 2; break;
        case 'S': rq.shell = 1; break;
        case 'L':
            list_procs(conn);
            free(data);
            return;
        case 'A':
            attach_proc(conn, data);
            free(data);
            return;
        case 'x':
            free(data);
            if (rq.argc == 0) {
                send_frame(conn, 'r', "rollbox: empty command\n", 23);
                send_frame(conn, 'z', "126 0 0 0 0", 11);
                return;
            }
            if (rq.background) run_background(conn, &rq, sigfd);
            else run_request(conn, &rq, sigfd);
            return;
        }
        free(data);
    }
}

static const char *socket_path; /* --path only */

/* ROLLBOX_DETERMINISTIC's value until the sandbox is made deterministic: after the host's first ping is answered,
 * so that the work (process ids taken, the stream's pipe filled) neither holds up the start nor competes with the
 * runtime's own exit; before any command or D and Q frame in any case. */
static char *det_setting;
static int det_pinged; /* the host has seen the agent answer: the next idle moment is the one */
#define DET_IDLE_MS 100 /* without a ping (the host pings every start), so long after the start */

static void det_ready(void) {
    if (!det_setting) return;
    det_open(det_setting);
    free(det_setting);
    det_setting = NULL;
}

/* A connection waits in the main process until its first frame has come: pings and the D and Q frames are
 * answered there, without forking a handler, so that process ids are taken by commands alone and the same
 * commands take the same ones (docs/determinism.md). */
#define PENDING 64
#define PENDING_MS 10000 /* a connection silent this long goes to a handler all the same */
static struct {
    int fd;
    long long since;
} pending[PENDING];
static int npending;

/* Answers the connection here if its first frame is one of those; returns 1 if it did (or the peer went away), 0 if
 * a handler must take it, -1 if its first frame has not come whole yet. */
static int answer_here(int conn) {
    unsigned char header[5];
    ssize_t got = recv(conn, header, 5, MSG_PEEK | MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return 1;
    if (got < 5) return -1;
    if (header[0] != 'P' && header[0] != 'D' && header[0] != 'Q') return 0;
    struct timeval limit = {1, 0}; /* the main process never waits long on one connection */
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    char *data;
    uint32_t len;
    int type = read_frame(conn, &data, &len);
    if (type < 0) return 1;
    if (type == 'P') {
        send_frame(conn, 'P', VERSION, sizeof VERSION - 1);
        det_pinged = 1;
    } else {
        det_ready();
        det_frame(conn, type, data, len);
    }
    free(data);
    return 1;
}

static int listen_path(const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strcpy(addr.sun_path, path);
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(listener, 512) < 0)
        die("listen");
    return listener;
}

/* gVisor cannot checkpoint a socket bound to a host path. While the host's `<socket>.hold` file exists (in the
 * directory commands are locked out of, so only the host makes it), the agent has no socket and waits; a sandbox
 * restored from the checkpoint has a directory of its own without the file and listens again at once. File calls
 * run as the directory's owner: the agent gave up CAP_CHOWN, and with it the way to take the directory back. */
static int hold(int listener) {
    char marker[sizeof ((struct sockaddr_un *)0)->sun_path + 8];
    snprintf(marker, sizeof marker, "%s.hold", socket_path);
    if (seteuid(LOCKOUT_ID) < 0) return listener;
    struct stat held;
    if (stat(marker, &held) == 0) {
        let_go_of_clients();
        close(listener);
        unlink(socket_path);
        while (stat(marker, &held) == 0) usleep(1000);
        unlink(socket_path);
        listener = listen_path(socket_path);
        set_nonblock(listener);
    }
    if (seteuid(0) < 0) die("seteuid");
    return listener;
}

/* Forks the handler that takes the connection. */
static void serve(int conn, int listener, int sigfd, sigset_t *chld) {
    det_ready();
    pid_t handler = fork();
    if (handler == 0) {
        /* A signalfd reports the signals of the process that created it (under gVisor
         * too), so each handler makes its own to hear about its command's exit. */
        close(listener);
        close(sigfd);
        close(registry[0]);
        if (det_fifo >= 0) close(det_fifo);
        for (int i = 0; i < npending; i++) close(pending[i].fd);
        int own = signalfd(-1, chld, SFD_CLOEXEC | SFD_NONBLOCK);
        if (own < 0) die("signalfd");
        handle(conn, own);
        _exit(0);
    }
    if (handler < 0) {
        const char *msg = "rollbox-agent: fork failed (process limit reached?)\n";
        send_frame(conn, 'r', msg, (uint32_t)strlen(msg));
        send_frame(conn, 'z', "126 0 0 0 0", 11);
    }
    close(conn);
}

int main(int argc, char **argv) {
    int listener = -1;
    /* From the environment rather than the command line, which every command's `ps` shows: a sandbox claimed
     * warm (seeded later by a D frame) and one started with its seed must look alike. */
    det_setting = getenv("ROLLBOX_DETERMINISTIC");
    if (det_setting) det_setting = strdup(det_setting);
    unsetenv("ROLLBOX_DETERMINISTIC");
    if (argc == 3 && strcmp(argv[1], "--fd") == 0) {
        listener = atoi(argv[2]);
    } else if (argc == 3 && strcmp(argv[1], "--path") == 0) {
        struct sockaddr_un addr;
        if (strlen(argv[2]) + 5 >= sizeof addr.sun_path) { /* room for ".hold" */
            errno = ENAMETOOLONG;
            die("socket path");
        }
        socket_path = argv[2];
        char dir[sizeof addr.sun_path];
        strcpy(dir, argv[2]);
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) {
            errno = EINVAL;
            die("socket path must be in a directory of its own");
        }
        *slash = 0;
        /* A restarted sandbox finds the directory locked by its previous agent: take it back. */
        if (chown(dir, 0, 0) < 0 || chmod(dir, 0700) < 0) die("socket directory");
        unlink(argv[2]);
        listener = listen_path(argv[2]);
        /* The directory is the host's, bound in writable so the socket can be made: lock every command
         * out of it (root too, which keeps no capabilities), or one could replace the socket with its
         * own and answer the host's commands, or fill the host's disk through it. */
        if (chown(dir, LOCKOUT_ID, LOCKOUT_ID) < 0) die("lock the socket directory");
    } else {
        dprintf(2, "usage: [ROLLBOX_DETERMINISTIC=SEED,NOW,BOOT,BORN,CPUS,MEMORY,RELEASE] %s --fd N | --path SOCKET\n",
                argv[0]);
        return 2;
    }
    drop_capability(CAP_CHOWN);
    /* Standard output and error are the host's log file, kept for the startup errors above. gVisor
     * lets a command running as root open them through /proc/1/fd (it checks no capabilities
     * there), which would let it fill the host's disk: from here on they lead nowhere. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) die("/dev/null");
    if (null > 2) close(null);
    ssize_t length = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    self_exe[length > 0 ? length : 0] = 0;
    fcntl(listener, F_SETFD, FD_CLOEXEC);
    set_nonblock(listener);
    for (int fd = 3; fd < 1024; fd++)
        if (fd != listener) close(fd);
    signal(SIGPIPE, SIG_IGN);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigaddset(&chld, SIGUSR1); /* hold() */
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0) die("signalfd");
    registry_open();

    for (;;) {
        struct pollfd fds[4 + PENDING] = {{listener, POLLIN, 0}, {sigfd, POLLIN, 0}, {registry[0], POLLIN, 0},
                                          {det_fifo, POLLOUT, 0}};
        for (int i = 0; i < npending; i++) fds[4 + i] = (struct pollfd){pending[i].fd, POLLIN, 0};
        int polled = poll(fds, (nfds_t)(4 + npending), det_setting ? (det_pinged ? 0 : DET_IDLE_MS)
                          : npending ? 1000 : -1);
        if (polled == 0) det_ready(); /* idle after the host's ping (or long after the start, without one) */
        if (polled < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        if (fds[1].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) > 0)
                if (info.ssi_signo == SIGUSR1 && socket_path) listener = hold(listener);
            pid_t reaped;
            while ((reaped = waitpid(-1, NULL, WNOHANG)) > 0) proc_reaped(reaped);
        }
        if (fds[3].revents & POLLOUT) det_refill();
        registry_drain();
        int conn;
        for (int i = npending - 1; i >= 0; i--) { /* backwards: a connection dealt with takes the last one's place */
            if (!fds[4 + i].revents && now_ms() - pending[i].since < PENDING_MS) continue;
            int answered = answer_here(pending[i].fd);
            if (answered < 0 && now_ms() - pending[i].since < PENDING_MS) continue;
            conn = pending[i].fd;
            pending[i] = pending[--npending];
            if (answered > 0) close(conn);
            else serve(conn, listener, sigfd, &chld);
        }
        if (!(fds[0].revents & POLLIN)) continue;
        while (registry_drain(), (conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
            if (npending < PENDING) pending[npending++] = (typeof(pending[0])){conn, now_ms()};
            else serve(conn, listener, sigfd, &chld);
        }
    }
}

