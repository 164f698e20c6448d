/* Thread-local last-error message used by every library in slidedp. */
#include "err.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char err_message[1024];

int sd_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_message, sizeof err_message, fmt, ap);
    va_end(ap);
    return -1;
}

int sd_err_prefix(const char *fmt, ...)
{
    char joined[2 * sizeof err_message];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(joined, sizeof err_message, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof err_message)
        n = sizeof err_message - 1;
    snprintf(joined + n, sizeof joined - (size_t)n, ": %s", err_message);
    memcpy(err_message, joined, sizeof err_message - 1);
    err_message[sizeof err_message - 1] = 0;
    return -1;
}

const char *sd_errmsg(void)
{
    return err_message[0] ? err_message : "unknown error";
}
