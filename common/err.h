/* Error reporting for library code: functions return -1 and leave a one-line message here;
 * only a program's main decides what to print and which exit code to use. */
#ifndef SD_ERR_H
#define SD_ERR_H

#include <stdio.h>

/* Sets the calling thread's error message (printf format) and returns -1. */
int sd_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prepends "prefix: " to the current message and returns -1 (for adding context while unwinding). */
int sd_err_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *sd_errmsg(void);

/* For invariants whose failure is a programming error, not bad input. */
#define SD_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "assertion failed: %s at %s:%d\n", #cond, __FILE__, __LINE__);        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* System call check for code that cannot continue: prints the statement, file, line and errno. */
#define SYS_CHECK(call)                                                                            \
    do {                                                                                           \
        if ((call) < 0) {                                                                          \
            fprintf(stderr, "%s failed at %s:%d: %m\n", #call, __FILE__, __LINE__);                \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
