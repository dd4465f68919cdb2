/* A port inside the sandbox, opened for the host (the N frame): the agent connects to the sandbox's own loopback at
 * the port named, as any process of the sandbox could, and then either hands the connected socket to the host (F:
 * the runtime lets descriptors cross, as runc does; the host then talks to the sandbox's server with no process in
 * between) or relays bytes between that socket and its connection until both sides are done (gVisor, whose sockets
 * live in its own network stack and cannot leave it).
 *
 *   host -> agent  F (pass the socket) | N port
 *   agent -> host  N (opened: the socket rides along as SCM_RIGHTS with F; without F the connection carries the
 *                  port's bytes from here on) | E message (nothing listens there, or the port is not a port)
 *
 * Only the sandbox's loopback is ever dialled (127.0.0.1, then ::1), so the host cannot use the agent to reach
 * anything the sandbox's own processes could not. */
#include "agent.h"

static int dial(int family, const struct sockaddr *addr, socklen_t length) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, addr, length) == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
    }
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

static int dial_loopback(int port) {
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = dial(AF_INET, (struct sockaddr *)&v4, sizeof v4);
    if (fd >= 0) return fd;
    int saved = errno;
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    fd = dial(AF_INET6, (struct sockaddr *)&v6, sizeof v6);
    if (fd < 0) errno = saved; /* the IPv4 answer says more (IPv6 may be off altogether) */
    return fd;
}

static int send_socket(int conn, int fd) {
    unsigned char frame[5] = {'N', 0, 0, 0, 0};
    struct iovec iov = {.iov_base = frame, .iov_len = sizeof frame};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
    return sendmsg(conn, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof frame ? 0 : -1;
}

/* Copies what `from` has to `to`; at its end, ends `to`'s writing side. Returns 0 once `from` has ended. */
static int copy(int from, int to, char *buf) {
    ssize_t n = read(from, buf, CHUNK);
    if (n < 0) return (errno == EAGAIN || errno == EINTR) ? 1 : 0;
    if (n == 0 || write_all(to, buf, (size_t)n) < 0) {
        shutdown(to, SHUT_WR);
        return 0;
    }
    return 1;
}

static void relay(int conn, int fd) {
    char buf[CHUNK];
    int open[2] = {1, 1}; /* conn -> fd, fd -> conn */
    while (open[0] || open[1]) {
        struct pollfd fds[2] = {{conn, open[0] ? POLLIN : 0, 0}, {fd, open[1] ? POLLIN : 0, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return;
        }
        if ((fds[0].revents & (POLLERR | POLLNVAL)) || (fds[1].revents & (POLLERR | POLLNVAL))) return;
        if (open[0] && fds[0].revents & (POLLIN | POLLHUP)) open[0] = copy(conn, fd, buf);
        if (open[1] && fds[1].revents & (POLLIN | POLLHUP)) open[1] = copy(fd, conn, buf);
    }
}

void open_port(int conn, const char *text, int pass_socket) {
    char *end;
    long port = strtol(text, &end, 10);
    if (*text == 0 || *end != 0 || port < 1 || port > 65535) {
        const char *msg = "not a port: give a number from 1 to 65535";
        send_frame(conn, 'E', msg, (uint32_t)strlen(msg));
        return;
    }
    int fd = dial_loopback((int)port);
    if (fd < 0) {
        char msg[160];
        int n = snprintf(msg, sizeof msg, "nothing listens on port %ld in the sandbox (%s)", port, strerror(errno));
        send_frame(conn, 'E', msg, (uint32_t)n);
        return;
    }
    if (pass_socket) {
        send_socket(conn, fd);
    } else if (send_frame(conn, 'N', "", 0) == 0) {
        relay(conn, fd);
    }
    close(fd);
}
