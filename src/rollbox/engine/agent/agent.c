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
 *                  I isolated: run in a throw-away copy of the sandbox (see isolate() below)
 *                  H hold: close the socket while the host checkpoints (see hold() below)
 *   agent -> host  p pid | o stdout | r stderr | z "exit signal timed_out out_trunc err_trunc" | P pong
 * Background processes (B, L, A), which outlive their connection, are described in processes.c.
 * Closing the connection before the command ends kills the command's process tree.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME (64u << 20)
#define MAX_ITEMS 65536
#define CHUNK 65536
#define VERSION "rollbox-agent 1"
#define LOCKOUT_ID 2147483646u /* owns the socket directory (--path); no command runs as it */
#define ISOLATION_IDS "0 0 65536\n" /* ids an isolated command's user namespace maps, unchanged */
#define SANDBOX_ROOT "/.rollbox/root" /* the host binds the sandbox's root here, read-only, no submounts */
#define SCRATCH "/.rollbox"

extern char **environ;
static char self_exe[256];

struct request {
    char **argv, **envp;
    size_t argc, envc;
    char *cwd;
    char *user;
    long long timeout_ms;
    long long out_cap;
    char *stdin_buf;
    size_t stdin_len, stdin_off;
    int stdin_close;
    int isolated;
    char *background, *tag; /* processes.c */
    int pty, rows, cols, shell;
};

static void die(const char *what) {
    dprintf(2, "rollbox-agent: %s: %s\n", what, strerror(errno));
    _exit(111);
}

static int write_all(int fd, const void *buf, size_t len) {
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

static int send_frame(int fd, char type, const void *data, uint32_t len) {
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
static int read_frame(int fd, char **data, uint32_t *len) {
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

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void push(char ***list, size_t *count, char *item) {
    if (*count + 2 > MAX_ITEMS) return;
    *list = realloc(*list, (*count + 2) * sizeof(char *));
    (*list)[(*count)++] = item;
    (*list)[*count] = NULL;
}

static void append_stdin(struct request *rq, const char *data, uint32_t len) {
    rq->stdin_buf = realloc(rq->stdin_buf, rq->stdin_len + len);
    memcpy(rq->stdin_buf + rq->stdin_len, data, len);
    rq->stdin_len += len;
}

/* The sandbox's seccomp profile lets the agent make namespaces and mounts, for isolated commands
 * (engine/seccomp.py); no command may: user namespaces and mounts are the kernel's most attacked
 * surface. This filter stacks on the sandbox's, which still denies everything else it lists. */
#define DENY_IF(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)
#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#else
#error "rollbox-agent: name this architecture's AUDIT_ARCH for the command seccomp filter"
#endif
static int deny_namespaces(void) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 0, 11),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~0x40000000u), /* x32 calls carry this bit */
        DENY_IF(__NR_unshare),
        DENY_IF(__NR_mount),
        DENY_IF(__NR_umount2),
        DENY_IF(__NR_pivot_root),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
#if defined(__x86_64__)
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, 11),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        DENY_IF(310), /* unshare */
        DENY_IF(21),  /* mount */
        DENY_IF(22),  /* umount */
        DENY_IF(52),  /* umount2 */
        DENY_IF(217), /* pivot_root */
#endif
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0);
}

/* Binds every mount directly under the sandbox's root (proc, dev, sys and the template's binds,
 * each with what is mounted below it) at the same place under `root`, except the agent's own. */
static int bind_submounts(const char *root) {
    FILE *info = fopen("/proc/self/mountinfo", "re");
    if (!info) return -1;
    char line[4096], point[PATH_MAX], target[PATH_MAX + 64];
    int id, parent, root_id = -1, ok = 0;
    while (fgets(line, sizeof line, info))
        if (sscanf(line, "%d %d %*s %*s %4095s", &id, &parent, point) == 3 && strcmp(point, "/") == 0) root_id = id;
    rewind(info);
    while (root_id >= 0 && fgets(line, sizeof line, info)) {
        if (sscanf(line, "%d %d %*s %*s %4095s", &id, &parent, point) != 3 || parent != root_id) continue;
        if (strcmp(point, "/") == 0 || strncmp(point, SCRATCH, sizeof SCRATCH - 1) == 0) continue;
        snprintf(target, sizeof target, "%s%s", root, point);
        if (mount(point, target, NULL, MS_BIND | MS_REC, NULL) < 0) ok = -1;
    }
    fclose(info);
    return root_id < 0 ? -1 : ok;
}

/* Isolated commands run in a throw-away copy of the sandbox: new user, mount, pid, ipc, uts and
 * network namespaces (loopback only); a root filesystem that overlays the sandbox's root (which
 * the host binds at SANDBOX_ROOT) with a fresh tmpfs, so whatever the command writes is gone when
 * it ends and other commands never see it; fresh /dev/shm and /dev/mqueue. The user namespace
 * maps ids unchanged, so files keep their owners. The agent writes the id maps (map_isolated):
 * that takes CAP_SETUID and CAP_SETGID in the sandbox, which commands never have. Its owner is
 * root, as the agent must be to write them: a command run as root WITHOUT isolation in the same
 * sandbox could trace isolated ones; isolated commands reach neither each other nor the sandbox.
 * Returns the failed stage, or NULL. */
static const char *isolate(int ready, int go) {
    char byte = 0;
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET) < 0)
        return "isolation: namespaces";
    if (write(ready, &byte, 1) != 1 || read(go, &byte, 1) != 1 || byte != 1) {
        errno = EPERM;
        return "isolation: id maps";
    }
    if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) return "isolation: ids";
    int lower = open(SANDBOX_ROOT, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (lower < 0) return "isolation: the sandbox root (isolated commands need the runc runtime)";
    char options[256];
    snprintf(options, sizeof options, "lowerdir=/proc/self/fd/%d,upperdir=" SCRATCH "/upper,workdir=" SCRATCH
             "/work,userxattr", lower);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return "isolation: private mounts";
    if (mount("tmpfs", SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") < 0 ||
        mkdir(SCRATCH "/upper", 0755) < 0 || mkdir(SCRATCH "/work", 0700) < 0 || mkdir(SCRATCH "/new", 0755) < 0)
        return "isolation: scratch";
    if (mount("overlay", SCRATCH "/new", "overlay", MS_NOSUID | MS_NODEV, options) < 0) return "isolation: overlay";
    close(lower);
    if (bind_submounts(SCRATCH "/new") < 0) return "isolation: submounts";
    if (mount("shm", SCRATCH "/new/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=65536k") < 0 ||
        mount("mqueue", SCRATCH "/new/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return "isolation: /dev/shm and /dev/mqueue";
    if (chdir(SCRATCH "/new") < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
        chdir("/") < 0)
        return "isolation: pivot_root";
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq loopback = {0};
    strcpy(loopback.ifr_name, "lo");
    loopback.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
    if (sock < 0 || ioctl(sock, SIOCSIFFLAGS, &loopback) < 0) return "isolation: loopback";
    close(sock);
    return NULL;
}

/* The first child in the new pid namespace is its init: it holds the namespaces until the agent has
 * sent the result (the last process to leave a mount namespace waits out an RCU grace period tearing
 * it down, which the caller need not), reaps orphans, and takes every process left in the namespace
 * with it when it ends. The second is the command. We stay outside, as the agent's child, and end as
 * the command ends (signals reach the command through the process group; we ignore them). Returns 0
 * in the command's process, -1 if a fork failed. */
static int enter_isolation(int go) {
    pid_t init = fork();
    if (init < 0) return -1;
    if (init == 0) {
        signal(SIGCHLD, SIG_IGN);
        for (int fd = 0; fd < 1024; fd++)
            if (fd != go) close(fd);
        char byte;
        while (read(go, &byte, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    pid_t command = fork();
    if (command < 0) return -1;
    if (command == 0) return 0;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD) signal(sig, SIG_IGN);
    for (int fd = 0; fd < 1024; fd++) close(fd); /* the command's pipes end with the command */
    int status;
    while (waitpid(command, &status, 0) < 0)
        if (errno != EINTR) _exit(126);
    if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL);
        kill(getpid(), WTERMSIG(status));
        _exit(128 + WTERMSIG(status));
    }
    _exit(WEXITSTATUS(status));
}

/* The agent's side of isolate(): writes the id maps of the child's new user namespace. The child
 * waits for them, then for `go` to close before its namespaces go (enter_isolation). */
static void map_isolated(pid_t child, int ready, int go) {
    char byte;
    if (read(ready, &byte, 1) != 1) return; /* the child failed first: its report says why */
    const char *maps[] = {"uid_map", "gid_map"};
    byte = 1;
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/%s", child, maps[i]);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, ISOLATION_IDS, sizeof ISOLATION_IDS - 1) != sizeof ISOLATION_IDS - 1) byte = 0;
        if (fd >= 0) close(fd);
    }
    write_all(go, &byte, 1);
}

/* The command's side of the fork: become the requested user with no capabilities, then exec. */
static void exec_command(struct request *rq, int in, int out, int err, int report, int ready, int go) {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    if (rq->pty) ioctl(0, TIOCSCTTY, 0);
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj >= 0) {
        write_all(adj, "1000", 4);
        close(adj);
    }
    const char *stage = NULL;
    if (rq->isolated) {
        stage = isolate(ready, go);
        if (stage) goto fail;
        if (enter_isolation(go) < 0) goto fail;
    }
    stage = "cwd";
    if (rq->cwd && chdir(rq->cwd) < 0) goto fail;
    /* Empty the bounding set while CAP_SETPCAP is still effective (setresuid clears it). */
    for (int cap = 0; cap <= 63; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    stage = "user";
    if (rq->user) {
        unsigned uid, gid;
        int used = 0;
        if (sscanf(rq->user, "%u %u%n", &uid, &gid, &used) < 2) {
            errno = EINVAL;
            goto fail;
        }
        gid_t groups[64];
        int ngroups = 0;
        char *rest = rq->user + used;
        unsigned g;
        int n;
        while (ngroups < 64 && sscanf(rest, " %u%n", &g, &n) == 1) {
            groups[ngroups++] = g;
            rest += n;
        }
        if (setgroups((size_t)ngroups, groups) < 0) goto fail;
        if (setresgid(gid, gid, gid) < 0) goto fail;
        if (setresuid(uid, uid, uid) < 0) goto fail;
    }
    stage = "capabilities";
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &hdr, data) < 0) goto fail;
    stage = "seccomp";
    if (deny_namespaces() < 0) goto fail;
    stage = "exec";
    environ = rq->envp ? rq->envp : (char *[]){NULL};
    execvp(rq->argv[0], rq->argv);
fail:;
    int code = errno;
    int status = (code == ENOENT && strcmp(stage, "exec") == 0) ? 127 : 126;
    const char *subject = strcmp(stage, "exec") == 0 ? rq->argv[0] : strcmp(stage, "cwd") == 0 ? rq->cwd : stage;
    char msg[1024];
    int len = snprintf(msg, sizeof msg, "%03drollbox: %s: %s\n", status, subject, strerror(code));
    write_all(report, msg, (size_t)(len < (int)sizeof msg ? len : (int)sizeof msg - 1));
    _exit(status);
}

/* Removes one capability from this process for good (needs CAP_SETPCAP for the bounding set). */
static void drop_capability(int cap) {
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    if (syscall(SYS_capget, &hdr, data) < 0) die("capget");
    unsigned mask = ~(1u << (cap % 32));
    data[cap / 32].effective &= mask;
    data[cap / 32].permitted &= mask;
    data[cap / 32].inheritable &= mask;
    if (syscall(SYS_capset, &hdr, data) < 0) die("capset");
}

/* Reads a process's parent and start time (clock ticks since boot) from /proc. */
static int read_stat(pid_t pid, int *ppid, unsigned long long *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *close_paren = strrchr(buf, ')');
    if (!close_paren) return -1;
    /* Fields after the command name: state(3) ppid(4) ... starttime(22). */
    return sscanf(close_paren + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  ppid, start) == 2 ? 0 : -1;
}

static int is_descendant(pid_t pid, pid_t root) {
    unsigned long long start;
    for (int depth = 0; depth < 4096 && pid > 1; depth++) {
        int ppid;
        if (read_stat(pid, &ppid, &start) < 0) return 0;
        if (ppid == root) return 1;
        pid = ppid;
    }
    return 0;
}

/* The agent's own processes (its handlers, background processes' supervisors) share its session, which no
 * command can join (each starts a session of its own); gVisor does not always show their exe as ours. */
static int is_agent(pid_t pid) {
    if (getsid(pid) == getsid(0)) return 1;
    char path[64], exe[256];
    snprintf(path, sizeof path, "/proc/%d/exe", pid);
    ssize_t n = readlink(path, exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    return strcmp(exe, self_exe) == 0;
}

/* Where child subreapers are missing (gVisor), a process that escaped with setsid() or a double
 * fork is reparented to the agent and no longer descends from us: count such orphans as ours when
 * they started after this command did. */
static int is_late_orphan(pid_t pid, unsigned long long since) {
    int ppid;
    unsigned long long start;
    return read_stat(pid, &ppid, &start) == 0 && ppid == 1 && start >= since && !is_agent(pid);
}

/* Kills the command's process group and every process that descends from this handler. We are a
 * child subreaper, so even processes that called setsid() or double-forked still descend from us. */
static void kill_tree(pid_t pgid, int subreaper, unsigned long long since) {
    pid_t self = getpid();
    kill(-pgid, SIGKILL);
    for (int round = 0; round < 200; round++) {
        int found = 0;
        DIR *proc = opendir("/proc");
        if (!proc) return;
        struct dirent *entry;
        while ((entry = readdir(proc))) {
            pid_t pid = (pid_t)atoi(entry->d_name);
            if (pid > 1 && pid != self && (is_descendant(pid, self) || (!subreaper && is_late_orphan(pid, since)))) {
                kill(pid, SIGKILL);
                found = 1;
            }
        }
        closedir(proc);
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (!found) return;
        usleep(1000);
    }
}

struct stream {
    int fd;
    char type;
    long long sent;
    int truncated;
};

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

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void run_request(int conn, struct request *rq, int sigfd) {
    int in[2], out[2], err[2], report[2], ready[2] = {-1, -1}, go[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
        pipe2(report, O_CLOEXEC) || (rq->isolated && (pipe2(ready, O_CLOEXEC) || pipe2(go, O_CLOEXEC))))
        die("pipe");
    int subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0;
    int unused;
    unsigned long long since = 0;
    read_stat(getpid(), &unused, &since);
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

#include "processes.c"

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

int main(int argc, char **argv) {
    int listener = -1;
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
        dprintf(2, "usage: %s --fd N | --path SOCKET\n", argv[0]);
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
        struct pollfd fds[3] = {{listener, POLLIN, 0}, {sigfd, POLLIN, 0}, {registry[0], POLLIN, 0}};
        if (poll(fds, 3, -1) < 0) {
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
        registry_drain();
        if (!(fds[0].revents & POLLIN)) continue;
        int conn;
        while (registry_drain(), (conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
            pid_t handler = fork();
            if (handler == 0) {
                /* A signalfd reports the signals of the process that created it (under gVisor
                 * too), so each handler makes its own to hear about its command's exit. */
                close(listener);
                close(sigfd);
                close(registry[0]);
                int own = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
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
    }
}
