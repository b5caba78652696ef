/* Chorus: train neural networks on every device of a machine.
 * One include for the whole public API. */
#ifndef CHORUS_H
#define CHORUS_H

#include <chorus/export.h>
#include <chorus/status.h>
#include <chorus/clock.h>
#include <chorus/device.h>
#include <chorus/stream.h>
#include <chorus/tensor.h>
#include <chorus/ops.h>
#include <chorus/data.h>
#include <chorus/nn.h>
#include <chorus/reduce.h>
#include <chorus/dp.h>

#define CHORUS_VERSION_MAJOR 0
#define CHORUS_VERSION_MINOR 1
#define CHORUS_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version string ("0.1.0"). */
CH_API const char *ch_version(void);

#ifdef __cplusplus
}
#endif

#endif
