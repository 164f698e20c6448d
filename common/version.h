/* The one version line every slidedp program prints for --version: the release and the backends
 * this build has (the Makefile's `make run` looks for "cuda" in it). */
#ifndef SD_VERSION_H
#define SD_VERSION_H

#include <stdio.h>

static inline int sd_version_print(void)
{
#ifdef SD_HAVE_CUDA
    printf("slidedp %s (backends: cpu cuda)\n", SD_VERSION);
#else
    printf("slidedp %s (backends: cpu)\n", SD_VERSION);
#endif
    return 0;
}

/* The rule for relative paths, said the same way in every program's --help that takes overrides. */
#define SD_OVERRIDE_PATHS_HELP                                                                                   \
    "  section.key=value  overrides a key of job.ini. A relative path in an override starts at the current\n" \
    "                     directory (as the shell means it); a relative path inside job.ini starts at\n"       \
    "                     job.ini's folder.\n"

#endif
