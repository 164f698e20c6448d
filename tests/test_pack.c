/* Best-fit packing (ingest/pack.h, slidedp-data tokenize --pack-fit): a worked example against the
 * hand-computed windows, and on random lengths: every document once, no window over its size,
 * best-ordered keeping input order, and never more windows than greedy packing needs. */
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

#include "ingest/pack.h"

/* Windows greedy packing (in input order, a new window when a document does not fit) needs. */
static int64_t greedy_windows(const int64_t *len, int64_t n, int64_t window)
{
    int64_t windows = 0, used = window;
    for (int64_t i = 0; i < n; i++) {
        if (used + len[i] > window) {
            windows++;
            used = 0;
        }
        used += len[i];
    }
    return windows;
}

static void test_worked_example(void **state)
{
    /* window 8: greedy needs 3 windows: 5 | 4 3 | 3 1 */
    static const int64_t len[] = {5, 4, 3, 3, 1};
    int64_t order[5], window_of[5];
    assert_int_equal(greedy_windows(len, 5, 8), 3);
    /* best-ordered: 5 -> new (room 3); 4 -> new (room 4); 3 -> the room of 3; 3 -> the room of 4;
     * 1 -> what is left of it */
    assert_int_equal(pack_best_fit(len, 5, 8, false, order, window_of), 2);
    static const int64_t want_order[] = {0, 2, 1, 3, 4}, want_window[] = {0, 0, 1, 1, 1};
    assert_memory_equal(order, want_order, sizeof order);
    assert_memory_equal(window_of, want_window, sizeof window_of);
    /* best-fit decreasing: the same here, taken longest first */
    assert_int_equal(pack_best_fit(len, 5, 8, true, order, window_of), 2);
    static const int64_t want_dec[] = {0, 2, 1, 3, 4};
    assert_memory_equal(order, want_dec, sizeof order);
    /* a length out of range is refused */
    static const int64_t bad[] = {3, 9};
    assert_int_equal(pack_best_fit(bad, 2, 8, false, order, window_of), -1);
}

static void test_random_lengths(void **state)
{
    uint64_t seed = tu_seed("pack_random", 30);
    for (int trial = 0; trial < 40; trial++) {
        int64_t window = trial % 2 ? 128 : 4096, n = 1 + (int64_t)(tu_uniform(&seed) * 3000);
        int64_t *len = malloc((size_t)n * sizeof *len), *order = malloc((size_t)n * sizeof *order);
        int64_t *window_of = malloc((size_t)n * sizeof *window_of), *fill = calloc((size_t)n, sizeof *fill);
        uint8_t *seen = malloc((size_t)n);
        for (int64_t i = 0; i < n; i++) /* mostly short, some up to the whole window */
            len[i] = tu_uniform(&seed) < 0.9f ? 1 + (int64_t)(tu_uniform(&seed) * (float)(window / 8))
                                              : 1 + (int64_t)(tu_uniform(&seed) * (float)(window - 1));
        int64_t greedy = greedy_windows(len, n, window);
        for (int dec = 0; dec < 2; dec++) {
            int64_t nw = pack_best_fit(len, n, window, dec, order, window_of);
            assert_true(nw >= 1 && nw <= greedy);
            memset(seen, 0, (size_t)n);
            memset(fill, 0, (size_t)n * sizeof *fill);
            for (int64_t k = 0; k < n; k++) {
                assert_false(seen[order[k]]);
                seen[order[k]] = 1;
                assert_true(window_of[k] >= 0 && window_of[k] < nw);
                assert_true(k == 0 || window_of[k] == window_of[k - 1] || window_of[k] == window_of[k - 1] + 1);
                fill[window_of[k]] += len[order[k]];
                assert_true(fill[window_of[k]] <= window);
                /* best-ordered: documents in input order inside a window, windows by first document */
                if (!dec && k > 0)
                    assert_true(window_of[k] == window_of[k - 1] ? order[k] > order[k - 1] : 1);
            }
            if (!dec)
                for (int64_t k = 1, prev_first = order[0]; k < n; k++)
                    if (window_of[k] != window_of[k - 1]) {
                        assert_true(order[k] > prev_first);
                        prev_first = order[k];
                    }
            if (trial == 0)
                printf("# %lld documents, window %lld: greedy %lld windows, best-fit%s %lld\n", (long long)n,
                       (long long)window, (long long)greedy, dec ? " decreasing" : " in order", (long long)nw);
        }
        free(len), free(order), free(window_of), free(fill), free(seen);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_random_lengths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
