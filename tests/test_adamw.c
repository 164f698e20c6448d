/* AdamW: the scalar path against a double-precision transcription of torch.optim.AdamW's update,
 * the vector paths bit-identical to the scalar path, bf16 rounding (ties, NaN), and a sum of
 * squares that does not depend on how the work is split. */
#include "tests/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "optimizer/adamw.h"

#define N 1003 /* odd, so every vector path runs its scalar tail */

static void fill(float *x, size_t n, uint64_t *s, float lo, float hi)
{
    tu_fill_uniform(x, n, s, lo, hi);
}

/* torch.optim.AdamW for one element, in double. */
static void reference(const struct adamw_step *st, double *p, double *m, double *v, double g)
{
    g *= st->grad_scale;
    *p *= 1.0 - (double)st->lr * st->weight_decay;
    *m = st->beta1 * *m + (1.0 - st->beta1) * g;
    *v = st->beta2 * *v + (1.0 - st->beta2) * g * g;
    double bc1 = 1.0 - pow(st->beta1, st->step), bc2 = 1.0 - pow(st->beta2, st->step);
    *p -= (double)st->lr / bc1 * *m / (sqrt(*v) / sqrt(bc2) + st->eps);
}

static void test_against_reference(void **state)
{
    uint64_t seed = tu_seed("adamw reference", 42);
    float *p = malloc(N * 4), *m = malloc(N * 4), *v = malloc(N * 4), *g = malloc(N * 4);
    uint16_t *p16 = malloc(N * 2);
    double *rp = malloc(N * 8), *rm = malloc(N * 8), *rv = malloc(N * 8);
    fill(p, N, &seed, -1, 1);
    float *p0 = malloc(N * 4);
    memcpy(p0, p, N * 4);
    memset(m, 0, N * 4);
    memset(v, 0, N * 4);
    for (int i = 0; i < N; i++) {
        rp[i] = p[i];
        rm[i] = rv[i] = 0;
    }
    struct adamw_step st = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .grad_scale = 0.5f};
    for (int step = 1; step <= 5; step++) {
        fill(g, N, &seed, -2, 2);
        st.step = step;
        adamw_update(ADAMW_SCALAR, &st, p, m, v, g, p16, N);
        for (int i = 0; i < N; i++)
            reference(&st, &rp[i], &rm[i], &rv[i], g[i]);
    }
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double err = fabs(p[i] - rp[i]) / (fabs(rp[i]) + 1e-3);
        worst = err > worst ? err : worst;
        assert_int_equal(p16[i], f32_to_bf16(p[i]));
    }
    printf("# worst relative error vs double reference after 5 steps: %.2e\n", worst);
    assert_true(worst < 2e-6);
    /* Adam moves each weight by about lr per step: the test is not comparing two idle arrays */
    double moved = 0;
    for (int i = 0; i < N; i++)
        moved += fabs(p[i] - p0[i]);
    moved /= N;
    printf("# mean movement %.2e over 5 steps of lr 1e-3\n", moved);
    assert_true(moved > 1e-3 && moved < 6e-3);
    free(p0), free(p), free(m), free(v), free(g), free(p16), free(rp), free(rm), free(rv);
}

static void test_isa_bit_identical(void **state)
{
    enum adamw_isa best = adamw_isa_detect();
    printf("# best ISA on this machine: %s\n", adamw_isa_name(best));
    uint64_t seed = tu_seed("adamw isa", 7);
    float *base[4], *out[3][3];
    uint16_t *p16[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 4; k++) {
        base[k] = malloc(N * 4);
        fill(base[k], N, &seed, k == 2 ? 0 : -1, 1);
    }
    base[0][5] = NAN;      /* a NaN weight must stay NaN, quietly */
    base[3][9] = 1e30f;    /* huge gradient */
    for (int isa = 0; isa <= (int)best; isa++) {
        for (int k = 0; k < 3; k++) {
            out[isa][k] = malloc(N * 4);
            memcpy(out[isa][k], base[k], N * 4);
        }
        p16[isa] = malloc(N * 2);
        struct adamw_step st = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                                .grad_scale = 0.25f, .step = 3};
        adamw_update((enum adamw_isa)isa, &st, out[isa][0], out[isa][1], out[isa][2], base[3], p16[isa], N);
    }
    for (int isa = 1; isa <= (int)best; isa++) {
        for (int k = 0; k < 3; k++)
            assert_memory_equal(out[isa][k], out[0][k], N * 4);
        assert_memory_equal(p16[isa], p16[0], N * 2);
    }
    assert_true((p16[0][5] & 0x7f80) == 0x7f80 && (p16[0][5] & 0x7f) != 0);
}

static void test_bf16_rounding(void **state)
{
    /* 1 + 2^-8 is a tie between 1 and 1+2^-7: rounds to even (1) */
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    /* 1 + 3*2^-8 is a tie between 1+2^-7 (odd) and 1+2^-6: rounds up to even */
    assert_int_equal(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(f32_to_bf16(3.4028235e38f), 0x7f80); /* max float rounds to inf */
    uint16_t nan = f32_to_bf16(NAN);
    assert_true((nan & 0x7f80) == 0x7f80 && (nan & 0x7f));
}

static void test_sumsq_split_invariant(void **state)
{
    uint64_t seed = tu_seed("sumsq", 3);
    size_t n = 3 * 4096 + 77;
    float *x = malloc(n * 4);
    fill(x, n, &seed, -3, 3);
    double whole = sumsq_f32(ADAMW_SCALAR, x, n);
    double parts = sumsq_f32(ADAMW_SCALAR, x, 4096) + sumsq_f32(ADAMW_SCALAR, x + 4096, 8192);
    parts += sumsq_f32(ADAMW_SCALAR, x + 12288, n - 12288);
    double exact = 0;
    for (size_t i = 0; i < n; i++)
        exact += (double)x[i] * x[i];
    assert_true(whole == parts);
    assert_true(fabs(whole - exact) / exact < 1e-12);
    /* the vector paths give the scalar path's bits, for every length's tail; and on a block where
     * another order of the additions rounds differently: 2^54 in lane 0 absorbs each later 1 alone
     * (its ulp is 4), but 1 + 1 + 1 added first would not be absorbed */
    float order[64] = {0x1p27f, 1, 1, 1, 1, 1, 1, 1};
    order[8] = order[16] = order[24] = 1;
    assert_true(sumsq_f32(ADAMW_SCALAR, order, 64) == 0x1p54);
    for (int isa = 1; isa <= (int)adamw_isa_detect(); isa++) {
        for (size_t len = n - 9; len <= n; len++)
            assert_true(sumsq_f32((enum adamw_isa)isa, x, len) == sumsq_f32(ADAMW_SCALAR, x, len));
        assert_true(sumsq_f32((enum adamw_isa)isa, order, 64) == 0x1p54);
    }
    float *acc = malloc(n * 4);
    grad_accumulate(acc, x, n, 1);
    grad_accumulate(acc, x, n, 0);
    for (size_t i = 0; i < n; i++)
        assert_true(acc[i] == x[i] + x[i]);
    free(x);
    free(acc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_isa_bit_identical),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_sumsq_split_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
