/* ch_clock_seconds: the monotonic clock that chorus-train, the benchmarks
 * and data parallelism time their steps with. */
#include <time.h>

#include "tap.h"

static double monotonic(void)
{
    struct timespec ts;
    return clock_gettime(CLOCK_MONOTONIC, &ts) == 0 ? (double)ts.tv_sec + 1e-9 * ts.tv_nsec : -1;
}

int main(void)
{
    double before = monotonic(), got = ch_clock_seconds(), after = monotonic();
    tap_ok(got >= before && got <= after,
           "before ch_init it reads CLOCK_MONOTONIC: got %.9f, want %.9f to %.9f", got, before,
           after);
    double last = ch_clock_seconds(), worst = 0;
    for (int i = 0; i < 100000; i++) {
        double t = ch_clock_seconds();
        if (last - t > worst)
            worst = last - t;
        last = t;
    }
    tap_ok(worst == 0, "100000 reads in a row never go back (worst step back %.9f s)", worst);
    double t0 = ch_clock_seconds();
    struct timespec nap = {0, 20 * 1000 * 1000};
    int slept = nanosleep(&nap, NULL) == 0;
    double dt = ch_clock_seconds() - t0;
    tap_ok(slept && dt >= 0.0195 && dt < 5.0,
           "a 20 ms sleep measures %.6f s, want 0.0195 to 5 (nanosleep %s)", dt,
           slept ? "completed" : "was interrupted");
    return tap_done();
}
