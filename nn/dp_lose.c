/* Devices that tests lose (chi_dp_lose, nn/nn.h): elastic data
 * parallelism's tests make a device fail, or hang, at a point of a
 * training step (dp_lose_here, where the workers and the reducer pass
 * those points) and every probe of it fail (dp_lost_by_test, in
 * nn/dp_watchdog.c's probes) until chi_dp_found says it answers again.
 *
 * Only in the copy of nn/ that tests link (CHI_TEST_HOOKS,
 * tests/Makefile.mk): the installed library has none of it. */
#include "config.h"

#include <pthread.h>
#include <string.h>

#include "dp_impl.h"

#ifdef CHI_TEST_HOOKS
static pthread_mutex_t lose_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lose_cond = PTHREAD_COND_INITIALIZER;
static struct {
    ch_device *dev;
    int at, hang, armed, lost;
    int64_t step;
} losing[4];

void chi_dp_lose(ch_device *dev, int at, int64_t step, int hang)
{
    pthread_mutex_lock(&lose_lock);
    for (int i = 0; i < 4; i++)
        if (!losing[i].dev || losing[i].dev == dev) {
            losing[i].dev = dev;
            losing[i].at = at;
            losing[i].step = step;
            losing[i].hang = hang;
            losing[i].armed = 1;
            losing[i].lost = 0;
            break;
        }
    pthread_mutex_unlock(&lose_lock);
}

void chi_dp_found(ch_device *dev)
{
    pthread_mutex_lock(&lose_lock);
    for (int i = 0; i < 4; i++)
        if (losing[i].dev == dev)
            memset(&losing[i], 0, sizeof losing[i]);
    pthread_cond_broadcast(&lose_cond);
    pthread_mutex_unlock(&lose_lock);
}

ch_status dp_lose_here(ch_device *dev, int at, int64_t step)
{
    pthread_mutex_lock(&lose_lock);
    int hit = -1;
    for (int i = 0; i < 4; i++)
        if (losing[i].dev == dev &&
            (losing[i].lost || (losing[i].armed && losing[i].at == at && losing[i].step == step)))
            hit = i;
    if (hit >= 0 && losing[hit].armed) {
        losing[hit].armed = 0;
        losing[hit].lost = 1;
        while (losing[hit].hang && losing[hit].dev == dev)
            pthread_cond_wait(&lose_cond, &lose_lock);
    }
    pthread_mutex_unlock(&lose_lock);
    if (hit < 0)
        return CH_OK;
    static const char *const where[] = {"forward", "backward", "the reduction", "the update"};
    return chi_error(CH_ERR_DRIVER, "%s: the device was lost in %s of step %lld (a test's failure)",
                     ch_device_id(dev), where[at & 3], (long long)step);
}

int dp_lost_by_test(ch_device *dev)
{
    pthread_mutex_lock(&lose_lock);
    int lost = 0;
    for (int i = 0; i < 4; i++)
        lost |= losing[i].dev == dev && losing[i].lost;
    pthread_mutex_unlock(&lose_lock);
    return lost;
}
#endif
