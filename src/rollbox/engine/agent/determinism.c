/*
 * Preloaded into every command of a deterministic sandbox (docs/determinism.md). It covers the C library's calls
 * of dynamically linked programs; the agent covers the rest it can (det.c), and the docs list what neither does.
 *
 *   clocks   every reading of a wall, monotonic or boot clock advances the shared virtual clock by DET_TICK;
 *            a wait that times out (sleep, poll, select, epoll, timed locks and condition variables) advances
 *            it by the time waited for, after waiting that long for real; deadlines given on the virtual
 *            clocks are turned into real ones.
 *   entropy  getrandom, getentropy and arc4random read the seed's stream.
 *   files    every time stat and statx report is the virtual time of the command that stamped it (the agent's
 *            anchors); what is older than the sandbox (the template's files, the host's) keeps its time, which
 *            programs that check caches by it need (Python's .pyc files), and is the same in every episode of the
 *            template; what the sandbox's start stamped shows its boot instant; a call that may change
 *            files marks the page dirty, so the agent keeps the next command's files apart.
 *   machine  uname, sysconf, get_nprocs and sched_getaffinity tell the template's machine.
 *   stack    where the runtime places the stack at random (gVisor), main runs on one at a fixed address
 *            (fixed_stack.c), so that a stack address mixed into a seed (gnulib's temporary names) is the same.
 * It drops AT_NO_AUTOMOUNT from stat calls as compat.c does (a sandbox has no automount points), so that under gVisor
 * it is preloaded instead of compat.so, not beside it: each library loaded costs every command.
 * Without the page (a sandbox that is not deterministic, or a command that removed it), every call is the real one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/sysinfo.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "det.h"

static struct det_page *page_;
static int tried_;

static struct det_page *page(void) {
    if (__builtin_expect(tried_, 1)) return page_;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, DET_PAGE_PATH, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
        void *map = mmap(NULL, sizeof(struct det_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (map != MAP_FAILED && ((struct det_page *)map)->magic == DET_MAGIC) page_ = map;
    }
    tried_ = 1;
    return page_;
}

#define REAL(type, name, ...)                                                                                   \
    static type (*real)(__VA_ARGS__);                                                                          \
    if (!real) real = (type(*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

/* -- the program's start -------------------------------------------------------------------------------- */

int __libc_start_main(det_main main, int argc, char **argv, void (*init)(void), void (*fini)(void),
                      void (*rtld_fini)(void), void *stack_end) {
    REAL(int, "__libc_start_main", det_main, int, char **, void (*)(void), void (*)(void), void (*)(void), void *);
    int saved = errno;
    if (page()) main = det_fixed_stack(main);
    errno = saved;
    return real(main, argc, argv, init, fini, rtld_fini, stack_end);
}

/* -- clocks --------------------------------------------------------------------------------------------- */

static int family(clockid_t id) { /* 1: wall, 2: monotonic or boot, 0: another (CPU time) */
    switch (id) {
    case CLOCK_REALTIME: case CLOCK_REALTIME_COARSE: case CLOCK_REALTIME_ALARM: case CLOCK_TAI: return 1;
    case CLOCK_MONOTONIC: case CLOCK_MONOTONIC_RAW: case CLOCK_MONOTONIC_COARSE: case CLOCK_BOOTTIME:
    case CLOCK_BOOTTIME_ALARM: return 2;
    default: return 0;
    }
}

static int64_t ns_of(const struct timespec *t) { return (int64_t)t->tv_sec * DET_SECOND + t->tv_nsec; }

static struct timespec ts_of(int64_t ns) {
    if (ns < 0) ns = 0;
    return (struct timespec){.tv_sec = ns / DET_SECOND, .tv_nsec = ns % DET_SECOND};
}

static int64_t reading(struct det_page *p, int kind) {
    int64_t now = atomic_fetch_add(&p->now, DET_TICK) + DET_TICK;
    return kind == 2 ? now - p->boot : now;
}

static void advance(struct det_page *p, int64_t ns) {
    if (ns > 0) atomic_fetch_add(&p->now, ns);
}

/* Moves the clock to `deadline` (in the family's terms) unless it is past it already. */
static void reach(struct det_page *p, int kind, int64_t deadline) {
    int64_t target = kind == 2 ? deadline + p->boot : deadline;
    int64_t now = atomic_load(&p->now);
    while (now < target && !atomic_compare_exchange_weak(&p->now, &now, target)) {
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    REAL(int, "clock_gettime", clockid_t, struct timespec *);
    struct det_page *p = page();
    int kind = family(id);
    if (!p || !kind) return real(id, ts);
    *ts = ts_of(reading(p, kind));
    return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
    REAL(int, "gettimeofday", struct timeval *, void *);
    struct det_page *p = page();
    if (!p) return real(tv, tz);
    if (tz) memset(tz, 0, sizeof(struct timezone));
    int64_t now = reading(p, 1);
    tv->tv_sec = now / DET_SECOND;
    tv->tv_usec = now % DET_SECOND / 1000;
    return 0;
}

time_t time(time_t *out) {
    REAL(time_t, "time", time_t *);
    struct det_page *p = page();
    if (!p) return real(out);
    time_t now = (time_t)(reading(p, 1) / DET_SECOND);
    if (out) *out = now;
    return now;
}

int timespec_get(struct timespec *ts, int base) {
    REAL(int, "timespec_get", struct timespec *, int);
    struct det_page *p = page();
    if (!p || base != TIME_UTC) return real(ts, base);
    *ts = ts_of(reading(p, 1));
    return base;
}

/* The real deadline on the family's real clock that is as far away as the virtual `deadline`. */
static struct timespec real_deadline(struct det_page *p, int kind, const struct timespec *deadline) {
    struct timespec now;
    REAL(int, "clock_gettime", clockid_t, struct timespec *);
    real(kind == 2 ? CLOCK_MONOTONIC : CLOCK_REALTIME, &now);
    int64_t virt_now = atomic_load(&p->now) - (kind == 2 ? p->boot : 0);
    return ts_of(ns_of(&now) + (ns_of(deadline) - virt_now));
}

/* A deadline of a call that names no clock: the wall clock's when it is past 1973, the monotonic one's before. */
static int guess(const struct timespec *deadline) { return deadline->tv_sec > 100000000 ? 1 : 2; }

int nanosleep(const struct timespec *req, struct timespec *rem) {
    REAL(int, "nanosleep", const struct timespec *, struct timespec *);
    struct det_page *p = page();
    struct timespec left = {0, 0};
    int result = real(req, rem ? rem : &left);
    if (p && req) advance(p, ns_of(req) - (result == 0 ? 0 : ns_of(rem ? rem : &left)));
    return result;
}

int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
    REAL(int, "clock_nanosleep", clockid_t, int, const struct timespec *, struct timespec *);
    struct det_page *p = page();
    int kind = family(id);
    if (!p || !kind) return real(id, flags, req, rem);
    if (flags & TIMER_ABSTIME) {
        struct timespec until = real_deadline(p, kind, req);
        int result = real(kind == 2 ? CLOCK_MONOTONIC : CLOCK_REALTIME, TIMER_ABSTIME, &until, rem);
        if (result == 0) reach(p, kind, ns_of(req));
        return result;
    }
    struct timespec left = {0, 0};
    int result = real(id, 0, req, rem ? rem : &left);
    advance(p, ns_of(req) - (result == 0 ? 0 : ns_of(rem ? rem : &left)));
    return result;
}

unsigned int sleep(unsigned int seconds) {
    REAL(unsigned int, "sleep", unsigned int);
    struct det_page *p = page();
    unsigned int left = real(seconds);
    if (p) advance(p, (int64_t)(seconds - left) * DET_SECOND);
    return left;
}

int usleep(useconds_t usec) {
    REAL(int, "usleep", useconds_t);
    struct det_page *p = page();
    int result = real(usec);
    if (p && result == 0) advance(p, (int64_t)usec * 1000);
    return result;
}

int poll(struct pollfd *fds, nfds_t n, int timeout) {
    REAL(int, "poll", struct pollfd *, nfds_t, int);
    struct det_page *p = page();
    int result = real(fds, n, timeout);
    if (p && result == 0 && timeout > 0) advance(p, (int64_t)timeout * 1000000);
    return result;
}

int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *timeout, const sigset_t *mask) {
    REAL(int, "ppoll", struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
    struct det_page *p = page();
    int result = real(fds, n, timeout, mask);
    if (p && result == 0 && timeout) advance(p, ns_of(timeout));
    return result;
}

int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *timeout) {
    REAL(int, "select", int, fd_set *, fd_set *, fd_set *, struct timeval *);
    struct det_page *p = page();
    int64_t asked = timeout ? (int64_t)timeout->tv_sec * DET_SECOND + timeout->tv_usec * 1000 : 0;
    int result = real(n, r, w, e, timeout);
    if (p && result == 0) advance(p, asked);
    return result;
}

int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *timeout, const sigset_t *mask) {
    REAL(int, "pselect", int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
    struct det_page *p = page();
    int result = real(n, r, w, e, timeout, mask);
    if (p && result == 0 && timeout) advance(p, ns_of(timeout));
    return result;
}

int epoll_wait(int fd, struct epoll_event *events, int max, int timeout) {
    REAL(int, "epoll_wait", int, struct epoll_event *, int, int);
    struct det_page *p = page();
    int result = real(fd, events, max, timeout);
    if (p && result == 0 && timeout > 0) advance(p, (int64_t)timeout * 1000000);
    return result;
}

int epoll_pwait(int fd, struct epoll_event *events, int max, int timeout, const sigset_t *mask) {
    REAL(int, "epoll_pwait", int, struct epoll_event *, int, int, const sigset_t *);
    struct det_page *p = page();
    int result = real(fd, events, max, timeout, mask);
    if (p && result == 0 && timeout > 0) advance(p, (int64_t)timeout * 1000000);
    return result;
}

/* Returns fn(args..., deadline) with the real deadline as far away as the virtual `deadline` on `kind`'s clock (0:
 * not a virtual one, called as it is); a timeout moves the clock to the deadline. */
#define TIMED(kind, deadline, fn, ...)                                                                         \
    do {                                                                                                       \
        struct det_page *p = page();                                                                           \
        int k = (kind);                                                                                        \
        if (!p || !k) return fn(__VA_ARGS__, deadline);                                                        \
        struct timespec until = real_deadline(p, k, deadline);                                                 \
        int result = fn(__VA_ARGS__, &until);                                                                  \
        if (result == ETIMEDOUT || (result == -1 && errno == ETIMEDOUT)) reach(p, k, ns_of(deadline));         \
        return result;                                                                                         \
    } while (0)
/* The real clock a wait that names `id` waits on. */
#define BASE(id) (family(id) == 2 ? CLOCK_MONOTONIC : family(id) == 1 ? CLOCK_REALTIME : (id))

int pthread_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex, const struct timespec *deadline) {
    static int (*real)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
    if (!real) real = dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
    TIMED(guess(deadline), deadline, real, cond, mutex);
}

int pthread_cond_clockwait(pthread_cond_t *cond, pthread_mutex_t *mutex, clockid_t id, const struct timespec *deadline) {
    REAL(int, "pthread_cond_clockwait", pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
    TIMED(family(id), deadline, real, cond, mutex, BASE(id));
}

int sem_timedwait(sem_t *sem, const struct timespec *deadline) {
    REAL(int, "sem_timedwait", sem_t *, const struct timespec *);
    TIMED(1, deadline, real, sem);
}

int sem_clockwait(sem_t *sem, clockid_t id, const struct timespec *deadline) {
    REAL(int, "sem_clockwait", sem_t *, clockid_t, const struct timespec *);
    TIMED(family(id), deadline, real, sem, BASE(id));
}

int pthread_mutex_timedlock(pthread_mutex_t *mutex, const struct timespec *deadline) {
    REAL(int, "pthread_mutex_timedlock", pthread_mutex_t *, const struct timespec *);
    TIMED(1, deadline, real, mutex);
}

int pthread_mutex_clocklock(pthread_mutex_t *mutex, clockid_t id, const struct timespec *deadline) {
    REAL(int, "pthread_mutex_clocklock", pthread_mutex_t *, clockid_t, const struct timespec *);
    TIMED(family(id), deadline, real, mutex, BASE(id));
}

/* -- entropy -------------------------------------------------------------------------------------------- */

static void fill(struct det_page *p, void *buf, size_t n) {
    uint64_t pid = (uint64_t)getpid();
    uint64_t pos = atomic_fetch_add(&p->random_pos[pid % DET_PIDS], n);
    det_stream(det_key(p->seed, DET_RANDOM_STREAM | pid << 8), pos, buf, n);
}

ssize_t getrandom(void *buf, size_t n, unsigned int flags) {
    REAL(ssize_t, "getrandom", void *, size_t, unsigned int);
    struct det_page *p = page();
    if (!p) return real(buf, n, flags);
    fill(p, buf, n);
    return (ssize_t)n;
}

int getentropy(void *buf, size_t n) {
    REAL(int, "getentropy", void *, size_t);
    struct det_page *p = page();
    if (!p) return real(buf, n);
    if (n > 256) {
        errno = EIO;
        return -1;
    }
    fill(p, buf, n);
    return 0;
}

uint32_t arc4random(void) {
    REAL(uint32_t, "arc4random", void);
    struct det_page *p = page();
    if (!p) return real();
    uint32_t value;
    fill(p, &value, sizeof value);
    return value;
}

void arc4random_buf(void *buf, size_t n) {
    REAL(void, "arc4random_buf", void *, size_t);
    struct det_page *p = page();
    if (!p) {
        real(buf, n);
        return;
    }
    fill(p, buf, n);
}

uint32_t arc4random_uniform(uint32_t bound) {
    REAL(uint32_t, "arc4random_uniform", uint32_t);
    struct det_page *p = page();
    if (!p) return real(bound);
    if (bound < 2) return 0;
    uint32_t value, floor = -bound % bound; /* rejection keeps it uniform */
    do fill(p, &value, sizeof value);
    while (value < floor);
    return value % bound;
}

/* Temporary names. The C library draws those of mkstemp and its kin (sort's and tac's files, mkdtemp, mktemp,
 * tmpnam) from a stack address and the real clock, read inside the library where no interposer reaches; here they
 * are drawn from the process's stream instead, tried as glibc tries them: the six X before the suffix replaced by
 * letters of its alphabet, again while the name is taken. */
enum { NAME_FILE, NAME_DIR, NAME_FREE };
#define NAME_LETTERS 6
#define NAME_ATTEMPTS (62 * 62 * 62) /* glibc's */

static int temp_name(struct det_page *p, char *name, int suffix, int flags, int kind) {
    static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t len = strlen(name);
    if (suffix < 0 || len < NAME_LETTERS + (size_t)suffix ||
        strspn(name + len - NAME_LETTERS - suffix, "X") < NAME_LETTERS) {
        errno = EINVAL;
        return -1;
    }
    char *x = name + len - NAME_LETTERS - suffix;
    int saved = errno;
    for (int attempt = 0; attempt < NAME_ATTEMPTS; attempt++) {
        unsigned char drawn[16];
        size_t used = sizeof drawn;
        for (int i = 0; i < NAME_LETTERS; i++) {
            do {
                if (used == sizeof drawn) {
                    fill(p, drawn, sizeof drawn);
                    used = 0;
                }
            } while (drawn[used++] >= 248); /* 4 * 62: every letter as likely */
            x[i] = letters[drawn[used - 1] % 62];
        }
        struct stat st;
        int fd = kind == NAME_FILE ? open(name, (flags & ~O_ACCMODE) | O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR)
                 : kind == NAME_DIR ? mkdir(name, S_IRWXU)
                 : lstat(name, &st) == 0 ? (errno = EEXIST, -1)
                 : errno == ENOENT ? 0 : -1;
        if (fd >= 0) {
            errno = saved;
            return fd;
        }
        if (errno != EEXIST) return -1;
    }
    errno = EEXIST;
    return -1;
}

#define MKSTEMP(name, params, args, suffix, flags, ...)                                                         \
    int name params {                                                                                          \
        REAL(int, #name, __VA_ARGS__);                                                                         \
        struct det_page *p = page();                                                                           \
        return p ? temp_name(p, t, suffix, flags, NAME_FILE) : real args;                                      \
    }

MKSTEMP(mkstemp, (char *t), (t), 0, 0, char *)
MKSTEMP(mkstemp64, (char *t), (t), 0, O_LARGEFILE, char *)
MKSTEMP(mkostemp, (char *t, int flags), (t, flags), 0, flags, char *, int)
MKSTEMP(mkostemp64, (char *t, int flags), (t, flags), 0, flags | O_LARGEFILE, char *, int)
MKSTEMP(mkstemps, (char *t, int suffix), (t, suffix), suffix, 0, char *, int)
MKSTEMP(mkstemps64, (char *t, int suffix), (t, suffix), suffix, O_LARGEFILE, char *, int)
MKSTEMP(mkostemps, (char *t, int suffix, int flags), (t, suffix, flags), suffix, flags, char *, int, int)
MKSTEMP(mkostemps64, (char *t, int suffix, int flags), (t, suffix, flags), suffix, flags | O_LARGEFILE, char *, int,
        int)

char *mkdtemp(char *t) {
    REAL(char *, "mkdtemp", char *);
    struct det_page *p = page();
    if (!p) return real(t);
    return temp_name(p, t, 0, 0, NAME_DIR) == 0 ? t : NULL;
}

char *mktemp(char *t) {
    REAL(char *, "mktemp", char *);
    struct det_page *p = page();
    if (!p) return real(t);
    if (temp_name(p, t, 0, 0, NAME_FREE) < 0) t[0] = '\0';
    return t;
}

/* tmpnam and tempnam: the C library chooses the directory and prefix; the last six letters are drawn again. */
static char *redrawn(struct det_page *p, char *name) {
    size_t len = name ? strlen(name) : 0;
    if (len < NAME_LETTERS) return name;
    memset(name + len - NAME_LETTERS, 'X', NAME_LETTERS);
    return temp_name(p, name, 0, 0, NAME_FREE) == 0 ? name : NULL;
}

char *tmpnam(char s[L_tmpnam]) {
    REAL(char *, "tmpnam", char *);
    struct det_page *p = page();
    return p ? redrawn(p, real(s)) : real(s);
}

char *tmpnam_r(char s[L_tmpnam]) {
    REAL(char *, "tmpnam_r", char *);
    struct det_page *p = page();
    return p ? redrawn(p, real(s)) : real(s);
}

char *tempnam(const char *dir, const char *prefix) {
    REAL(char *, "tempnam", const char *, const char *);
    struct det_page *p = page();
    char *name = real(dir, prefix);
    if (!p || !name || redrawn(p, name)) return name;
    free(name);
    return NULL;
}

/* -- file times ----------------------------------------------------------------------------------------- */

static int64_t file_time(struct det_page *p, int64_t real) {
    uint32_t count = atomic_load_explicit(&p->anchors, memory_order_acquire);
    if (count > DET_ANCHORS) count = DET_ANCHORS;
    if (count == 0 || real < p->anchor[0].real) return real < p->born ? real : p->boot;
    uint32_t low = 0, high = count; /* the last anchor at or before `real` */
    while (high - low > 1) {
        uint32_t mid = low + (high - low) / 2;
        if (p->anchor[mid].real <= real) low = mid;
        else high = mid;
    }
    return p->anchor[low].virt;
}

static void fix_timespec(struct det_page *p, struct timespec *t) { *t = ts_of(file_time(p, ns_of(t))); }

static uint64_t device(struct det_page *p, uint64_t real) {
    uint32_t n = atomic_load(&p->devices);
    for (uint32_t i = 0; i < n && i < DET_DEVICES; i++)
        if (p->device[i].real == real && atomic_load(&p->device[i].virt)) return atomic_load(&p->device[i].virt);
    if (n >= DET_DEVICES || !atomic_compare_exchange_strong(&p->devices, &n, n + 1)) return real;
    p->device[n].real = real; /* met for the first time in the episode: the next number */
    atomic_store(&p->device[n].virt, makedev(0, 64 + n));
    return makedev(0, 64 + n);
}

static void fix_stat(struct stat *st) {
    struct det_page *p = page();
    if (!p || !st) return;
    st->st_dev = device(p, st->st_dev);
    fix_timespec(p, &st->st_atim);
    fix_timespec(p, &st->st_mtim);
    fix_timespec(p, &st->st_ctim);
}

static void fix_statx_time(struct det_page *p, struct statx_timestamp *t) {
    int64_t virt = file_time(p, (int64_t)t->tv_sec * DET_SECOND + t->tv_nsec);
    t->tv_sec = virt / DET_SECOND;
    t->tv_nsec = (uint32_t)(virt % DET_SECOND);
}

#define STAT_CALL(name, args, buf, ...)                                                                        \
    REAL(int, name, __VA_ARGS__);                                                                              \
    int result = real args;                                                                                    \
    if (result == 0) fix_stat((struct stat *)(buf));                                                           \
    return result

int stat(const char *path, struct stat *buf) { STAT_CALL("stat", (path, buf), buf, const char *, struct stat *); }
int lstat(const char *path, struct stat *buf) { STAT_CALL("lstat", (path, buf), buf, const char *, struct stat *); }
int fstat(int fd, struct stat *buf) { STAT_CALL("fstat", (fd, buf), buf, int, struct stat *); }
int fstatat(int dir, const char *path, struct stat *buf, int flags) {
    STAT_CALL("fstatat", (dir, path, buf, flags & ~AT_NO_AUTOMOUNT), buf, int, const char *, struct stat *, int);
}
int stat64(const char *path, struct stat64 *buf) {
    STAT_CALL("stat64", (path, buf), buf, const char *, struct stat64 *);
}
int lstat64(const char *path, struct stat64 *buf) {
    STAT_CALL("lstat64", (path, buf), buf, const char *, struct stat64 *);
}
int fstat64(int fd, struct stat64 *buf) { STAT_CALL("fstat64", (fd, buf), buf, int, struct stat64 *); }
int fstatat64(int dir, const char *path, struct stat64 *buf, int flags) {
    STAT_CALL("fstatat64", (dir, path, buf, flags & ~AT_NO_AUTOMOUNT), buf, int, const char *, struct stat64 *,
              int);
}

int statx(int dir, const char *path, int flags, unsigned int mask, struct statx *buf) {
    REAL(int, "statx", int, const char *, int, unsigned int, struct statx *);
    int result = real(dir, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
    struct det_page *p = page();
    if (result == 0 && p) {
        uint64_t dev = device(p, makedev(buf->stx_dev_major, buf->stx_dev_minor));
        buf->stx_dev_major = major(dev);
        buf->stx_dev_minor = minor(dev);
        fix_statx_time(p, &buf->stx_atime);
        fix_statx_time(p, &buf->stx_mtime);
        fix_statx_time(p, &buf->stx_ctime);
        if (buf->stx_mask & STATX_BTIME) fix_statx_time(p, &buf->stx_btime);
    }
    return result;
}

/* Calls that may change files: the next command waits, if it must, until the filesystems' clock has moved past
 * this one's end, so that no file this one stamps can be taken for the next one's. */
static void dirty(void) {
    struct det_page *p = page();
    if (p) atomic_store_explicit(&p->dirty, 1, memory_order_relaxed);
}

/* Whether what a process opened for writing is a file whose times it may change: not a device, pipe or socket
 * (git opens /dev/null and bash /dev/tty for reading and writing at every start). */
static void opened(int fd) {
    struct stat st;
    if (fd >= 0 && (syscall(SYS_fstat, fd, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) dirty();
}

#define WRITES (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)
#define OPEN(name, call, ...)                                                                                  \
    REAL(int, name, __VA_ARGS__);                                                                              \
    mode_t mode = 0;                                                                                           \
    if (flags & (O_CREAT | __O_TMPFILE)) {                                                                     \
        va_list args;                                                                                          \
        va_start(args, flags);                                                                                 \
        mode = va_arg(args, mode_t);                                                                           \
        va_end(args);                                                                                          \
    }                                                                                                          \
    int fd = real call;                                                                                        \
    if (flags & WRITES) opened(fd);                                                                            \
    return fd

int open(const char *path, int flags, ...) { OPEN("open", (path, flags, mode), const char *, int, ...); }
int open64(const char *path, int flags, ...) { OPEN("open64", (path, flags, mode), const char *, int, ...); }
int openat(int dir, const char *path, int flags, ...) {
    OPEN("openat", (dir, path, flags, mode), int, const char *, int, ...);
}
int openat64(int dir, const char *path, int flags, ...) {
    OPEN("openat64", (dir, path, flags, mode), int, const char *, int, ...);
}

#define FOPEN(name)                                                                                            \
    REAL(FILE *, name, const char *, const char *);                                                            \
    FILE *file = real(path, how);                                                                              \
    if (file && strpbrk(how, "wa+")) opened(fileno(file));                                                     \
    return file

FILE *fopen(const char *path, const char *how) { FOPEN("fopen"); }
FILE *fopen64(const char *path, const char *how) { FOPEN("fopen64"); }

#define CHANGES(type, name, params, args, ...)                                                                \
    type name params {                                                                                         \
        REAL(type, #name, __VA_ARGS__);                                                                        \
        dirty();                                                                                               \
        return real args;                                                                                      \
    }

CHANGES(int, creat, (const char *a, mode_t b), (a, b), const char *, mode_t)
CHANGES(int, creat64, (const char *a, mode_t b), (a, b), const char *, mode_t)
CHANGES(int, mkdir, (const char *a, mode_t b), (a, b), const char *, mode_t)
CHANGES(int, mkdirat, (int a, const char *b, mode_t c), (a, b, c), int, const char *, mode_t)
CHANGES(int, rename, (const char *a, const char *b), (a, b), const char *, const char *)
CHANGES(int, renameat, (int a, const char *b, int c, const char *d), (a, b, c, d), int, const char *, int,
        const char *)
CHANGES(int, renameat2, (int a, const char *b, int c, const char *d, unsigned e), (a, b, c, d, e), int,
        const char *, int, const char *, unsigned)
CHANGES(int, unlink, (const char *a), (a), const char *)
CHANGES(int, unlinkat, (int a, const char *b, int c), (a, b, c), int, const char *, int)
CHANGES(int, rmdir, (const char *a), (a), const char *)
CHANGES(int, link, (const char *a, const char *b), (a, b), const char *, const char *)
CHANGES(int, linkat, (int a, const char *b, int c, const char *d, int e), (a, b, c, d, e), int, const char *, int,
        const char *, int)
CHANGES(int, symlink, (const char *a, const char *b), (a, b), const char *, const char *)
CHANGES(int, symlinkat, (const char *a, int b, const char *c), (a, b, c), const char *, int, const char *)
CHANGES(int, truncate, (const char *a, off_t b), (a, b), const char *, off_t)
CHANGES(int, ftruncate, (int a, off_t b), (a, b), int, off_t)
CHANGES(int, utimensat, (int a, const char *b, const struct timespec c[2], int d), (a, b, c, d), int, const char *,
        const struct timespec *, int)
CHANGES(int, futimens, (int a, const struct timespec b[2]), (a, b), int, const struct timespec *)
CHANGES(int, utimes, (const char *a, const struct timeval b[2]), (a, b), const char *, const struct timeval *)
CHANGES(int, chmod, (const char *a, mode_t b), (a, b), const char *, mode_t)
CHANGES(int, fchmod, (int a, mode_t b), (a, b), int, mode_t)
CHANGES(int, fchmodat, (int a, const char *b, mode_t c, int d), (a, b, c, d), int, const char *, mode_t, int)
CHANGES(int, chown, (const char *a, uid_t b, gid_t c), (a, b, c), const char *, uid_t, gid_t)
CHANGES(int, fchown, (int a, uid_t b, gid_t c), (a, b, c), int, uid_t, gid_t)
CHANGES(int, lchown, (const char *a, uid_t b, gid_t c), (a, b, c), const char *, uid_t, gid_t)
CHANGES(int, fchownat, (int a, const char *b, uid_t c, gid_t d, int e), (a, b, c, d, e), int, const char *, uid_t,
        gid_t, int)
CHANGES(int, mknod, (const char *a, mode_t b, dev_t c), (a, b, c), const char *, mode_t, dev_t)
CHANGES(int, mkfifo, (const char *a, mode_t b), (a, b), const char *, mode_t)

/* -- the machine ---------------------------------------------------------------------------------------- */

int uname(struct utsname *buf) {
    REAL(int, "uname", struct utsname *);
    int result = real(buf);
    struct det_page *p = page();
    if (result == 0 && p) {
        snprintf(buf->release, sizeof buf->release, "%s", p->release);
        snprintf(buf->version, sizeof buf->version, "%s", p->version);
        snprintf(buf->machine, sizeof buf->machine, "%s", p->machine);
    }
    return result;
}

long sysconf(int name) {
    REAL(long, "sysconf", int);
    struct det_page *p = page();
    if (!p) return real(name);
    switch (name) {
    case _SC_NPROCESSORS_ONLN: case _SC_NPROCESSORS_CONF: return p->cpus;
    case _SC_PHYS_PAGES: return (long)(p->memory / (uint64_t)real(_SC_PAGESIZE));
    case _SC_AVPHYS_PAGES: return (long)(p->memory / 4 * 3 / (uint64_t)real(_SC_PAGESIZE));
    default: return real(name);
    }
}

int get_nprocs(void) {
    REAL(int, "get_nprocs", void);
    struct det_page *p = page();
    return p ? (int)p->cpus : real();
}

int get_nprocs_conf(void) {
    REAL(int, "get_nprocs_conf", void);
    struct det_page *p = page();
    return p ? (int)p->cpus : real();
}

int sched_getaffinity(pid_t pid, size_t size, cpu_set_t *mask) {
    REAL(int, "sched_getaffinity", pid_t, size_t, cpu_set_t *);
    struct det_page *p = page();
    if (!p) return real(pid, size, mask);
    if (size * 8 < p->cpus) {
        errno = EINVAL;
        return -1;
    }
    memset(mask, 0, size);
    for (uint32_t cpu = 0; cpu < p->cpus; cpu++) CPU_SET_S(cpu, size, mask);
    return 0;
}
