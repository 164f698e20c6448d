/* Shared memory no other local user can plant: attaching to a job refuses an object that is not
 * ours with mode 0600 (a 0666 one; one owned by another uid) and a ctl header whose offsets or
 * sizes do not match its job shape or its object; each refusal is one line and leaves nothing of
 * the job mapped. The launcher refuses a job whose name another user holds (one line, exit 2) and
 * leaves that object alone. The foreign-owner cases need root (chown), which CI has. */
#include "tests/testutil.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"
#include "shm/ctl.h"
#include "shm/region.h"

#define FOREIGN_UID 65534 /* nobody */

static char job[32];

static const char *const objects[4] = {"ctl", "params16", "master", "grads"};

static void remove_objects(void)
{
    for (int i = 0; i < 4; i++) {
        char name[REGION_NAME_MAX];
        ctl_region_name(job, objects[i], name, sizeof name);
        shm_region_unlink(name);
    }
}

/* A consistent state of a small job shape: the four objects, the header filled as the launcher
 * fills what attaching checks. */
static void make_state(void)
{
    remove_objects();
    struct ctl_shape shape = {.gpus = 2,
                              .grad_accum = 3,
                              .optim_procs = 1,
                              .optim_threads = 2,
                              .grad_slots = 4,
                              .num_tensors = 5,
                              .num_chunks = 2,
                              .total_numel = 4096,
                              .max_chunk_numel = 2048,
                              .optimizer_state = OPTIM_STATE_FP32};
    struct ctl_sizes sz;
    assert_int_equal(ctl_compute_sizes(&shape, &sz), 0);
    uint64_t bytes[4] = {sz.ctl_bytes, sz.params16_bytes, sz.master_bytes, sz.grads_bytes};
    struct shm_region r[4];
    for (int i = 0; i < 4; i++) {
        char name[REGION_NAME_MAX];
        ctl_region_name(job, objects[i], name, sizeof name);
        if (shm_region_create(&r[i], name, bytes[i]) != 0)
            fail_msg("%s", sd_errmsg());
    }
    struct ctl_header *h = r[0].base;
    h->magic = CTL_MAGIC;
    h->version = CTL_VERSION;
    h->header_size = sizeof *h;
    h->gpus = h->job.gpus = 2;
    h->job.grad_accum = 3;
    h->optim_procs = h->plan.optim_procs = 1;
    h->plan.optim_threads = 2;
    h->grad_slots = h->plan.grad_slots = 4;
    h->num_tensors = 5;
    h->num_chunks = 2;
    h->total_numel = 4096;
    h->max_chunk_numel = 2048;
    h->off_tensors = sz.off_tensors;
    h->off_chunks = sz.off_chunks;
    h->off_chunk_state = sz.off_chunk_state;
    h->off_rings = sz.off_rings;
    h->off_slots = sz.off_slots;
    h->off_doorbells = sz.off_doorbells;
    h->off_procs = sz.off_procs;
    h->off_steps = sz.off_steps;
    h->off_journals = sz.off_journals;
    h->off_xchg = sz.off_xchg;
    h->off_losses = sz.off_losses;
    h->size = sz.ctl_bytes;
    h->params16_bytes = sz.params16_bytes;
    h->master_bytes = sz.master_bytes;
    h->grads_bytes = sz.grads_bytes;
    for (int i = 0; i < 4; i++)
        shm_region_detach(&r[i]);
}

/* Runs fn on the open ctl object (to change its mode, owner or header). */
static void with_ctl(void (*fn)(int fd, struct ctl_header *h))
{
    char name[REGION_NAME_MAX];
    ctl_region_name(job, "ctl", name, sizeof name);
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    struct ctl_header *h = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(h != MAP_FAILED);
    fn(fd, h);
    munmap(h, (size_t)st.st_size);
    close(fd);
}

/* Mappings of this job's objects in this process. */
static int mapped(void)
{
    char *maps = tu_read_file("/proc/self/maps", NULL), needle[64];
    snprintf(needle, sizeof needle, "/dev/shm/slidedp.%s.", job);
    int n = 0;
    for (const char *p = maps; (p = strstr(p, needle)); p++)
        n++;
    free(maps);
    return n;
}

/* Attaching as a worker does fails, with one line containing `why`, and maps nothing. */
static void assert_refused(const char *why)
{
    struct job_shm s;
    int rc = job_shm_attach(&s, job, JOB_MAP_CTL | JOB_MAP_PARAMS_RO | JOB_MAP_GRADS | JOB_MAP_MASTER, false);
    printf("# refused: %s\n", rc == 0 ? "(attached)" : sd_errmsg());
    assert_int_equal(rc, -1);
    assert_non_null(strstr(sd_errmsg(), why));
    assert_null(strchr(sd_errmsg(), '\n'));
    assert_int_equal(mapped(), 0);
}

static void test_consistent_state_attaches(void **state)
{
    make_state();
    struct job_shm s;
    if (job_shm_attach(&s, job, JOB_MAP_CTL | JOB_MAP_PARAMS_RO | JOB_MAP_GRADS | JOB_MAP_MASTER, false) != 0)
        fail_msg("%s", sd_errmsg());
    assert_int_equal(mapped(), 4);
    job_shm_detach(&s);
    assert_int_equal(mapped(), 0);
}

static void chmod_0666(int fd, struct ctl_header *h)
{
    assert_int_equal(fchmod(fd, 0666), 0);
}

static void test_mode_0666_refused(void **state)
{
    make_state();
    with_ctl(chmod_0666);
    assert_refused("mode 0666");
}

static void chown_foreign(int fd, struct ctl_header *h)
{
    assert_int_equal(fchown(fd, FOREIGN_UID, (gid_t)-1), 0);
}

static void test_foreign_owner_refused(void **state)
{
    if (geteuid() != 0)
        skip(); /* only root can give an object to another uid */
    make_state();
    with_ctl(chown_foreign);
    assert_refused("belongs to uid 65534");
}

static void shift_steps(int fd, struct ctl_header *h)
{
    h->off_steps += 64;
}

static void rings_past_the_end(int fd, struct ctl_header *h)
{
    h->off_rings = h->size + 4096;
}

static void grow_grads(int fd, struct ctl_header *h)
{
    h->grads_bytes *= 2;
}

static void test_corrupt_offsets_refused(void **state)
{
    void (*corruptions[])(int, struct ctl_header *) = {shift_steps, rings_past_the_end, grow_grads};
    for (size_t i = 0; i < sizeof corruptions / sizeof corruptions[0]; i++) {
        make_state();
        with_ctl(corruptions[i]);
        assert_refused("corrupt header");
    }
}

/* A params16 object of another size than the header says (the header itself consistent). */
static void test_object_size_refused(void **state)
{
    make_state();
    char name[REGION_NAME_MAX];
    ctl_region_name(job, "params16", name, sizeof name);
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    close(fd);
    assert_refused("its header says");
}

/* The launcher, for a job whose ctl name another user holds: one line, exit 2, nothing created,
 * and the foreign object left in place. */
static void test_launcher_refuses_a_foreign_name(void **state)
{
    if (geteuid() != 0)
        skip();
    const char *dir = tu_tmpdir(1, "shm-security");
    char ini[1200], text[2400];
    snprintf(ini, sizeof ini, "%s/job.ini", dir);
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n[data]\ntrain = %s/data/train.bin\nseq_len = 64\n"
             "[train]\nmicro_batch = 2\nsteps = 2\n[checkpoint]\ndir = %s/ckpt\n[runtime]\ndevice = cpu\ngpus = 1\n"
             "[log]\ndir = %s/log\n",
             tu_src("examples/tiny-qwen3"), dir, dir, dir);
    tu_write_file(ini, text);
    char *out = NULL;
    assert_int_equal(tu_sh(&out, "%s copy --out %s/data --seq-len 64 --train 64 --val 8 --seed 3",
                           tu_bin("slidedp-data"), dir), 0);
    free(out);
    struct job_config jc;
    assert_int_equal(job_config_load(ini, 0, NULL, &jc), 0);
    char saved[32];
    snprintf(saved, sizeof saved, "%s", job);
    ctl_job_name(jc.log_dir, job, sizeof job);
    make_state();
    with_ctl(chown_foreign);
    int rc = tu_sh(&out, "%s %s", tu_bin("slidedp-launch"), ini);
    printf("# launcher: exit %d: %s", rc, out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "belongs to uid 65534"));
    assert_int_equal(strchr(out, '\n') - out + 1, (long)strlen(out)); /* one line */
    assert_int_equal(tu_shm_objects(job), 4);
    char log_dir[1300];
    snprintf(log_dir, sizeof log_dir, "%s/log", dir);
    assert_false(tu_exists(log_dir));
    free(out);
    remove_objects();
    snprintf(job, sizeof job, "%s", saved);
    tu_rmrf(dir);
}

static int teardown(void **state)
{
    remove_objects();
    return 0;
}

int main(void)
{
    tu_seed("shm security", 0); /* nothing random */
    snprintf(job, sizeof job, "sectest%d", (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_consistent_state_attaches, teardown),
        cmocka_unit_test_teardown(test_mode_0666_refused, teardown),
        cmocka_unit_test_teardown(test_foreign_owner_refused, teardown),
        cmocka_unit_test_teardown(test_corrupt_offsets_refused, teardown),
        cmocka_unit_test_teardown(test_object_size_refused, teardown),
        cmocka_unit_test_teardown(test_launcher_refuses_a_foreign_name, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
