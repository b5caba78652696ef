#include "config.h"

#include <chorus.h>

const char *ch_version(void) { return PACKAGE_VERSION; }
