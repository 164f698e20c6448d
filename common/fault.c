/* Fault injection points (see fault.h). */
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_POINTS 8

static struct {
    char name[48];
    long target, hits;
} points[MAX_POINTS];
static int num_points;

void fault_init(unsigned restarts)
{
    num_points = 0;
    const char *spec = getenv("SLIDEDP_CRASH_AT");
    if (!spec)
        return;
    char buf[512];
    strncpy(buf, spec, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *tok = strtok(buf, ","); tok && num_points < MAX_POINTS; tok = strtok(NULL, ",")) {
        char *colon = strchr(tok, ':');
        if (!colon)
            continue;
        *colon = 0;
        if (restarts > 0 && !strstr(colon + 1, ":always"))
            continue;
        strncpy(points[num_points].name, tok, sizeof points[num_points].name - 1);
        points[num_points].target = strtol(colon + 1, NULL, 10);
        points[num_points].hits = 0;
        num_points++;
    }
}

void fault_point(const char *point)
{
    for (int i = 0; i < num_points; i++)
        if (!strcmp(points[i].name, point) && ++points[i].hits == points[i].target)
            raise(SIGKILL);
}

void fault_step(unsigned step, int rank)
{
    const char *spec = getenv("SLIDEDP_CRASH_AT_STEP");
    unsigned at;
    int at_rank;
    if (spec && sscanf(spec, "%u:%d", &at, &at_rank) == 2 && at == step && at_rank == rank)
        raise(SIGKILL);
}
