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
    char prefix[512], old[sizeof err_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_message, sizeof old);
    snprintf(err_message, sizeof err_message, "%s: %s", prefix, old);
    return -1;
}

const char *sd_errmsg(void)
{
    return err_message[0] ? err_message : "unknown error";
}
