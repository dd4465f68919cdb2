/* The agent's side of a deterministic sandbox (docs/determinism.md): the page that commands' preloaded library reads
 * (det.h), /dev/urandom and /dev/random as one pipe the agent keeps full of the seed's stream, the host's D (set)
 * and Q (read) frames, and each command's start on the virtual clock. */
#include "agent.h"

#include <sys/mman.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>

struct det_page *det;
int det_fifo = -1;
static uint64_t fifo_key, fifo_pos; /* fifo_pos: bytes of the stream written into the pipe */

static int64_t real_ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (int64_t)t.tv_sec * DET_SECOND + t.tv_nsec;
}

/* Writes as much of the stream as the pipe takes. */
void det_refill(void) {
    unsigned char buf[16384];
    for (;;) {
        det_stream(fifo_key, fifo_pos, buf, sizeof buf);
        ssize_t n = write(det_fifo, buf, sizeof buf);
        if (n <= 0) return;
        fifo_pos += (uint64_t)n;
        if ((size_t)n < sizeof buf) return;
    }
}

/* Bytes of the stream that readers took: written, less what still waits in the pipe. */
static uint64_t fifo_taken(void) {
    int waiting = 0;
    ioctl(det_fifo, FIONREAD, &waiting);
    return fifo_pos - (uint64_t)waiting;
}

/* Empties the pipe (the agent's end reads too) and fills it again from `pos` of the seed's stream. */
static void restream(uint64_t seed, uint64_t pos) {
    char buf[16384];
    while (read(det_fifo, buf, sizeof buf) > 0) {
    }
    fifo_key = det_key(seed, DET_FIFO_STREAM);
    fifo_pos = pos;
    det_refill();
}

/* From this real time on, files read as stamped at `virt`. Two anchors in one tick of the filesystems' clock are
 * one: the later command's (det_command_start makes sure the earlier changed no file in it). */
static void anchor(int64_t real, int64_t virt) {
    uint32_t n = atomic_load(&det->anchors);
    if (n > 0 && det->anchor[n - 1].real >= real) {
        det->anchor[n - 1].virt = virt;
        return;
    }
    if (n >= DET_ANCHORS) return; /* past it, files keep the last anchor's time (docs/determinism.md) */
    det->anchor[n] = (struct det_anchor){real, virt};
    atomic_store_explicit(&det->anchors, n + 1, memory_order_release);
}

/* Sets the clock, the streams and the file times from `s` (and its `anchors`, which continue another sandbox's
 * timeline: a fork's); without anchors, the episode starts when the container was made (its start, which the host
 * tells) or now (a D frame's): files stamped from then on show the seed's start until the first command. */
static void apply(const struct det_state *s, const struct det_anchor *anchors) {
    if (det->magic == DET_MAGIC && (s->seed != det->seed || !s->anchors)) /* a new page is zero already */
        for (int i = 0; i < DET_PIDS; i++) atomic_store_explicit(&det->random_pos[i], 0, memory_order_relaxed);
    det->seed = s->seed;
    det->boot = s->boot;
    if (s->born) det->born = s->born;
    atomic_store(&det->now, s->now);
    uint32_t n = s->anchors < DET_ANCHORS ? s->anchors : DET_ANCHORS;
    if (n) memcpy(det->anchor, anchors, n * sizeof *anchors);
    atomic_store(&det->anchors, n);
    if (!n) anchor(s->born ? s->born : real_ns(CLOCK_REALTIME_COARSE), s->now);
    atomic_store(&det->dirty, 0);
    atomic_store(&det->last_end, 0);
    restream(s->seed, s->fifo_pos);
}

/* Numbers the filesystems of the mount table in its order (det_device). */
static void number_devices(void) {
    FILE *info = fopen("/proc/self/mountinfo", "re");
    if (!info) return;
    char line[4096];
    unsigned major, minor;
    while (det->devices < DET_DEVICES && fgets(line, sizeof line, info))
        if (sscanf(line, "%*d %*d %u:%u", &major, &minor) == 2) {
            uint64_t real = makedev(major, minor);
            uint32_t i, n = atomic_load(&det->devices);
            for (i = 0; i < n && det->device[i].real != real; i++) {
            }
            if (i == n) {
                det->device[n].real = real;
                atomic_store(&det->device[n].virt, makedev(0, 64 + n));
                atomic_store(&det->devices, n + 1);
            }
        }
    fclose(info);
}

/* Takes process ids until the next is DET_FIRST_PID: runc's init is a Go program, whose threads take a number of
 * ids in the sandbox that varies from one start to the next. Where the runtime took none (gVisor, whose forks are
 * dear), the first child's id tells it, and the ids are the same every time already. vfork, because the children
 * only exit: a fork would copy the agent's page tables for each id taken. */
static void skip_pids(void) {
    for (;;) {
        pid_t child = vfork();
        if (child == 0) _exit(0);
        if (child < 0) return;
        waitpid(child, NULL, 0);
        if (child == 2 || child >= DET_FIRST_PID - 1) return;
    }
}

/* ROLLBOX_DETERMINISTIC=SEED,NOW,BOOT,BORN,CPUS,MEMORY,RELEASE (engine/determinism.py's agent_setting) */
void det_open(const char *arg) {
    struct det_state s = {0};
    unsigned cpus;
    unsigned long long memory;
    int used = 0;
    if (sscanf(arg, "%" SCNu64 ",%" SCNd64 ",%" SCNd64 ",%" SCNd64 ",%u,%llu,%n", &s.seed, &s.now, &s.boot, &s.born,
               &cpus, &memory, &used) < 6 || !used) {
        errno = EINVAL;
        die("ROLLBOX_DETERMINISTIC");
    }
    int fd = open(DET_PAGE_PATH, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 || fchmod(fd, 0666) < 0 || ftruncate(fd, sizeof *det) < 0) die("the determinism page");
    det = mmap(NULL, sizeof *det, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (det == MAP_FAILED) die("mmap");
    close(fd);
    /* One pipe under both names: readers take the stream's bytes in turn, as they come. */
    unlink("/dev/urandom");
    unlink("/dev/random");
    if (mkfifo("/dev/urandom", 0666) < 0 || chmod("/dev/urandom", 0666) < 0 || link("/dev/urandom", "/dev/random") < 0)
        die("/dev/urandom");
    det_fifo = open("/dev/urandom", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (det_fifo < 0) die("/dev/urandom");
    fcntl(det_fifo, F_SETPIPE_SZ, DET_FIFO_SIZE);
    struct utsname host;
    uname(&host);
    det->cpus = cpus;
    det->memory = memory;
    snprintf(det->release, sizeof det->release, "%s", arg + used);
    snprintf(det->version, sizeof det->version, "#1 SMP PREEMPT_DYNAMIC Mon Jan  1 00:00:00 UTC 2024");
    snprintf(det->machine, sizeof det->machine, "%s", host.machine);
    number_devices();
    skip_pids();
    apply(&s, NULL);
    det->magic = DET_MAGIC;
}

/* D: a det_state and its anchors; Q: answers with them. */
void det_frame(int conn, int type, const char *data, uint32_t len) {
    if (!det) {
        send_error(conn, "this sandbox is not deterministic");
        return;
    }
    if (type == 'D') {
        const struct det_state *s = (const void *)data;
        if (len < sizeof *s || len != sizeof *s + (uint64_t)s->anchors * sizeof(struct det_anchor)) {
            send_error(conn, "malformed determinism state");
            return;
        }
        struct det_state copy;
        memcpy(&copy, s, sizeof copy);
        apply(&copy, (const void *)(data + sizeof *s));
        send_frame(conn, 'D', "", 0);
        return;
    }
    uint32_t n = atomic_load(&det->anchors);
    struct det_state s = {det->seed, atomic_load(&det->now), det->boot, det->born, fifo_taken(), n, 0};
    size_t size = sizeof s + n * sizeof(struct det_anchor);
    char *out = malloc(size);
    if (!out) {
        send_error(conn, "out of memory");
        return;
    }
    memcpy(out, &s, sizeof s);
    memcpy(out + sizeof s, det->anchor, n * sizeof(struct det_anchor));
    send_frame(conn, 'Q', out, (uint32_t)size);
    free(out);
}

/* Before a command starts: once the filesystems' clock has left the tick in which the last command ended (only if
 * something may have changed files since: waiting costs up to a tick), the clock moves to the next whole second
 * and files stamped from now on read as stamped then. */
void det_command_start(void) {
    if (!det) return;
    if (atomic_exchange(&det->dirty, 0)) {
        int64_t end = atomic_load(&det->last_end);
        while (real_ns(CLOCK_REALTIME_COARSE) <= end) {
            struct timespec pause = {0, 200000};
            nanosleep(&pause, NULL);
        }
    }
    int64_t now = atomic_load(&det->now), start;
    do start = (now / DET_SECOND + 1) * DET_SECOND;
    while (!atomic_compare_exchange_weak(&det->now, &now, start));
    anchor(real_ns(CLOCK_REALTIME_COARSE), start);
}

void det_command_end(void) {
    if (det) atomic_store(&det->last_end, real_ns(CLOCK_REALTIME));
}

/* In the command's process before exec: the preloaded library first (in compat.so's place: it does its work too),
 * addresses as in the last run (where the runtime lets a process ask), and getrandom(2) answered ENOSYS, so that
 * what bypasses the library's getrandom (static binaries, the C library's own calls) falls back to /dev/urandom. */
void det_exec(struct request *rq) {
    if (!det) return;
    int current = personality(0xffffffff);
    if (current != -1) personality((unsigned long)current | ADDR_NO_RANDOMIZE);
    char *preload = NULL;
    size_t i;
    for (i = 0; i < rq->envc; i++)
        if (strncmp(rq->envp[i], "LD_PRELOAD=", 11) == 0) break;
    const char *rest = i < rq->envc ? rq->envp[i] + 11 : "";
    if (strcmp(rest, COMPAT_LIBRARY) == 0) rest = "";
    if (asprintf(&preload, "LD_PRELOAD=" DET_LIBRARY "%s%s", *rest ? ":" : "", rest) < 0) return;
    if (i < rq->envc) rq->envp[i] = preload;
    else push(&rq->envp, &rq->envc, preload);
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~0x40000000u),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_getrandom, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0);
}
