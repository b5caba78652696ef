/* The process's math mode (ch_math_set): which shortcuts f32 products may
 * take. One atomic word, read by the backends at each product
 * (chi_math_flags, lib/backend.h). */
#include "config.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static atomic_uint math_flags;

ch_status ch_math_set(unsigned flags)
{
    if (flags & ~CH_MATH_TF32)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_math_set: flags 0x%x has bits other than CH_MATH_TF32 (0x%x)", flags,
                         CH_MATH_TF32);
    atomic_store(&math_flags, flags);
    return CH_OK;
}

unsigned ch_math_get(void)
{
    return atomic_load(&math_flags);
}

unsigned chi_math_flags(void)
{
    return atomic_load(&math_flags);
}

ch_status chi_math_from_env(void)
{
    const char *env = getenv("CHORUS_TF32");
    if (!env || !*env)
        return CH_OK;
    if (strcmp(env, "0") != 0 && strcmp(env, "1") != 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_init: CHORUS_TF32 is \"%s\", expected 0 or 1",
                         env);
    unsigned flags = ch_math_get() & ~CH_MATH_TF32;
    return ch_math_set(flags | (strcmp(env, "1") == 0 ? CH_MATH_TF32 : 0));
}
