/* futex(2) wrappers for process-shared waiting (see futex.h). */
#include "futex.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int futex_wait(_Atomic uint32_t *addr, uint32_t expected, int timeout_ms)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tsp = &ts;
    }
    /* Not FUTEX_PRIVATE: the word lives in a mapping shared between processes. */
    long rc = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, tsp, NULL, 0);
    if (rc < 0 && errno == ETIMEDOUT)
        return 1;
    return 0;
}

void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
