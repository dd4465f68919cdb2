/* Becoming the command, in the child the agent forked for it: in a throw-away copy of the sandbox if asked
 * (isolate), as the requested user, with no capabilities and namespaces and mounts denied, then exec. */
#include "agent.h"

/* The sandbox's seccomp profile lets the agent make namespaces and mounts, for isolated commands
 * (engine/seccomp.py); no command may: user namespaces and mounts are the kernel's most attacked
 * surface. This filter stacks on the sandbox's, which still denies everything else it lists. */
#define DENY_IF(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)
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
void map_isolated(pid_t child, int ready, int go) {
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
void exec_command(struct request *rq, int in, int out, int err, int report, int ready, int go) {
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
    det_exec(rq);
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
void drop_capability(int cap) {
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
