/* Error reporting for the C ABI: a status code plus a thread-local message (see specla_last_error). */
#ifndef SPECLA_ERROR_H
#define SPECLA_ERROR_H
#include "specla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style message for specla_last_error() and returns status, so call sites read
 * `return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "tensor %s: ...", name);`. */
specla_status specla_fail(specla_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void specla_clear_error(void);

/* Returns the status of expr from the enclosing function unless it is SPECLA_OK (its message is
 * already recorded). */
#define SPECLA_TRY(expr)                                                                                               \
    do {                                                                                                               \
        const specla_status try_status_ = (expr);                                                                      \
        if (try_status_ != SPECLA_OK) return try_status_;                                                              \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
