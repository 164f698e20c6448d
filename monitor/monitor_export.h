/* A job snapshot as data for other programs, used by slidedp-stat: one JSON object (--json), or the
 * Prometheus text exposition format 0.0.4 (--prometheus): slidedp_* metrics in base units,
 * counters ending in _total, rank="r" / optimizer="k" labels. */
#ifndef SD_MONITOR_EXPORT_H
#define SD_MONITOR_EXPORT_H

#include <stdio.h>

#include "monitor/monitor.h"

/* The snapshot as a JSON object (malloc'd text, caller frees), or NULL when out of memory. */
char *mon_json(const struct mon *m, const struct mon_snapshot *s);
/* Writes the snapshot's metric families, each with # HELP and # TYPE before its samples. */
void mon_prometheus(FILE *f, const struct mon *m, const struct mon_snapshot *s);

#define MON_PROMETHEUS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
