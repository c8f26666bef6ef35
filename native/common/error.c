#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

specla_status specla_fail(specla_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}

void specla_clear_error(void) { last_error[0] = '\0'; }

SPECLA_API const char *specla_last_error(void) { return last_error; }

SPECLA_API int specla_abi_version(void) { return SPECLA_ABI_VERSION; }
