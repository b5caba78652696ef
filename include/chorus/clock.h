/* Chorus: a monotonic clock for timing steps and benchmarks. */
#ifndef CHORUS_CLOCK_H
#define CHORUS_CLOCK_H

#include <chorus/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on a monotonic clock (CLOCK_MONOTONIC) from an arbitrary origin:
 * differences time an interval; it never goes back when the time of day is
 * set. Returns 0 should the system refuse the clock (no Linux does). Safe
 * to call before ch_init and from any thread. */
CH_API double ch_clock_seconds(void);

#ifdef __cplusplus
}
#endif

#endif
