/* The backend registry (private). */
#ifndef CHORUS_LIB_REGISTRY_H
#define CHORUS_LIB_REGISTRY_H

#include "core.h"

/* Start the host backend and try every module. Only a host failure fails. */
ch_status chi_registry_load(void);
void chi_registry_unload(void);
int chi_registry_count(void);
chi_backend *chi_registry_get(int index);

#endif
