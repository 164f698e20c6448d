/* The step-time model against the clock: slidedp-launch --device cpu --gpus 1 trains the tiny
 * example model at three micro-batch x sequence sizes, each run with a fresh calibration of this
 * host just before it, and logs its predicted step time. The machine may be shared: runs are
 * sequential and the calibration is taken under the same conditions as the run. A shared or
 * virtual machine also changes speed by 10-25% from one few-second stretch to the next (exp-heavy
 * code most: attention and SwiGLU), which moves one calibration and the run after it apart by as
 * much; so each size runs in three rounds, spread over the test (sizes A B C A B C A B C), and the
 * mean of its rounds' predicted step times must be within 30% of the mean of their median measured
 * step times (the first steps skipped). */
#include "tests/testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEPS 80
#define SKIP 5

static char dir[1024];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs one job; returns the predicted step time and the median measured one. */
static void run_size(int round, int mb, int T, int steps, double *predicted, double *measured)
{
    char ini[1200], text[2048], *out = NULL;
    assert_true(steps > SKIP && steps <= MAX_STEPS);
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n"
             "[data]\ntrain = data/train.bin\nseq_len = %d\n"
             "[train]\nmicro_batch = %d\ngrad_accum = 1\nsteps = %d\nlr = 1e-3\nseed = 1234\n"
             "[checkpoint]\ndir = ckpt-%d-%d-%d\n"
             "[runtime]\ndevice = cpu\ngpus = 1\n"
             "[log]\ndir = log-%d-%d-%d\nevery = 1000\n",
             tu_src("examples/tiny-qwen3"), T, mb, steps, mb, T, round, mb, T, round);
    snprintf(ini, sizeof ini, "%s/job-%d-%d-%d.ini", dir, mb, T, round);
    tu_write_file(ini, text);
    int rc = tu_sh(&out, "%s --device cpu --gpus 1 --recalibrate %s 2>&1", tu_bin("slidedp-launch"), ini);
    const char *plan_line = out ? strstr(out, "plan: predicted") : NULL;
    if (plan_line)
        printf("# %.*s\n", (int)(strchr(plan_line, '\n') - plan_line), plan_line);
    if (rc != 0)
        printf("%s", out ? out : "");
    free(out);
    assert_int_equal(rc, 0);

    snprintf(text, sizeof text, "%s/log-%d-%d-%d/metrics.jsonl", dir, mb, T, round);
    char *metrics = tu_read_file(text, NULL);
    assert_non_null(metrics);
    double step_s[MAX_STEPS];
    int n = 0;
    *predicted = 0;
    for (char *line = strtok(metrics, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        cJSON *p = cJSON_GetObjectItem(o, "predicted_step_s"), *s = cJSON_GetObjectItem(o, "step_s");
        assert_non_null(p);
        assert_non_null(s);
        *predicted = p->valuedouble;
        assert_true(n < steps);
        step_s[n++] = s->valuedouble;
        cJSON_Delete(o);
    }
    free(metrics);
    assert_int_equal(n, steps);
    qsort(step_s + SKIP, (size_t)(steps - SKIP), sizeof(double), cmp_double);
    int m = steps - SKIP;
    *measured = m % 2 ? step_s[SKIP + m / 2] : 0.5 * (step_s[SKIP + m / 2 - 1] + step_s[SKIP + m / 2]);
}

static void test_predicted_vs_measured(void **state)
{
    char *out = NULL;
    assert_int_equal(tu_sh(&out, "%s copy --out %s/data --seq-len 64 --train 3000 --val 8 --seed 1",
                           tu_bin("slidedp-data"), dir),
                     0);
    free(out);
    /* a private calibration cache, measured afresh before each run */
    char cache[1100];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("SLIDEDP_CACHE_DIR", cache, 1);

    /* micro_batch, seq_len, steps: three to five seconds of steps each on the 2-core machine */
    static const int sizes[][3] = {{16, 64, 80}, {32, 64, 40}, {8, 256, 30}};
    enum { ROUNDS = 3 };
    double pred[ROUNDS][3], meas[ROUNDS][3];
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < 3; i++)
            run_size(r, sizes[i][0], sizes[i][1], sizes[i][2], &pred[r][i], &meas[r][i]);
    printf("# micro_batch x seq_len   round   predicted    measured (median of steps %d-)   error\n", SKIP + 1);
    for (int i = 0; i < 3; i++) {
        double p = 0, m = 0;
        for (int r = 0; r < ROUNDS; r++) {
            assert_true(pred[r][i] > 0 && meas[r][i] > 0);
            printf("# %4d x %-4d           %d       %8.4f s   %8.4f s                    %+5.1f%%\n", sizes[i][0],
                   sizes[i][1], r + 1, pred[r][i], meas[r][i], 100.0 * (pred[r][i] / meas[r][i] - 1));
            p += pred[r][i] / ROUNDS;
            m += meas[r][i] / ROUNDS;
        }
        printf("# %4d x %-4d           mean    %8.4f s   %8.4f s                    %+5.1f%%\n", sizes[i][0],
               sizes[i][1], p, m, 100.0 * (p / m - 1));
        assert_true(fabs(p / m - 1) <= 0.30);
    }
    /* the fresh calibration measured the fp32 update in the flavour the planner prices (bf16
     * gradients, no bf16 copy), not the older one */
    char *listing = NULL;
    assert_int_equal(tu_sh(&listing, "cat %s/calib-*.json", cache), 0);
    assert_non_null(strstr(listing, "\"adamw_fp32_rate\""));
    assert_null(strstr(listing, "\"adamw_rate\""));
    free(listing);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "plan-cpu"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predicted_vs_measured),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(dir);
    return rc;
}
