/* slidedp-worker: one per GPU rank, exec'd by slidedp-launch. Maps params16 read-only and streams
 * it through the backend; never touches master, m or v. Exit codes: 0 done, 1 error (the launcher
 * may restart it), 2 fatal. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/err.h"
#include "worker/pipeline.h"

int main(int argc, char **argv)
{
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
