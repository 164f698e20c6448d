/* The step-time model against the clock: slidedp-launch --device cpu --gpus 1 trains the tiny
 * example model at three micro-batch x sequence sizes for 40 steps each, with a fresh calibration
 * of this host just before each run; the predicted step time it logs must be within 30% of the
 * median measured step time (the first steps skipped). The machine may be shared: runs are
 * sequential and the calibration is taken under the same conditions as the run. */
#include "tests/testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 40
#define SKIP 5

static char dir[1024];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs one job; returns the predicted step time and the median measured one. */
static void run_size(int mb, int T, double *predicted, double *measured)
{
    char ini[1200], text[2048], *out = NULL;
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n"
             "[data]\ntrain = data/train.bin\nseq_len = %d\n"
             "[train]\nmicro_batch = %d\ngrad_accum = 1\nsteps = %d\nlr = 1e-3\nseed = 1234\n"
             "[checkpoint]\ndir = ckpt-%d-%d\n"
             "[runtime]\ndevice = cpu\ngpus = 1\n"
             "[log]\ndir = log-%d-%d\nevery = 1000\n",
             tu_src("examples/tiny-qwen3"), T, mb, STEPS, mb, T, mb, T);
    snprintf(ini, sizeof ini, "%s/job-%d-%d.ini", dir, mb, T);
    tu_write_file(ini, text);
    int rc = tu_sh(&out, "%s --device cpu --gpus 1 --recalibrate %s 2>&1", tu_bin("slidedp-launch"), ini);
    const char *plan_line = out ? strstr(out, "plan: predicted") : NULL;
    if (plan_line)
        printf("# %.*s\n", (int)(strchr(plan_line, '\n') - plan_line), plan_line);
    if (rc != 0)
        printf("%s", out ? out : "");
    free(out);
    assert_int_equal(rc, 0);

    snprintf(text, sizeof text, "%s/log-%d-%d/metrics.jsonl", dir, mb, T);
    char *metrics = tu_read_file(text, NULL);
    assert_non_null(metrics);
    double step_s[STEPS];
    int n = 0;
    *predicted = 0;
    for (char *line = strtok(metrics, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        cJSON *p = cJSON_GetObjectItem(o, "predicted_step_s"), *s = cJSON_GetObjectItem(o, "step_s");
        assert_non_null(p);
        assert_non_null(s);
        *predicted = p->valuedouble;
        assert_true(n < STEPS);
        step_s[n++] = s->valuedouble;
        cJSON_Delete(o);
    }
    free(metrics);
    assert_int_equal(n, STEPS);
    qsort(step_s + SKIP, STEPS - SKIP, sizeof(double), cmp_double);
    int m = STEPS - SKIP;
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

    static const int sizes[][2] = {{16, 64}, {32, 64}, {8, 256}};
    double pred[3], meas[3];
    for (int i = 0; i < 3; i++)
        run_size(sizes[i][0], sizes[i][1], &pred[i], &meas[i]);
    printf("# micro_batch x seq_len   predicted    measured (median of steps %d-%d)   error\n", SKIP + 1, STEPS);
    for (int i = 0; i < 3; i++)
        printf("# %4d x %-4d           %8.4f s   %8.4f s                           %+5.1f%%\n", sizes[i][0],
               sizes[i][1], pred[i], meas[i], 100.0 * (pred[i] / meas[i] - 1));
    for (int i = 0; i < 3; i++) {
        assert_true(pred[i] > 0 && meas[i] > 0);
        assert_true(fabs(pred[i] / meas[i] - 1) <= 0.30);
    }
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
