/* The peers of a benchmark see a CPU without AVX-512 (bench/isa.py): CPUID is made to fault in this
 * process (Linux's ARCH_SET_CPUID, where the CPU can fault CPUID), and the fault handler runs the
 * instruction itself with AVX-512's and AMX's feature bits cleared. execve ends it, so a compiler or
 * a worker process started later sees the real CPU. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* leaf 7 subleaf 0: EBX AVX512F DQ IFMA PF ER CD BW VL; ECX VBMI VBMI2 VNNI BITALG VPOPCNTDQ;
 * EDX 4VNNIW 4FMAPS VP2INTERSECT AMX-BF16 AVX512-FP16 AMX-TILE AMX-INT8. leaf 7 subleaf 1: EAX AVX512-BF16 */
#define EBX7 ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31))
#define ECX7 ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
#define EDX7 ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25))
#define EAX71 (1u << 5)

static struct sigaction previous;
static volatile long masked;

static long cpuid_enabled(int on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on); }

static void on_segv(int sig, siginfo_t *info, void *ctx) {
    greg_t *g = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    if (info->si_code == SI_KERNEL && ip[0] == 0x0F && ip[1] == 0xA2) {
        uint32_t a = (uint32_t)g[REG_RAX], c = (uint32_t)g[REG_RCX], b, d, leaf = a, sub = c;
        cpuid_enabled(1);
        __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
        cpuid_enabled(0);
        if (leaf == 7 && sub == 0) {
            b &= ~EBX7;
            c &= ~ECX7;
            d &= ~EDX7;
        } else if (leaf == 7 && sub == 1) {
            a &= ~EAX71;
        }
        g[REG_RAX] = a;
        g[REG_RBX] = b;
        g[REG_RCX] = c;
        g[REG_RDX] = d;
        g[REG_RIP] += 2;
        masked++;
        return;
    }
    sigaction(SIGSEGV, &previous, NULL);  /* a real fault: it recurs on return, under the previous handler */
}

/* 0, or -1 where this CPU or kernel cannot fault CPUID */
int mask_avx512(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &previous))
        return -1;
    if (cpuid_enabled(0)) {
        sigaction(SIGSEGV, &previous, NULL);
        return -1;
    }
    return 0;
}

/* CPUID leaf 7's EBX as this process now sees it */
unsigned leaf7_ebx(void) {
    uint32_t a = 7, b, c = 0, d;
    __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    return b;
}

long masked_calls(void) { return masked; }
