/* Library-internal access to the factor banks beyond the ABI (specla.h). */
#ifndef SPECLA_FACTOR_BANKS_H
#define SPECLA_FACTOR_BANKS_H
#include "specla.h"

/* Drop whatever is pending or verified without folding it (the durable state is being reset). */
void factor_banks_discard(specla_factor_banks *banks);

#endif
