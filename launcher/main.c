/* slidedp-launch: runs a job from job.ini. See README.md for the options and exit codes. */
#include <dirent.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/job.h"
#include "common/version.h"
#include "launcher/hosts.h"
#include "launcher/launch.h"
#include "planner/calib.h"
#include "shm/ctl.h"
#include "shm/region.h"

static int help(void)
{
    printf("usage: slidedp-launch [--gpus N] [--device cuda|cpu] [--recalibrate] job.ini [section.key=value ...]\n"
           "       slidedp-launch --clean job.ini [section.key=value ...]\n"
           "       slidedp-launch --version | --help\n"
           "Trains the job job.ini describes (README \"Job file\"): the state in shared memory, one worker per GPU\n"
           "(or CPU worker), the optimizer processes; exports <checkpoint.dir>/final/ at the end.\n"
           "  --gpus N           runtime.gpus=N\n"
           "  --device cuda|cpu  runtime.device (cpu: each rank is a CPU worker process)\n"
           "  --recalibrate      measure this host's rates again before planning\n"
           "  --clean            remove the shared memory a dead job left behind, and exit\n"
           "  --version          print the version and the backends of this build\n"
           "  --help, -h         this text\n" SD_OVERRIDE_PATHS_HELP
           "Exit codes: 0 done, 1 failed, 2 bad input (nothing created or modified), 3 stopped on a non-finite\n"
           "loss or gradient norm, 130 stopped by SIGINT/SIGTERM (checkpoint written; the same command resumes).\n"
           "Under mpirun -np H every host runs one launcher; host 0 prints the steps, the others their own problems.\n");
    return 0;
}

/* Bad command line: one line naming the problem, exit 2. */
static int usage_error(const char *problem, const char *arg)
{
    fprintf(stderr, "slidedp-launch: %s%s (slidedp-launch --help lists the options)\n", problem, arg);
    return 2;
}

/* Removes the objects of one host's state `name` under its owner lock (a live launcher holds it; a
 * pid stored in the state may be reused, or of another PID namespace): how many, or -1. */
static int clean_objects(const char *name)
{
    int lock_fd;
    if (owner_lock(name, 0, &lock_fd) != 0) {
        fprintf(stderr, "slidedp-launch: %s; not removing its state\n", sd_errmsg());
        return -1;
    }
    struct job_shm shm;
    if (job_shm_attach(&shm, name, JOB_MAP_CTL, true) == 0) {
        uint32_t committed = ctl_committed_step(shm.ctl), on_disk = atomic_load(&shm.ctl->ckpt_done_step);
        job_shm_detach(&shm);
        if (committed > on_disk)
            printf("job %s: discarding %u trained step(s) not in a checkpoint on disk\n", name, committed - on_disk);
    }
    const char *what[] = {"ctl", "params16", "master", "grads"};
    int removed = 0;
    for (int i = 0; i < 4; i++) {
        char obj[REGION_NAME_MAX];
        ctl_region_name(name, what[i], obj, sizeof obj);
        if (shm_region_exists(obj)) {
            shm_region_unlink(obj);
            removed++;
        }
    }
    owner_unlock(name, lock_fd);
    return removed;
}

/* Removes the shm objects a dead job left behind (refuses while its launcher runs). Under mpirun
 * or srun: this host's; outside: the one-host state and every host's of a run on several hosts
 * (/dev/shm/slidedp.<job>-h<N>.*). */
static int clean_job(const char *ini, int n, char **overrides)
{
    struct job_config job;
    if (job_config_load(ini, n, overrides, &job) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 2;
    }
    struct hosts hosts;
    if (hosts_detect(&hosts) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 2;
    }
    char name[32];
    ctl_host_job_name(job.log_dir, hosts.count, hosts.index, name, sizeof name);
    int removed = clean_objects(name), states = removed > 0;
    DIR *d = hosts.count == 1 ? opendir("/dev/shm") : NULL;
    for (struct dirent *e; d && removed >= 0 && (e = readdir(d));) {
        char host_name[48], prefix[48];
        int host, len = 0;
        snprintf(prefix, sizeof prefix, "slidedp.%s-h", name);
        if (strncmp(e->d_name, prefix, strlen(prefix)) ||
            sscanf(e->d_name + strlen(prefix), "%d.%n", &host, &len) != 1 || len == 0)
            continue;
        snprintf(host_name, sizeof host_name, "%s-h%d", name, host);
        int more = clean_objects(host_name);
        removed = more < 0 ? -1 : removed + more;
        states += more > 0;
        rewinddir(d); /* the directory changed under readdir */
    }
    if (d)
        closedir(d);
    if (removed < 0)
        return 2;
    if (removed == 0)
        printf("job %s (log.dir %s) has no shared state in /dev/shm: nothing to remove\n", name, job.log_dir);
    else
        printf("removed the shared state of job %s (%d object(s) of %d host(s) in /dev/shm)\n", name, removed, states);
    return 0;
}

int main(int argc, char **argv)
{
    /* A closed stdout must not kill the supervisor before it removes the shared state. */
    signal(SIGPIPE, SIG_IGN);
    static char gpus_override[64], device_override[64];
    char **overrides = calloc((size_t)argc + 2, sizeof *overrides);
    int num_overrides = 0;
    const char *ini = NULL;
    int clean = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gpus") && i + 1 < argc) {
            snprintf(gpus_override, sizeof gpus_override, "runtime.gpus=%s", argv[++i]);
            overrides[num_overrides++] = gpus_override;
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            snprintf(device_override, sizeof device_override, "runtime.device=%s", argv[++i]);
            overrides[num_overrides++] = device_override;
        } else if (!strcmp(argv[i], "--clean")) {
            clean = 1;
        } else if (!strcmp(argv[i], "--recalibrate")) {
            calib_force_measure(); /* the planner measures this host again (slidedp-plan --recalibrate) */
        } else if (!strcmp(argv[i], "--version")) {
            return sd_version_print();
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            return help();
        } else if (!strcmp(argv[i], "--gpus") || !strcmp(argv[i], "--device")) {
            return usage_error("a value must follow ", argv[i]);
        } else if (argv[i][0] == '-') {
            return usage_error("unknown option ", argv[i]);
        } else if (!ini) {
            ini = argv[i];
        } else if (strchr(argv[i], '=')) {
            overrides[num_overrides++] = argv[i];
        } else {
            fprintf(stderr, "slidedp-launch: unexpected argument '%s' (overrides look like section.key=value)\n", argv[i]);
            return 2;
        }
    }
    if (!ini)
        return usage_error("no job file given: slidedp-launch [options] job.ini [section.key=value ...]", "");
    if (clean)
        return clean_job(ini, num_overrides, overrides);
    struct launch_opts opts = {.ini_path = ini, .num_overrides = num_overrides, .overrides = overrides};
    return launch_run(&opts);
}
