/* A backend module built for the previous backend ABI version, for
 * test-abi: built (check only) as chorus-cuda.so, the name of a real
 * module, so that the registry finds it first on CHORUS_BACKEND_PATH and
 * must refuse it. The core reads nothing of a foreign table but its
 * version, so the table holds nothing else. */
#include "backend.h"

static const ch_backend_i wrong_table = {
    .abi_version = CH_BACKEND_ABI_VERSION - 1,
    .name = "cuda",
};

CH_API const ch_backend_i *chorus_backend_entry(void);

const ch_backend_i *chorus_backend_entry(void)
{
    return &wrong_table;
}
