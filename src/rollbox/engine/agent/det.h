/*
 * The virtual machine a deterministic sandbox's commands see (docs/determinism.md): one shared page that the
 * agent makes and steps at each command (det.c), and that the library preloaded into commands reads and
 * advances (determinism.c, with fixed_stack.c). Included by both, and by nothing else.
 */
#ifndef ROLLBOX_DET_H
#define ROLLBOX_DET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DET_PAGE_PATH "/dev/.rollbox-determinism"
#define DET_LIBRARY "/.rollbox/determinism.so"
#define COMPAT_LIBRARY "/.rollbox/compat.so" /* oci.py's COMPAT_PATH: determinism.so does its work too */
#define DET_MAGIC 0x3174656478626c72ULL
#define DET_SECOND 1000000000LL
#define DET_TICK 1000LL /* ns each reading of a clock advances it */
#define DET_ANCHORS 16384
#define DET_FIFO_SIZE (1 << 20)
#define DET_DEVICES 128
#define DET_PIDS 32768 /* getrandom's streams: one per process id (modulo this) */
#define DET_FIRST_PID 32 /* under runc, the first command's handler takes this id, whatever runc's init took */

/* A filesystem's device number (st_dev), and the one it shows: its place in the sandbox's mount table, or (for the
 * devices overlayfs makes up for its layers) in the order the episode first met it; the kernel numbers anonymous
 * devices as they come, across sandboxes. `virt` is set last: 0 while an entry is being written. */
struct det_device {
    uint64_t real;
    _Atomic uint64_t virt;
};

/* From this real time on (ns, as the filesystems stamp files), file times read as `virt`. */
struct det_anchor {
    int64_t real, virt;
};

/* What the host asks for (the D frame) and what it reads back (Q): little-endian, packed as engine/determinism.py
 * packs it. */
struct det_state {
    uint64_t seed;
    int64_t now;  /* the virtual CLOCK_REALTIME, ns since 1970 */
    int64_t boot; /* the virtual boot instant: CLOCK_MONOTONIC and CLOCK_BOOTTIME read now - boot */
    int64_t born; /* real time the timeline's first sandbox was made: files stamped before it (the template's, the
                   * host's) keep their times, files stamped from it to the first anchor show the boot instant;
                   * 0 in a D frame: the sandbox's own */
    uint64_t fifo_pos; /* bytes of /dev/urandom's stream handed out */
    uint32_t anchors;
    uint32_t pad;
} __attribute__((packed));

struct det_page {
    uint64_t magic;
    uint64_t seed;
    _Atomic int64_t now;
    int64_t boot, born;
    _Atomic uint32_t dirty;   /* a process opened a file for writing, renamed or removed one since the last start */
    uint32_t cpus;
    uint64_t memory;
    _Atomic int64_t last_end; /* real time (ns) the last command ended */
    char release[65], version[65], machine[65];
    _Atomic uint32_t devices;
    struct det_device device[DET_DEVICES];
    _Atomic uint32_t anchors;
    struct det_anchor anchor[DET_ANCHORS];
    /* Bytes of each process's getrandom stream handed out. A process's stream is its own (the seed's for its
     * process id, which is the same in every episode), so what one program draws, however much that is (a name
     * that collided), never shifts what the next one gets. */
    _Atomic uint64_t random_pos[DET_PIDS];
};

/* splitmix64's finaliser: the seeded streams are blocks of it over a counter. Not a cryptographic generator:
 * a deterministic sandbox's randomness is known to whoever knows its seed, by design. */
static inline uint64_t det_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t det_key(uint64_t seed, uint64_t stream) { return det_mix(seed ^ det_mix(stream)); }

/* Bytes [pos, pos + n) of the stream `key`: block k (the bytes from 8k, little-endian) is det_mix of the key and k. */
static inline void det_stream(uint64_t key, uint64_t pos, unsigned char *out, size_t n) {
    for (size_t i = 0; i < n;) {
        uint64_t block = det_mix(key + (pos / 8) * 0x9e3779b97f4a7c15ULL);
        if (pos % 8 == 0 && n - i >= 8) { /* a whole block: one store where the machine is little-endian */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            memcpy(out + i, &block, 8);
#else
            for (unsigned b = 0; b < 8; b++) out[i + b] = (unsigned char)(block >> (8 * b));
#endif
            i += 8, pos += 8;
            continue;
        }
        for (unsigned b = pos % 8; b < 8 && i < n; b++, i++, pos++) out[i] = (unsigned char)(block >> (8 * b));
    }
}

/* fixed_stack.c, in the preloaded library: what __libc_start_main calls instead of the program's `main` so that it
 * runs on a stack at the same address in every episode (`main` itself where the runtime fixes addresses already). */
typedef int (*det_main)(int, char **, char **);
det_main det_fixed_stack(det_main main) __attribute__((visibility("hidden")));

#define DET_RANDOM_STREAM 1 /* getrandom, getentropy, arc4random: one per process id (shifted by 8) */
#define DET_FIFO_STREAM 2   /* /dev/urandom and /dev/random */

#endif
