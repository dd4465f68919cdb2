/*
 * Preloaded into commands under gVisor releases whose statx and newfstatat reject the
 * AT_NO_AUTOMOUNT flag (EINVAL) that current coreutils pass: without it, `ls` and `stat` fail.
 * The flag only matters for automount points, which a sandbox does not have.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

int fstatat(int dirfd, const char *path, struct stat *buf, int flags) {
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags) {
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}
