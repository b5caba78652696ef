/* The public face of the Philox generator (lib/philox.h), for host code
 * outside lib/ that must draw from it. */
#include "config.h"

#include <chorus.h>

#include "philox.h"

void ch_philox4x32(uint32_t ctr[4], uint64_t key)
{
    if (ctr)
        chi_philox4x32_10(ctr, (uint32_t)key, (uint32_t)(key >> 32));
}
