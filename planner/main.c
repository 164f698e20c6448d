/* slidedp-plan: prints the plan slidedp-launch would use for a job. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"
#include "common/model_config.h"
#include "planner/plan.h"

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: slidedp-plan job.ini [section.key=value ...]\n");
        return 2;
    }
    struct job_config job;
    if (job_config_load(argv[1], argc - 2, argv + 2, &job) != 0) {
        fprintf(stderr, "slidedp-plan: %s\n", sd_errmsg());
        return 2;
    }
    char cfg_path[JOB_PATH_MAX + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", job.model_path);
    struct model_config cfg;
    struct plan plan;
    if (model_config_load(cfg_path, &cfg) != 0 || plan_make(&job, &cfg, (int)sysconf(_SC_NPROCESSORS_ONLN), &plan) != 0) {
        fprintf(stderr, "slidedp-plan: %s\n", sd_errmsg());
        return 2;
    }
    plan_print(stdout, &plan, &cfg, &job);
    return 0;
}
