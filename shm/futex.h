/* Process-shared futex waits and wakes on 32-bit words in shared memory, with timeouts so that a
 * waiter can notice a dead peer or a stop request. */
#ifndef SD_FUTEX_H
#define SD_FUTEX_H

#include <stdatomic.h>
#include <stdint.h>

/* Sleeps while *addr == expected, at most timeout_ms (< 0: no limit). Returns 0 when woken or the
 * value differs, 1 on timeout. */
int futex_wait(_Atomic uint32_t *addr, uint32_t expected, int timeout_ms);
void futex_wake_all(_Atomic uint32_t *addr);

/* Monotonic clock in nanoseconds. */
uint64_t clock_ns(void);

#endif
