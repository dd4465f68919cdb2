/*
 * Part of the library preloaded into a deterministic sandbox's commands (determinism.c calls it from
 * __libc_start_main): the program's main runs on a stack at the same address in every episode, where the runtime
 * places the stack at random and will not be told otherwise (gVisor: `personality(ADDR_NO_RANDOMIZE)` is refused,
 * and its loader randomises the stack whatever is asked; docs/determinism.md). Programs that mix a stack address
 * into a seed then draw the same: gnulib's temporary names (coreutils' mktemp, whose first try at a file or a
 * directory mixes the address of a local variable with the monotonic clock's nanoseconds).
 *
 * __libc_stack_end is moved with it, so that what asks where the main thread's stack is (pthread_getattr_np: V8,
 * Go's cgo, garbage collectors that scan the stack) is told the one it runs on. Where the runtime does turn
 * randomisation off (runc), where the address is taken, or on an architecture without the switch below, main runs
 * where it would have. Heap and library addresses stay the runtime's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/resource.h>
#include <unistd.h>

#include "det.h"

#define STACK_TOP ((uintptr_t)1 << 44) /* below every address the runtimes randomise (PIE, mmap base, stack) */
#define STACK_MAX ((size_t)128 << 20)  /* gVisor's own cap on a main thread's stack */
#define STACK_ARGS 64                  /* room above the first frame, as the kernel leaves argc and argv there */

extern void *__libc_stack_end;

#if defined(__x86_64__)
/* det_call_on(main, argc, argv, envp, sp): main(argc, argv, envp) with the stack pointer at sp, and back. The frame
 * is described (rbp), so that unwinders and backtraces go on through it to the caller on the first stack. */
int det_call_on(det_main main, int argc, char **argv, char **envp, void *sp) __attribute__((visibility("hidden")));
__asm__(".text\n"
        ".p2align 4\n"
        ".type det_call_on, @function\n"
        "det_call_on:\n"
        ".cfi_startproc\n"
        "    push %rbp\n"
        ".cfi_def_cfa_offset 16\n"
        ".cfi_offset %rbp, -16\n"
        "    mov %rsp, %rbp\n"
        ".cfi_def_cfa_register %rbp\n"
        "    mov %r8, %rsp\n"
        "    mov %rdi, %rax\n"
        "    mov %esi, %edi\n"
        "    mov %rdx, %rsi\n"
        "    mov %rcx, %rdx\n"
        "    call *%rax\n"
        "    mov %rbp, %rsp\n"
        "    pop %rbp\n"
        ".cfi_def_cfa %rsp, 8\n"
        "    ret\n"
        ".cfi_endproc\n"
        ".size det_call_on, .-det_call_on\n");

static det_main program;

static size_t stack_size(void) {
    struct rlimit limit;
    size_t page = (size_t)getpagesize();
    if (getrlimit(RLIMIT_STACK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > STACK_MAX)
        return STACK_MAX;
    return ((size_t)limit.rlim_cur + page - 1) / page * page;
}

struct relro {
    uintptr_t address;
    int within; /* `address` is in a page the dynamic loader made read-only after relocating its object */
};

static int find_relro(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct relro *want = data;
    uintptr_t page = (uintptr_t)getpagesize();
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_GNU_RELRO) continue;
        /* As the dynamic loader protects it: the whole pages within the segment (_dl_protect_relro). */
        uintptr_t start = (info->dlpi_addr + ph->p_vaddr) & -page;
        uintptr_t end = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & -page;
        if (start <= want->address && want->address < end) return want->within = 1;
    }
    return 0;
}

/* Sets __libc_stack_end, which the dynamic loader made read-only with the rest of its relro segment. */
static int set_stack_end(void *end) {
    struct relro relro = {(uintptr_t)&__libc_stack_end, 0};
    dl_iterate_phdr(find_relro, &relro);
    if (!relro.within) {
        __libc_stack_end = end;
        return 1;
    }
    uintptr_t page = relro.address & -(uintptr_t)getpagesize();
    if (mprotect((void *)page, (size_t)getpagesize(), PROT_READ | PROT_WRITE) != 0) return 0;
    __libc_stack_end = end;
    mprotect((void *)page, (size_t)getpagesize(), PROT_READ);
    return 1;
}

static int main_on_fixed_stack(int argc, char **argv, char **envp) {
    int saved = errno; /* zero, as main is owed it */
    size_t size = stack_size();
    void *want = (void *)(STACK_TOP - size);
    /* A hint, not MAP_FIXED (which would replace what is there) nor MAP_FIXED_NOREPLACE (which gVisor ignores). */
    void *base = mmap(want, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK |
                      MAP_GROWSDOWN, -1, 0);
    void *sp = (void *)(STACK_TOP - STACK_ARGS);
    int moved = base == want && set_stack_end(sp);
    if (!moved && base != MAP_FAILED) munmap(base, size);
    errno = saved;
    return moved ? det_call_on(program, argc, argv, envp, sp) : program(argc, argv, envp);
}

det_main det_fixed_stack(det_main main) {
    int saved = errno;
    int persona = personality(0xffffffff);
    errno = saved;
    if (persona != -1 && (persona & ADDR_NO_RANDOMIZE)) return main;
    program = main;
    return main_on_fixed_stack;
}
#else
det_main det_fixed_stack(det_main main) { return main; }
#endif
