/* SPSC rings and futex signalling across two processes: a producer pushes numbered descriptors
 * as fast as it can while the consumer checks every one arrives exactly once, in order, intact;
 * plus the single-process edge cases (full, empty, index wrap-around). */
#include "tests/testutil.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/futex.h"
#include "shm/ring.h"

struct shared {
    struct ring ring;
    alignas(64) _Atomic uint32_t doorbell; /* producer -> consumer */
    alignas(64) _Atomic uint32_t space;    /* consumer -> producer */
};

static struct chunk_desc_msg make_msg(uint32_t i)
{
    struct chunk_desc_msg m = {
        .chunk = i * 7u, .step = i, .micro = i ^ 0x5a5a5a5au, .rank = (uint16_t)(i & 0xffff),
        .slot = (uint16_t)(i >> 16), .generation = ~i, .kind = DESC_GRAD, .bytes = (uint64_t)i * 1000003ull,
    };
    return m;
}

static void test_single_process(void **state)
{
    struct ring *r = malloc(sizeof *r);
    ring_init(r);
    /* start near the 32-bit wrap so free-running indices overflow during the test */
    atomic_store(&r->head, 0xffffff00u);
    atomic_store(&r->tail, 0xffffff00u);
    struct chunk_desc_msg m;
    assert_false(ring_peek(r, &m));
    for (uint32_t i = 0; i < RING_CAP; i++) {
        struct chunk_desc_msg in = make_msg(i);
        assert_true(ring_push(r, &in));
    }
    struct chunk_desc_msg extra = make_msg(999);
    assert_false(ring_push(r, &extra)); /* full */
    assert_int_equal(ring_count(r), RING_CAP);
    for (uint32_t i = 0; i < RING_CAP; i++) {
        assert_true(ring_peek(r, &m));
        struct chunk_desc_msg want = make_msg(i);
        assert_memory_equal(&m, &want, sizeof m);
        ring_pop(r);
    }
    assert_false(ring_peek(r, &m));
    assert_int_equal(ring_count(r), 0);
    free(r);
}

static void test_two_processes(void **state)
{
    const uint32_t total = 2000000;
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    ring_init(&sh->ring);
    pid_t pid = fork();
    if (pid == 0) {
        for (uint32_t i = 0; i < total; i++) {
            struct chunk_desc_msg m = make_msg(i);
            while (!ring_push(&sh->ring, &m)) {
                uint32_t seen = atomic_load(&sh->space);
                if (!ring_push(&sh->ring, &m))
                    futex_wait(&sh->space, seen, 50);
                else
                    break;
            }
            atomic_fetch_add(&sh->doorbell, 1);
            if ((i & 63) == 0)
                futex_wake_all(&sh->doorbell);
        }
        futex_wake_all(&sh->doorbell);
        _exit(0);
    }
    uint32_t next = 0;
    uint64_t t0 = clock_ns();
    while (next < total) {
        uint32_t seen = atomic_load(&sh->doorbell);
        struct chunk_desc_msg m;
        bool any = false;
        while (ring_peek(&sh->ring, &m)) {
            struct chunk_desc_msg want = make_msg(next);
            if (memcmp(&m, &want, sizeof m) != 0)
                fail_msg("descriptor %u arrived torn or out of order (got step %u)", next, m.step);
            ring_pop(&sh->ring);
            next++;
            any = true;
        }
        if (any) {
            atomic_fetch_add(&sh->space, 1);
            futex_wake_all(&sh->space);
        } else {
            futex_wait(&sh->doorbell, seen, 50);
        }
        if (clock_ns() - t0 > 60ull * 1000000000ull)
            fail_msg("stalled after %u of %u descriptors", next, total);
    }
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(ring_count(&sh->ring), 0);
    printf("# %u descriptors in %.2f s\n", total, (double)(clock_ns() - t0) * 1e-9);
    munmap(sh, sizeof *sh);
}

static void test_futex_timeout(void **state)
{
    _Atomic uint32_t word = 5;
    uint64_t t0 = clock_ns();
    assert_int_equal(futex_wait(&word, 5, 30), 1);
    assert_true(clock_ns() - t0 >= 25ull * 1000000ull);
    assert_int_equal(futex_wait(&word, 6, 1000), 0); /* value differs: returns at once */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_process),
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_futex_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
