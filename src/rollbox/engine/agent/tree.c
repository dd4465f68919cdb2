/* A command's process tree, read from /proc: who descends from whom, and killing or signalling it whole. */
#include "agent.h"

/* Reads a process's parent and start time (clock ticks since boot) from /proc. */
int read_stat(pid_t pid, int *ppid, unsigned long long *start) {
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

int is_descendant(pid_t pid, pid_t root) {
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
void kill_tree(pid_t pgid, int subreaper, unsigned long long since) {
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

void signal_descendants(pid_t root, int sig) {
    DIR *proc = opendir("/proc");
    if (!proc) return;
    struct dirent *entry;
    while ((entry = readdir(proc))) {
        pid_t pid = (pid_t)atoi(entry->d_name);
        if (pid > 1 && pid != root && is_descendant(pid, root)) kill(pid, sig);
    }
    closedir(proc);
}
