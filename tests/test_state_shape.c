/* The planner's host memory is the launcher's: for several job shapes (fp32 and bf16 optimizer
 * state, two params16 copies, gradients straight into a bf16 accumulator, three ranks exchanging
 * through windows in the grads object, workers streaming the master), the params16, master, grads
 * and ctl bytes slidedp-plan --json prints equal the sizes of the objects slidedp-launch creates in
 * /dev/shm for that job (no params16 object when the plan has none). */
#include "tests/testutil.h"
#include "tests/jobrun.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/ctl.h"
#include "shm/region.h"

static const char *const objects[4] = {"params16", "master", "grads", "ctl"};
/* slidedp-plan --json's host_memory keys for them */
static const char *const plan_keys[4] = {"params16", "master", "grad_slots", "ctl"};

struct shape_case {
    const char *name;
    struct variant v;
    const char *overrides; /* on both command lines: what the shape needs beyond the variant */
    /* the plan slidedp-plan must print, so each case is the shape it claims */
    const char *update_mode;
    bool grads_direct, grads_bf16;
};

static double number_at(const cJSON *o, const char *obj, const char *key)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, obj), key);
    if (!cJSON_IsNumber(n))
        fail_msg("slidedp-plan --json has no %s.%s", obj, key);
    return n->valuedouble;
}

static void check_shape(const struct shape_case *c)
{
    write_job_as(&c->v, c->name, 10, "");
    char ini[1300];
    job_path(c->name, "job.ini", ini, sizeof ini);

    char *out = NULL;
    int rc = tu_sh(&out, "%s --json %s %s", tu_bin("slidedp-plan"), ini, c->overrides);
    if (rc != 0)
        fail_msg("%s: slidedp-plan exited %d: %s", c->name, rc, out);
    cJSON *plan = cJSON_Parse(out);
    if (!plan)
        fail_msg("%s: slidedp-plan --json printed no JSON: %s", c->name, out);
    free(out);
    const cJSON *pj = cJSON_GetObjectItemCaseSensitive(plan, "plan");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(pj, "update_mode")->valuestring, c->update_mode);
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pj, "grads_direct")), c->grads_direct);
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pj, "grads_bf16")), c->grads_bf16);

    /* the launcher dies (SIGKILL) right after creating the objects, which stay behind */
    rc = tu_sh(&out, "SLIDEDP_CRASH_AT=launcher_regions_created:1 %s %s %s 2>&1", tu_bin("slidedp-launch"), ini,
               c->overrides);
    if (rc != 128 + 9)
        fail_msg("%s: slidedp-launch exited %d, not killed at launcher_regions_created: %s", c->name, rc, out);
    free(out);
    char job[32];
    job_name_of(c->name, job, sizeof job);
    printf("# %s (%s, grads_direct %d, grads_bf16 %d):", c->name, c->update_mode, c->grads_direct, c->grads_bf16);
    for (int i = 0; i < 4; i++) {
        char name[REGION_NAME_MAX], path[REGION_NAME_MAX + 16];
        ctl_region_name(job, objects[i], name, sizeof name);
        snprintf(path, sizeof path, "/dev/shm%s", name);
        struct stat st;
        double planned = number_at(plan, "host_memory", plan_keys[i]);
        if (i == 0 && planned == 0) { /* workers stream the master: no params16 object */
            assert_int_not_equal(stat(path, &st), 0);
            printf(" params16 none (planned 0)");
            continue;
        }
        if (stat(path, &st) != 0)
            fail_msg("%s: the launcher left no %s", c->name, path);
        shm_region_unlink(name);
        printf(" %s %lld (planned %.0f)", objects[i], (long long)st.st_size, planned);
        assert_true((double)st.st_size == planned);
    }
    printf("\n");
    assert_int_equal(tu_shm_objects(job), 0);
    char lock[96]; /* a killed launcher leaves its lock file (docs/design.md §8.6) */
    snprintf(lock, sizeof lock, "/dev/shm/slidedp-%s.lock", job);
    assert_int_equal(unlink(lock), 0);
    cJSON_Delete(plan);
}

static void test_plan_sizes_the_objects(void **state)
{
    (void)state;
    static const struct shape_case cases[] = {
        {"fp32-slots",
         {.tag = "fp32-slots", .runtime = ""},
         "runtime.grad_slots=3 runtime.update_mode=after_backward runtime.accumulate_on_device=false "
         "runtime.param_route=replicated runtime.grad_route=cpu",
         "after_backward", false, false},
        {"bf16-state-two-copies",
         {.tag = "bf16-state-two-copies", .runtime = "", .no_clip = true},
         "train.optimizer_state=bf16 runtime.grad_slots=5 runtime.update_mode=during_backward "
         "runtime.accumulate_on_device=false runtime.param_route=replicated runtime.grad_route=cpu",
         "during_backward", false, false},
        {"one-rank-bf16-accumulator",
         {.tag = "one-rank-bf16-accumulator", .runtime = "", .gpus = 1, .grad_accum = 1},
         "runtime.grad_dtype=bf16 runtime.update_mode=after_backward",
         "after_backward", true, true},
        {"three-ranks-windows",
         {.tag = "three-ranks-windows", .runtime = "", .gpus = 3},
         "train.optimizer_state=bf16 runtime.param_route=sharded runtime.grad_route=gpu "
         "runtime.update_mode=after_backward",
         "after_backward", true, false},
        {"one-rank-master",
         {.tag = "one-rank-master", .runtime = "", .gpus = 1, .grad_accum = 1, .weights_source = "master"},
         "runtime.grad_dtype=bf16", "after_backward", true, true},
        {"one-rank-master-8bit",
         {.tag = "one-rank-master-8bit", .runtime = "", .gpus = 1, .grad_accum = 1, .weights_source = "master"},
         "train.optimizer_state=8bit runtime.grad_dtype=bf16", "after_backward", true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_shape(&cases[i]);
}

int main(void)
{
    jobs_setup("stateshape");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_sizes_the_objects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
