/* slidedp-optim: an optimizer process, exec'd by slidedp-launch; owns a set of chunks' master
 * weights and Adam moments. Exit codes: 0 done, 1 error (restartable), 2 fatal. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/err.h"
#include "common/version.h"
#include "optimizer/optim.h"

static int help(void)
{
    printf("usage: slidedp-optim --job NAME --index K\n"
           "       slidedp-optim --version | --help\n"
           "An optimizer process of a job, started by slidedp-launch, which passes these options; not run by\n"
           "hand. It owns a set of chunks' master weights and Adam moments.\n"
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
    struct optim_args args = {.index = -1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--job") && i + 1 < argc)
            args.job_name = argv[++i];
        else if (!strcmp(argv[i], "--index") && i + 1 < argc)
            args.index = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: slidedp-optim --job NAME --index K (started by slidedp-launch)\n");
            return 2;
        }
    }
    if (!args.job_name || args.index < 0) {
        fprintf(stderr, "slidedp-optim: --job and --index are required (started by slidedp-launch)\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        return 1;
    int rc = optim_run(&args);
    if (rc != 0)
        fprintf(stderr, "slidedp-launch: optimizer %d: %s\n", args.index, sd_errmsg());
    return rc;
}
