/*
 * What the exec agent's files share: the request a connection builds, the streams, rings and clients of
 * background processes, the table of them, and each file's functions the others call.
 *
 *   agent.c       the listener: main, a connection's frames (handle), hold() for checkpoints
 *   wire.c        frames and I/O on descriptors
 *   command.c     becoming the command: isolation, user, capabilities, seccomp, exec
 *   tree.c        a command's process tree in /proc: who descends from whom, killing it whole
 *   run.c         a command that runs while its connection waits (the x frame)
 *   processes.c   background processes: their table in the main process, and the wire format
 *   background.c  starting one; supervisor.c follows it; ring.c keeps its output
 *   det.c         the deterministic mode: the virtual machine's page (det.h), /dev/urandom, D and Q frames
 *   port.c        a port inside the sandbox, opened for the host (the N frame)
 */
#ifndef ROLLBOX_AGENT_H
#define ROLLBOX_AGENT_H

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
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

#include "det.h"

#define MAX_FRAME (64u << 20)
#define MAX_ITEMS 65536
#define CHUNK 65536
#define VERSION "rollbox-agent 1"
#define LOCKOUT_ID 2147483646u /* owns the socket directory (--path); no command runs as it */
#define ISOLATION_IDS "0 0 65536\n" /* ids an isolated command's user namespace maps, unchanged */
#define SANDBOX_ROOT "/.rollbox/root" /* the host binds the sandbox's root here, read-only, no submounts */
#define SCRATCH "/.rollbox"

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
    int pass_socket; /* port.c */
};

struct stream {
    int fd;
    char type;
    long long sent;
    int truncated;
};

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#else
#error "rollbox-agent: name this architecture's AUDIT_ARCH for the command seccomp filters"
#endif

extern char **environ;
extern char self_exe[256]; /* agent.c */

/* wire.c */
void die(const char *what);
int write_all(int fd, const void *buf, size_t len);
int send_frame(int fd, char type, const void *data, uint32_t len);
int read_frame(int fd, char **data, uint32_t *len);
long long now_ms(void);
void push(char ***list, size_t *count, char *item);
void append_stdin(struct request *rq, const char *data, uint32_t len);
void set_nonblock(int fd);

/* command.c */
void exec_command(struct request *rq, int in, int out, int err, int report, int ready, int go);
void map_isolated(pid_t child, int ready, int go);
void drop_capability(int cap);

/* tree.c */
int read_stat(pid_t pid, int *ppid, unsigned long long *start);
int is_descendant(pid_t pid, pid_t root);
void kill_tree(pid_t pgid, int subreaper, unsigned long long since);
void signal_descendants(pid_t root, int sig);

/* det.c (deterministic sandboxes only: det is NULL otherwise) */
extern struct det_page *det;
extern int det_fifo;
void det_open(const char *arg);
void det_refill(void);
void det_frame(int conn, int type, const char *data, uint32_t len);
void det_command_start(void);
void det_command_end(void);
void det_exec(struct request *rq);

/* run.c */
void run_request(int conn, struct request *rq, int sigfd);

/* port.c */
void open_port(int conn, const char *port, int pass_socket);

/* -- background processes ------------------------------------------------------------------------ */

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

extern struct proc_entry procs[MAX_PROCS]; /* the table (main's; a handler's copy) */
extern int nprocs;
extern int registry[2]; /* supervisors tell main on [1]; main reads [0] */

/* Output kept to be read back: records (type, length, offset, data) in a circular buffer of bounded size;
 * positions grow without end and index the buffer modulo its size. Offsets count output bytes. */
struct ring {
    char *buf;
    size_t cap;
    unsigned long long tail, head;
    long long first, end; /* offset of the oldest byte kept, and past the newest */
};

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

/* processes.c */
int valid_id(const char *id);
struct proc_entry *find_proc(const char *id);
void send_error(int conn, const char *msg);
void registry_open(void);
void registry_drain(void);
void let_go_of_clients(void);
void proc_reaped(pid_t pid);
int info_frame(int conn, const struct proc_entry *e);
void list_procs(int conn);
void attach_proc(int conn, const char *id);
void tell_main(const char *text, int fd);

/* ring.c */
void ring_copy(struct ring *r, unsigned long long pos, void *dst, size_t n, int out);
void ring_header(struct ring *r, unsigned long long pos, char *type, uint32_t *len, long long *offset);
void ring_put(struct ring *r, char type, const char *data, uint32_t len);

/* supervisor.c */
void supervise(struct supervisor *s, int sigfd);

/* background.c */
void run_background(int conn, struct request *rq, int sigfd);

#endif
