/* slidedp-worker: one per GPU rank, exec'd by slidedp-launch. Maps params16 read-only and streams
 * it through the backend; never touches master, m or v. Exit codes: 0 done, 1 error (the launcher
 * may restart it), 2 fatal. `--probe-topology [--gpus G]` instead prints the GPUs G ranks would run
 * on in the topology description format (the launcher never initialises CUDA itself). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/err.h"
#include "common/topology.h"
#include "common/version.h"
#include "worker/pipeline.h"
#include "worker/probe.h"

static int probe_topology(int argc, char **argv)
{
    int gpus = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--gpus") && i + 1 < argc && (gpus = atoi(argv[++i])) >= 1 && gpus <= JOB_MAX_GPUS)
            continue;
        fprintf(stderr, "usage: slidedp-worker --probe-topology [--gpus G] (G in 1..%d)\n", JOB_MAX_GPUS);
        return 2;
    }
#ifdef SD_HAVE_CUDA
    struct topology host, ranks;
    if (cuda_probe_topology(&host) != 0) {
        fprintf(stderr, "slidedp-worker: %s\n", sd_errmsg());
        return 2;
    }
    topology_read_sysfs(&host, "/sys/bus/pci/devices");
    topology_for_ranks(&host, gpus > 0 ? gpus : host.gpus, &ranks);
    topology_write(stdout, &ranks);
    return fflush(stdout) == 0 ? 0 : 2;
#else
    fprintf(stderr, "slidedp-worker: this build has no CUDA backend (nvcc was not found); no GPU to probe\n");
    return 2;
#endif
}

static int help(void)
{
    printf("usage: slidedp-worker --job NAME --rank R [--device-index D]\n"
           "       slidedp-worker --probe-topology [--gpus G]\n"
           "       slidedp-worker --version | --help\n"
           "One GPU rank of a job (or a CPU worker), started by slidedp-launch, which passes these options;\n"
           "not run by hand. --probe-topology prints the GPUs G ranks would run on (the launcher asks).\n"
           "  --version   print the version and the backends of this build\n"
           "  --help, -h  this text\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return help();
    if (argc >= 2 && !strcmp(argv[1], "--version"))
        return sd_version_print();
    if (argc >= 2 && !strcmp(argv[1], "--probe-topology"))
        return probe_topology(argc, argv);
    struct worker_args args = {.rank = -1, .device_index = 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--job") && i + 1 < argc)
            args.job_name = argv[++i];
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc)
            args.rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device-index") && i + 1 < argc)
            args.device_index = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: slidedp-worker --job NAME --rank R [--device-index D] (started by slidedp-launch)\n");
            return 2;
        }
    }
    if (!args.job_name || args.rank < 0) {
        fprintf(stderr, "slidedp-worker: --job and --rank are required (started by slidedp-launch)\n");
        return 2;
    }
    /* Die with the launcher; re-check in case it died before the prctl. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        return 1;
    int rc = worker_run(&args);
    if (rc != 0)
        fprintf(stderr, "slidedp-launch: worker %d: %s\n", args.rank, sd_errmsg());
    return rc;
}
