/* AdamW: the scalar path against a double-precision transcription of torch.optim.AdamW's update,
 * the vector paths bit-identical to the scalar path, bf16 rounding (ties, NaN), and a sum of
 * squares that does not depend on how the work is split. With bf16 state: the update equals the
 * fp32 one on the widened state, m and v rounded stochastically with the documented draws, the same
 * bits on every ISA and split, and unbiased where round to nearest would freeze v. The cut of an
 * operation's blocks into the segments the optimizer's lanes claim. */
#include "tests/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/rng.h"
#include "optimizer/adamw.h"
#include "optimizer/segments.h"
#include "shm/ctl.h"

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

/* bf16 state, one update on every ISA: returns in out the p, m, v, p16 arrays (floats then three
 * uint16 arrays). */
struct bf16_case {
    float p[N], g[N], po[N];
    uint16_t m[N], v[N], mo[N], vo[N], p16[N];
};

static void bf16_case_fill(struct bf16_case *c, uint64_t *seed)
{
    float tmp[N];
    fill(c->p, N, seed, -1, 1);
    fill(c->g, N, seed, -1, 1);
    fill(tmp, N, seed, -0.1f, 0.1f);
    f32_to_bf16_n(c->m, tmp, N);
    fill(tmp, N, seed, 0, 0.01f);
    f32_to_bf16_n(c->v, tmp, N);
    c->p[5] = NAN;      /* a NaN weight stays NaN in p16 */
    c->g[9] = 1e30f;    /* huge gradient: v overflows to inf, stored as inf */
    c->g[11] = NAN;     /* NaN gradient: m and v become NaN, stored quiet */
}

static const struct adamw_step bf16_step = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                            .weight_decay = 0.01f, .grad_scale = 0.25f, .step = 3,
                                            .round_key = 0x1234567890abcdefull, .round_first = 77};

/* The fp32 update of the widened state gives the same p and p16; the stored m and v are the fp32
 * results plus the documented draw (SplitMix64 stepped from the key, independent of the kernel's
 * direct indexing) truncated, so each lies on one of the two bf16 neighbours. */
static void test_bf16_state_against_fp32(void **state)
{
    uint64_t seed = tu_seed("adamw bf16 state", 11);
    static struct bf16_case c;
    bf16_case_fill(&c, &seed);
    float m32[N], v32[N], p32[N];
    uint16_t p16_32[N];
    bf16_to_f32_n(m32, c.m, N);
    bf16_to_f32_n(v32, c.v, N);
    adamw_update_to(ADAMW_SCALAR, &bf16_step, c.p, m32, v32, c.g, p32, m32, v32, p16_32, N);
    adamw_update_bf16_to(ADAMW_SCALAR, &bf16_step, c.p, c.m, c.v, c.g, c.po, c.mo, c.vo, c.p16, N);
    assert_memory_equal(c.po, p32, sizeof p32);
    assert_memory_equal(c.p16, p16_32, sizeof p16_32);
    uint64_t gen = bf16_step.round_key;
    for (uint64_t k = 0; k < bf16_step.round_first; k++)
        splitmix64(&gen);
    int up = 0;
    for (int i = 0; i < N; i++) {
        uint32_t r = (uint32_t)splitmix64(&gen), mb, vb;
        memcpy(&mb, &m32[i], 4);
        memcpy(&vb, &v32[i], 4);
        if (isnan(m32[i])) {
            assert_int_equal(i, 11);
            assert_true((c.mo[i] & 0x7f80) == 0x7f80 && (c.mo[i] & 0x40) && (c.vo[i] & 0x40));
            continue;
        }
        assert_int_equal(c.mo[i], (uint16_t)((mb + (r & 0xffff)) >> 16));
        assert_int_equal(c.vo[i], (uint16_t)((vb + (r >> 16)) >> 16));
        up += c.mo[i] != (uint16_t)(mb >> 16);
    }
    assert_int_equal(c.vo[9], 0x7f80); /* inf stays inf */
    assert_true((c.p16[5] & 0x7f80) == 0x7f80 && (c.p16[5] & 0x7f));
    printf("# %d of %d m values rounded away from zero\n", up, N);
    assert_true(up > N / 4 && up < 3 * N / 4); /* uniform fraction of an ulp: about half */
}

/* Every ISA, and any split of the array (with round_first following it), gives the same bits. */
static void test_bf16_state_isa_and_split(void **state)
{
    uint64_t seed = tu_seed("adamw bf16 isa", 13);
    static struct bf16_case base, out[3];
    bf16_case_fill(&base, &seed);
    enum adamw_isa best = adamw_isa_detect();
    for (int isa = 0; isa <= (int)best; isa++) {
        out[isa] = base;
        /* in place, as the optimizer may alias: split at an odd point so both pieces have tails */
        struct adamw_step st = bf16_step;
        size_t cut = 517;
        struct bf16_case *o = &out[isa];
        adamw_update_bf16_to((enum adamw_isa)isa, &st, o->p, o->m, o->v, o->g, o->po, o->mo, o->vo, o->p16, cut);
        st.round_first += cut;
        adamw_update_bf16_to((enum adamw_isa)isa, &st, o->p + cut, o->m + cut, o->v + cut, o->g + cut, o->po + cut,
                             o->mo + cut, o->vo + cut, o->p16 + cut, N - cut);
    }
    static struct bf16_case whole;
    whole = base;
    adamw_update_bf16_to(ADAMW_SCALAR, &bf16_step, whole.p, whole.m, whole.v, whole.g, whole.po, whole.mo, whole.vo,
                         whole.p16, N);
    for (int isa = 0; isa <= (int)best; isa++) {
        printf("# %s: bf16 state bit-identical to the scalar path in one piece\n", adamw_isa_name((enum adamw_isa)isa));
        assert_memory_equal(out[isa].po, whole.po, sizeof whole.po);
        assert_memory_equal(out[isa].mo, whole.mo, sizeof whole.mo);
        assert_memory_equal(out[isa].vo, whole.vo, sizeof whole.vo);
        assert_memory_equal(out[isa].p16, whole.p16, sizeof whole.p16);
    }
    /* another key rounds differently */
    struct adamw_step other = bf16_step;
    other.round_key = adamw_round_key(7, 3, 1);
    assert_true(other.round_key != adamw_round_key(7, 3, 2) && other.round_key != adamw_round_key(7, 4, 1) &&
                other.round_key != adamw_round_key(8, 3, 1));
    static struct bf16_case again;
    again = base;
    adamw_update_bf16_to(ADAMW_SCALAR, &other, again.p, again.m, again.v, again.g, again.po, again.mo, again.vo,
                         again.p16, N);
    assert_memory_not_equal(again.mo, whole.mo, sizeof whole.mo);
}

/* Why stochastic rounding: with beta2 = 0.999 and no gradient, v decays by 0.1% a step, less than
 * half a bf16 ulp (0.39%): rounded to nearest it stays 1.0 forever. Rounded stochastically its
 * mean over many elements follows 0.999^s. */
static void test_bf16_state_unbiased(void **state)
{
    enum { M = 1 << 16, STEPS = 50 };
    uint16_t *m = malloc(M * 2), *v = malloc(M * 2), *p16 = malloc(M * 2);
    float *p = calloc(M, 4), *g = calloc(M, 4);
    for (int i = 0; i < M; i++)
        m[i] = 0, v[i] = f32_to_bf16(1.0f);
    struct adamw_step st = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 1.0f};
    for (int s = 1; s <= STEPS; s++) {
        st.step = s;
        st.round_key = adamw_round_key(1234, (uint32_t)s, 0);
        adamw_update_bf16_to(adamw_isa_detect(), &st, p, m, v, g, p, m, v, p16, M);
    }
    double mean = 0;
    for (int i = 0; i < M; i++)
        mean += bf16_to_f32(v[i]);
    mean /= M;
    double exact = pow(0.999, STEPS);
    printf("# v after %d steps of decay: mean %.6f, exact %.6f, round to nearest 1.0\n", STEPS, mean, exact);
    assert_true(fabs(f32_round_bf16(0.999f) - 1.0f) == 0.0f);
    assert_true(fabs(mean - exact) < 2e-4);
    free(m), free(v), free(p16), free(p), free(g);
}

/* The segments cover the blocks in order, shrink as the work left does (never under the minimum but
 * at the end), and balance lanes of unequal speed: simulated claims by lanes of which one runs at
 * half speed finish within 5% (plus one minimum segment) of the ideal, where fixed equal ranges
 * take nearly twice as long. */
static void test_segments_cut(void **state)
{
    (void)state;
    enum { MAX = CTL_MAX_SEGMENTS };
    static const uint32_t blocks[] = {0, 1, 3, 4, 5, 17, 1000, 16384, 95000, 400000};
    static const int lanes[] = {1, 2, 3, 7, 14, 15, 32};
    uint32_t bounds[MAX + 1];
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
        for (size_t li = 0; li < sizeof lanes / sizeof lanes[0]; li++) {
            uint32_t n = blocks[bi];
            int t = lanes[li];
            uint32_t count = segments_cut(n, t, MAX, bounds);
            assert_true(count <= MAX);
            assert_int_equal(bounds[0], 0);
            assert_int_equal(bounds[count], n);
            assert_int_equal(count == 0, n == 0);
            uint32_t share = n / (SEGMENT_SHARES * (uint32_t)t);
            uint32_t first = share < SEGMENT_MIN_BLOCKS ? SEGMENT_MIN_BLOCKS : share;
            if (count)
                assert_int_equal(bounds[1], first < n ? first : n);
            for (uint32_t k = 0; k < count; k++) {
                uint32_t size = bounds[k + 1] - bounds[k];
                assert_true(size >= 1);
                if (k + 1 < count) {
                    assert_true(size >= SEGMENT_MIN_BLOCKS);
                    if (k + 2 < count) /* the last may hold what the cap left */
                        assert_true(bounds[k + 2] - bounds[k + 1] <= size);
                }
            }
            if (t < 2 || n < 1000)
                continue;
            /* lane 0 takes 2 time units a block, the others 1; each free lane claims the next segment */
            double free_at[32] = {0}, makespan = 0;
            for (uint32_t k = 0; k < count; k++) {
                int l = 0;
                for (int i = 1; i < t; i++)
                    l = free_at[i] < free_at[l] ? i : l;
                free_at[l] += (l == 0 ? 2.0 : 1.0) * (bounds[k + 1] - bounds[k]);
                makespan = free_at[l] > makespan ? free_at[l] : makespan;
            }
            double ideal = n / (t - 0.5), fixed = 2.0 * n / t;
            printf("# %u blocks, %d lanes (one at half speed): %u segments, claimed %.0f, ideal %.0f, fixed ranges %.0f\n",
                   n, t, count, makespan, ideal, fixed);
            assert_true(makespan <= 1.05 * ideal + 2 * SEGMENT_MIN_BLOCKS);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_isa_bit_identical),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_sumsq_split_invariant),
        cmocka_unit_test(test_bf16_state_against_fp32),
        cmocka_unit_test(test_bf16_state_isa_and_split),
        cmocka_unit_test(test_bf16_state_unbiased),
        cmocka_unit_test(test_segments_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
