/* 8-bit optimizer state ([train] optimizer_state = 8bit): the quantiser against a reference written
 * here from the documented code (values by ldexp, the rounding by a scan of the code table): round
 * trip, block edges, zeros, fp32 denormals, huge and non-finite values; the update equals the fp32
 * update of the decoded state with its results quantised by the documented draws; every ISA and any
 * split at block starts give the same bits; and the stochastic rounding keeps v's decay unbiased. */
#include "tests/testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/rng.h"
#include "optimizer/adamw.h"

/* ---- the reference ---- */

static int ref_mbits(enum state8_kind kind)
{
    return kind == STATE8_M ? 3 : 4;
}

static int ref_most(enum state8_kind kind)
{
    return kind == STATE8_M ? 127 : 255;
}

/* The scale as stored: the biased fp32 exponent one above the block's largest magnitude, in 15..255. */
static int ref_scale(const float *x, size_t n)
{
    double most = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isinf(x[i]))
            return 255;
        most = fmax(most, fabs((double)x[i]));
    }
    if (most < 0x1p-126) /* zero or an fp32 denormal: biased exponent 0 */
        return 15;
    int e;
    frexp(most, &e); /* most = f * 2^e, f in [0.5, 1): biased exponent e + 126 */
    return e + 127 < 15 ? 15 : e + 127 > 255 ? 255 : e + 127;
}

/* The magnitude a code's bits (sign cleared) stand for under scale t. */
static double ref_magnitude(enum state8_kind kind, int mag, int t)
{
    int mb = ref_mbits(kind), ce = mag >> mb, f = mag & ((1 << mb) - 1);
    if (t < 15)
        t = 15;
    if (ce == 0)
        return ldexp(f, t - 14 - 127 - mb);
    return ldexp(1.0 + (double)f / (1 << mb), ce + t - 15 - 127);
}

static double ref_value(enum state8_kind kind, uint8_t code, int t)
{
    if (kind == STATE8_V_ROOT)
        return ref_magnitude(kind, code, t);
    double mag = ref_magnitude(kind, code & 0x7f, t);
    return code & 0x80 ? -mag : mag;
}

/* x's code under scale t with the 16 random bits r: below x's lower neighbour in the table, up to
 * the next one when the fraction of the step (in 2^-16) plus r reaches 2^16. A value under the lowest
 * normal binade, 2^(t-141), is rounded as its fp32 sum with 2^(t-141) is, less the 2^M codes below
 * that binade (the sum's rounding to fp32 is part of the code's definition); a non-zero sqrt(v)
 * gives 1 at least. A non-finite value puts its block at scale 255, where the top binade's codes
 * decode as fp32 would: inf to the code of 2^128 (inf), the quiet NaN to the one with the quiet bit. */
static uint8_t ref_code(enum state8_kind kind, float x, int t, uint16_t r)
{
    int mb = ref_mbits(kind), most = ref_most(kind), sign = kind == STATE8_M && signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (isinf(x))
        return (uint8_t)(15 << mb | sign);
    if (isnan(x))
        return (uint8_t)(15 << mb | 1 << (mb - 1) | sign);
    float lowest = (float)ldexp(1.0, (t < 15 ? 15 : t) - 141);
    int below = a < lowest ? 1 << mb : 0;
    if (below)
        a = (double)(fabsf(x) + lowest); /* in fp32 */
    int lo = 0;
    while (lo < most && ref_magnitude(kind, lo + 1, t) <= a)
        lo++;
    double vlo = ref_magnitude(kind, lo, t), vhi = ref_magnitude(kind, lo + 1, t);
    double fraction = floor((a - vlo) / (vhi - vlo) * 65536.0);
    int code = lo + (fraction + r >= 65536.0) - below;
    if (kind == STATE8_V_ROOT && code == 0 && x != 0)
        code = 1;
    return (uint8_t)(code | sign);
}

/* Quantises x[0..n) block by block with state8_quantize and checks every block's scale and codes
 * against the reference. Returns how many codes rounded up past x's lower neighbour. */
static int check_against_reference(enum state8_kind kind, const float *x, size_t n, const uint16_t *r)
{
    int ups = 0;
    for (size_t b = 0; b < n; b += STATE8_BLOCK) {
        size_t k = n - b < STATE8_BLOCK ? n - b : STATE8_BLOCK;
        uint8_t codes[STATE8_BLOCK];
        uint8_t scale = state8_quantize(kind, x + b, k, r + b, codes);
        int t = ref_scale(x + b, k);
        if (scale != t)
            fail_msg("kind %d block at %zu: scale %d, reference %d", kind, b, scale, t);
        for (size_t i = 0; i < k; i++) {
            uint8_t want = ref_code(kind, x[b + i], t, r[b + i]);
            if (codes[i] != want)
                fail_msg("kind %d element %zu (%a, r %u, scale %d): code %#x, reference %#x", kind, b + i, x[b + i],
                         r[b + i], t, codes[i], want);
            if (!isnan(x[b + i]) && fabs(ref_value(kind, codes[i], t)) > fabs((double)x[b + i]))
                ups++;
            /* the value a code stands for, exactly */
            float v = state8_value(kind, codes[i], scale), rv = (float)ref_value(kind, codes[i], t);
            if (isnan(x[b + i]) ? !isnan(v) : v != rv)
                fail_msg("kind %d code %#x scale %d: value %a, reference %a", kind, codes[i], scale, v, rv);
        }
    }
    return ups;
}

/* ---- the quantiser ---- */

static void test_round_trip(void **state)
{
    uint64_t seed = tu_seed("state8 round trip", 21);
    for (int kind = STATE8_M; kind <= STATE8_V_ROOT; kind++) {
        static const int scales[] = {15, 16, 60, 127, 128, 200, 254};
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            int t = scales[s];
            /* element 0 fixes the block's scale at t; the others are every code's value */
            for (int c = 0; c < 256; c++) {
                int mag = kind == STATE8_M ? c & 0x7f : c;
                if (mag >> ref_mbits((enum state8_kind)kind) == 15) /* the binade above the scale's */
                    continue;
                float x[2] = {(float)ldexp(1.0, t - 128), (float)ref_value((enum state8_kind)kind, (uint8_t)c, t)};
                uint16_t r[2] = {(uint16_t)splitmix64(&seed), (uint16_t)splitmix64(&seed)};
                uint8_t codes[2];
                assert_int_equal(state8_quantize((enum state8_kind)kind, x, 2, r, codes), t);
                if (codes[1] != c)
                    fail_msg("kind %d scale %d: code %#x's value %a came back as %#x", kind, t, c, x[1], codes[1]);
            }
        }
    }
}

static void test_against_reference_random(void **state)
{
    uint64_t seed = tu_seed("state8 reference", 23);
    enum { N = 64 * 40 + 37 }; /* a partial last block */
    static float x[N];
    static uint16_t r[N];
    for (int i = 0; i < N; i++) {
        /* log-uniform magnitudes over 40 binades, random signs, each block its own scale */
        double u = (double)(splitmix64(&seed) >> 11) / 0x1p53;
        int block = i / STATE8_BLOCK;
        x[i] = (float)((splitmix64(&seed) & 1 ? -1 : 1) * ldexp(1.0 + u, (int)(splitmix64(&seed) % 40) - 20 + block - 20));
        r[i] = (uint16_t)splitmix64(&seed);
    }
    int ups_m = check_against_reference(STATE8_M, x, N, r);
    for (int i = 0; i < N; i++)
        x[i] = fabsf(x[i]);
    int ups_v = check_against_reference(STATE8_V_ROOT, x, N, r);
    printf("# %d elements in %d blocks: %d m and %d sqrt(v) codes rounded up\n", N, (N + 63) / 64, ups_m, ups_v);
    assert_true(ups_m > N / 5 && ups_v > N / 5); /* stochastic: a fair share goes up */
}

/* Zeros, fp32 denormals, the largest floats, inf and NaN, and a block edge between a huge and a
 * tiny block. */
static void test_special_values(void **state)
{
    uint64_t seed = tu_seed("state8 special", 25);
    enum { N = 3 * 64 + 5 };
    float x[N];
    uint16_t r[N];
    for (int i = 0; i < N; i++)
        r[i] = (uint16_t)splitmix64(&seed);
    for (int i = 0; i < 64; i++) /* block 0: zeros and denormals (alone: the smallest scale) */
        x[i] = i % 3 == 0 ? 0.0f : i % 3 == 1 ? ldexpf(1.0f + i / 64.0f, -140 - i % 9) : -FLT_TRUE_MIN * (float)i;
    for (int i = 64; i < 128; i++) /* block 1: the largest floats next to tiny ones */
        x[i] = i % 2 ? FLT_MAX / (float)(i - 63) : 1e-30f * (float)i;
    for (int i = 128; i < N; i++) /* block 2 and the partial block 3: inf, NaN, and ordinary values */
        x[i] = i == 130 ? INFINITY : i == 131 ? -INFINITY : i == 190 ? NAN : (float)(i - 150) * 0.01f;
    x[N - 1] = -0.0f;
    check_against_reference(STATE8_M, x, N, r);
    float a[N];
    for (int i = 0; i < N; i++)
        a[i] = fabsf(x[i]);
    check_against_reference(STATE8_V_ROOT, a, N, r);
    /* all zeros: scale 15, every code 0, value 0 */
    float zeros[64] = {0};
    uint8_t codes[64];
    assert_int_equal(state8_quantize(STATE8_V_ROOT, zeros, 64, r, codes), 15);
    for (int i = 0; i < 64; i++)
        assert_true(codes[i] == 0 && state8_value(STATE8_V_ROOT, codes[i], 15) == 0.0f);
    /* fresh state is zero-filled: scale 0 reads as 15 */
    assert_true(state8_value(STATE8_M, 0, 0) == 0.0f && state8_value(STATE8_V_ROOT, 0x11, 0) == ldexpf(1.0625f, -126));
}

/* ---- the update ---- */

#define N 1000 /* blocks of 64 and a partial one of 40 */

struct case8 {
    float p[N], g[N], po[N];
    uint8_t m[N], v[N], ms[N / 64 + 1], vs[N / 64 + 1];
    uint8_t mo[N], vo[N], mso[N / 64 + 1], vso[N / 64 + 1];
    uint16_t p16[N];
};

static struct state8 in_of(struct case8 *c, size_t at)
{
    return (struct state8){c->m + at, c->v + at, c->ms + at / 64, c->vs + at / 64};
}

static struct state8 out_of(struct case8 *c, size_t at)
{
    return (struct state8){c->mo + at, c->vo + at, c->mso + at / 64, c->vso + at / 64};
}

static void case_fill(struct case8 *c, uint64_t *seed)
{
    float m[N], s[N];
    uint16_t r[N];
    tu_fill_uniform(c->p, N, seed, -1, 1);
    tu_fill_uniform(c->g, N, seed, -1, 1);
    tu_fill_uniform(m, N, seed, -0.1f, 0.1f);
    tu_fill_uniform(s, N, seed, 0, 0.1f);
    for (int i = 0; i < N; i++)
        r[i] = (uint16_t)splitmix64(seed);
    for (int i = 128; i < 192; i++) /* a block of zero state and gradient, as fresh state has */
        m[i] = s[i] = c->g[i] = 0;
    for (int i = 200; i < 256; i++) /* a block of small gradients beside large ones */
        c->g[i] *= 1e-20f;
    for (int i = 320; i < 448; i++) /* zero weights: p is the step alone, to its last bit */
        c->p[i] = 0;
    c->p[5] = NAN;    /* a NaN weight stays NaN */
    c->g[9] = 1e30f;  /* huge gradient: v overflows */
    c->g[300] = NAN;  /* NaN gradient */
    for (size_t b = 0; b < N; b += 64) {
        size_t k = N - b < 64 ? N - b : 64;
        c->ms[b / 64] = state8_quantize(STATE8_M, m + b, k, r + b, c->m + b);
        c->vs[b / 64] = state8_quantize(STATE8_V_ROOT, s + b, k, r + b, c->v + b);
    }
}

/* The documented rounding bits (optimizer/adamw.h): 32-bit word i mod 4 of four AES rounds of the block
 * (i / 4, key), written here from FIPS-197: the S-box as the inverse in GF(2^8) followed by the
 * affine map, ShiftRows, MixColumns by xtime, each round ending with its round key (the pi digits
 * 0x243f6a8885a308d3 and 0x13198a2e03707344 in both halves, alternating); bytes little-endian. */
static uint8_t ref_gmul(uint8_t a, uint8_t b)
{
    uint8_t product = 0;
    for (; b; b >>= 1, a = (uint8_t)(a << 1 ^ (a & 0x80 ? 0x1b : 0)))
        if (b & 1)
            product ^= a;
    return product;
}

static uint8_t ref_sbox(uint8_t a)
{
    uint8_t inverse = 0;
    for (int b = 1; b < 256 && a; b++)
        if (ref_gmul(a, (uint8_t)b) == 1)
            inverse = (uint8_t)b;
    uint8_t out = 0x63;
    for (int shift = 0; shift < 5; shift++) /* b ^ rotl(b, 1) ^ rotl(b, 2) ^ rotl(b, 3) ^ rotl(b, 4) ^ 0x63 */
        out ^= (uint8_t)(inverse << shift | inverse >> ((8 - shift) & 7));
    return out;
}

static uint32_t ref_draw(uint64_t key, uint64_t i)
{
    static uint8_t sbox[256];
    static int ready;
    if (!ready) {
        for (int a = 0; a < 256; a++)
            sbox[a] = ref_sbox((uint8_t)a);
        ready = 1;
    }
    uint8_t st[4][4]; /* st[column][row]: byte 4 * column + row of the block */
    for (int k = 0; k < 16; k++)
        st[k / 4][k % 4] = (uint8_t)((k < 8 ? i / 4 : key) >> (8 * (k % 8)));
    const uint64_t round_keys[2] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull};
    for (int round = 0; round < 4; round++) {
        uint8_t shifted[4][4];
        for (int col = 0; col < 4; col++)
            for (int row = 0; row < 4; row++) /* SubBytes, then row r moves r columns left */
                shifted[col][row] = sbox[st[(col + row) % 4][row]];
        for (int col = 0; col < 4; col++)
            for (int row = 0; row < 4; row++) {
                const uint8_t *a = shifted[col];
                uint8_t mixed = ref_gmul(2, a[row]) ^ ref_gmul(3, a[(row + 1) % 4]) ^ a[(row + 2) % 4] ^ a[(row + 3) % 4];
                int k = 4 * col + row;
                st[col][row] = mixed ^ (uint8_t)(round_keys[round % 2] >> (8 * (k % 8)));
            }
    }
    int w = (int)(i % 4);
    return (uint32_t)st[w][0] | (uint32_t)st[w][1] << 8 | (uint32_t)st[w][2] << 16 | (uint32_t)st[w][3] << 24;
}

static const struct adamw_step step8 = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                        .weight_decay = 0.01f, .grad_scale = 0.25f, .step = 3,
                                        .round_key = 0x1234567890abcdefull, .round_first = 8192};

/* The fp32 update of the decoded state gives the same m and v, and p as the 8-bit update defines it
 * (sqrt(v) times 1/sqrt(1 - beta2^step), where the fp32 update divides; docs/design.md §9.6),
 * computed here element by element; the stored state is the reference quantisation of m and
 * sqrt(v) with the documented draws (ref_draw). */
static void test_update_against_fp32(void **state)
{
    uint64_t seed = tu_seed("state8 update", 27);
    static struct case8 c;
    case_fill(&c, &seed);
    float m32[N], v32[N], p32[N], s32[N];
    uint16_t p16_32[N], rm[N], rv[N];
    for (int i = 0; i < N; i++) {
        m32[i] = (float)ref_value(STATE8_M, c.m[i], c.ms[i / 64]);
        float s = (float)ref_value(STATE8_V_ROOT, c.v[i], c.vs[i / 64]);
        v32[i] = s * s;
    }
    adamw_update_to(ADAMW_SCALAR, &step8, c.p, m32, v32, c.g, p32, m32, v32, p16_32, N);
    double bc1 = 1 - pow(step8.beta1, step8.step), bc2 = 1 - pow(step8.beta2, step8.step);
    float decay = (float)(1 - (double)step8.lr * step8.weight_decay), rsqrt_bc2 = (float)(1 / sqrt(bc2));
    float neg_step = (float)(-(double)step8.lr / bc1);
    int divided_differs = 0; /* elements where the fp32 update's division gives another p */
    for (int i = 0; i < N; i++) {
        float p = c.p[i] * decay + neg_step * (m32[i] / (sqrtf(v32[i]) * rsqrt_bc2 + step8.eps));
        divided_differs += memcmp(&p, &p32[i], sizeof p) != 0;
        p32[i] = p;
        p16_32[i] = f32_to_bf16(p);
    }
    printf("# p differs from the fp32 update's (which divides by sqrt(1 - beta2^step)) in %d of %d elements\n",
           divided_differs, N);
    assert_true(divided_differs > 0); /* the zero weights tell the two apart */
    adamw_update_8bit_to(ADAMW_SCALAR, &step8, c.p, in_of(&c, 0), c.g, c.po, out_of(&c, 0), c.p16, N);
    assert_memory_equal(c.po, p32, sizeof p32);
    assert_memory_equal(c.p16, p16_32, sizeof p16_32);
    for (int i = 0; i < N; i++) {
        uint32_t d = ref_draw(step8.round_key, step8.round_first + (uint64_t)i);
        rm[i] = (uint16_t)d, rv[i] = (uint16_t)(d >> 16);
        s32[i] = sqrtf(v32[i]);
    }
    for (size_t b = 0; b < N; b += 64) {
        size_t k = N - b < 64 ? N - b : 64;
        assert_int_equal(c.mso[b / 64], ref_scale(m32 + b, k));
        assert_int_equal(c.vso[b / 64], ref_scale(s32 + b, k));
        for (size_t i = b; i < b + k; i++) {
            assert_int_equal(c.mo[i], ref_code(STATE8_M, m32[i], c.mso[b / 64], rm[i]));
            assert_int_equal(c.vo[i], ref_code(STATE8_V_ROOT, s32[i], c.vso[b / 64], rv[i]));
        }
    }
    assert_true((c.p16[5] & 0x7f80) == 0x7f80 && (c.p16[5] & 0x7f));
    for (int i = 128; i < 192; i++) /* zero state and gradient stay zero */
        assert_true(c.mo[i] == 0 && c.vo[i] == 0);
}

/* Every ISA, in one piece and split at a block start (round_first following), gives the scalar
 * path's bits; another key rounds differently. */
static void test_isa_and_split(void **state)
{
    uint64_t seed = tu_seed("state8 isa", 29);
    static struct case8 base, out[3], whole;
    case_fill(&base, &seed);
    whole = base;
    adamw_update_8bit_to(ADAMW_SCALAR, &step8, whole.p, in_of(&whole, 0), whole.g, whole.po, out_of(&whole, 0),
                         whole.p16, N);
    enum adamw_isa best = adamw_isa_detect();
    for (int isa = 0; isa <= (int)best; isa++) {
        /* the AVX-512 path takes blocks four at a time, then one at a time: 576 is 2 groups and a
         * block (then a group, 2 blocks and the partial one), 128 two blocks and no group */
        static const size_t cuts[] = {N, 576, 128};
        for (int split = 0; split < 3; split++) {
            struct case8 *o = &out[isa];
            *o = base;
            size_t cut = cuts[split];
            struct adamw_step st = step8;
            adamw_update_8bit_to((enum adamw_isa)isa, &st, o->p, in_of(o, 0), o->g, o->po, out_of(o, 0), o->p16, cut);
            st.round_first += cut;
            if (cut < N)
                adamw_update_8bit_to((enum adamw_isa)isa, &st, o->p + cut, in_of(o, cut), o->g + cut, o->po + cut,
                                     out_of(o, cut), o->p16 + cut, N - cut);
            printf("# %s (runs %s), pieces split at element %zu: 8-bit state bit-identical to the scalar path in one "
                   "piece\n", adamw_isa_name((enum adamw_isa)isa), adamw_isa_name(adamw_isa_8bit((enum adamw_isa)isa)),
                   cut);
            assert_memory_equal(o->po, whole.po, sizeof whole.po);
            assert_memory_equal(o->p16, whole.p16, sizeof whole.p16);
            assert_memory_equal(o->mo, whole.mo, sizeof whole.mo);
            assert_memory_equal(o->vo, whole.vo, sizeof whole.vo);
            assert_memory_equal(o->mso, whole.mso, sizeof whole.mso);
            assert_memory_equal(o->vso, whole.vso, sizeof whole.vso);
        }
    }
    /* in place (the optimizer reads the state it replaces only through staging, but the bench
     * updates in place) */
    static struct case8 inplace;
    inplace = base;
    adamw_update_8bit_to(best, &step8, inplace.p, in_of(&inplace, 0), inplace.g, inplace.p, in_of(&inplace, 0),
                         inplace.p16, N);
    assert_memory_equal(inplace.m, whole.mo, sizeof whole.mo);
    assert_memory_equal(inplace.p, whole.po, sizeof whole.po);
    struct adamw_step other = step8;
    other.round_key = adamw_round_key(7, 3, 1);
    static struct case8 again;
    again = base;
    adamw_update_8bit_to(ADAMW_SCALAR, &other, again.p, in_of(&again, 0), again.g, again.po, out_of(&again, 0),
                         again.p16, N);
    assert_memory_not_equal(again.mo, whole.mo, sizeof whole.mo);
}

/* Without a bf16 copy (p16 NULL, as when the workers stream the master) every ISA gives the same
 * p and state as with it, and touches no copy. */
static void test_without_bf16_copy(void **state)
{
    uint64_t seed = tu_seed("state8 no copy", 31);
    static struct case8 base, with, without;
    case_fill(&base, &seed);
    for (int isa = 0; isa <= (int)adamw_isa_detect(); isa++) {
        with = without = base;
        adamw_update_8bit_to((enum adamw_isa)isa, &step8, with.p, in_of(&with, 0), with.g, with.po, out_of(&with, 0),
                             with.p16, N);
        memset(without.p16, 0xa5, sizeof without.p16);
        adamw_update_8bit_to((enum adamw_isa)isa, &step8, without.p, in_of(&without, 0), without.g, without.po,
                             out_of(&without, 0), NULL, N);
        printf("# %s (runs %s): 8-bit update without the bf16 copy gives the same p and state\n",
               adamw_isa_name((enum adamw_isa)isa), adamw_isa_name(adamw_isa_8bit((enum adamw_isa)isa)));
        assert_memory_equal(without.po, with.po, sizeof with.po);
        assert_memory_equal(without.mo, with.mo, sizeof with.mo);
        assert_memory_equal(without.vo, with.vo, sizeof with.vo);
        assert_memory_equal(without.mso, with.mso, sizeof with.mso);
        assert_memory_equal(without.vso, with.vso, sizeof with.vso);
        for (int i = 0; i < N; i++)
            assert_int_equal(without.p16[i], 0xa5a5);
    }
}

/* With beta2 = 0.999 and no gradient, sqrt(v) shrinks by 0.05% a step, far under half a step of
 * its code (1.6% to 3.1%): rounded to nearest it would never move. Rounded stochastically, v's mean
 * over many elements follows 0.999^s; m's decay by 0.9 too. */
static void test_unbiased_decay(void **state)
{
    enum { M = 1 << 16, STEPS = 50 };
    uint8_t *m = calloc(M, 1), *v = malloc(M), *ms = calloc(M / 64, 1), *vs = malloc(M / 64);
    float *p = calloc(M, 4), *g = calloc(M, 4);
    uint16_t *p16 = malloc(M * 2), r[64] = {0};
    float one[64];
    for (int i = 0; i < 64; i++)
        one[i] = 1.0f;
    for (int b = 0; b < M / 64; b++)
        vs[b] = state8_quantize(STATE8_V_ROOT, one, 64, r, v + b * 64);
    struct adamw_step st = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 1.0f};
    struct state8 s8 = {m, v, ms, vs};
    for (int s = 1; s <= STEPS; s++) {
        st.step = s;
        st.round_key = adamw_round_key(1234, (uint32_t)s, 0);
        adamw_update_8bit_to(adamw_isa_detect(), &st, p, s8, g, p, s8, p16, M);
    }
    double mean = 0;
    for (int i = 0; i < M; i++) {
        double x = state8_value(STATE8_V_ROOT, v[i], vs[i / 64]);
        mean += x * x;
    }
    mean /= M;
    double exact = pow(0.999, STEPS);
    printf("# v after %d steps of decay: mean %.6f, exact %.6f, round to nearest 1.0\n", STEPS, mean, exact);
    assert_true(fabs(mean - exact) < 2e-3);
    free(m), free(v), free(ms), free(vs), free(p), free(g), free(p16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_against_reference_random),
        cmocka_unit_test(test_special_values),
        cmocka_unit_test(test_update_against_fp32),
        cmocka_unit_test(test_isa_and_split),
        cmocka_unit_test(test_without_bf16_copy),
        cmocka_unit_test(test_unbiased_decay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
