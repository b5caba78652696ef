/* chorus-train's SIGINT and SIGTERM (utils/signals.h), taken by a thread
 * of their own. Both are blocked in every thread from the start of main
 * (the threads the library, OpenMP, oneDNN and the drivers make inherit
 * that) and taken by one thread with sigwait: a signal never lands on a
 * compute thread. (One landing asynchronously on a thread inside oneDNN's
 * GEMM corrupted the heap.) */
#include "config.h"

#include <chorus.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <unistd.h>

#include "signals.h"

static volatile sig_atomic_t g_signal;
static sigset_t g_stop_set;

static void *signal_thread(void *arg)
{
    (void)arg;
    for (;;) {
        int signo = 0;
        if (sigwait(&g_stop_set, &signo) != 0)
            continue;
        if (g_signal)
            _exit(128 + signo);
        g_signal = signo;
    }
    return NULL;
}

int catch_signals(void)
{
    sigemptyset(&g_stop_set);
    sigaddset(&g_stop_set, SIGINT);
    sigaddset(&g_stop_set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &g_stop_set, NULL) != 0)
        return -1;
    pthread_t t;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0)
        goto unblock;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, signal_thread, NULL);
    pthread_attr_destroy(&attr);
    if (rc == 0)
        return 0;
unblock:
    pthread_sigmask(SIG_UNBLOCK, &g_stop_set, NULL);
    return -1;
}

int stop_signal(int ranks)
{
    int mine = g_signal;
    if (ranks <= 1)
        return mine;
    double v[2] = {mine == SIGINT, mine == SIGTERM};
    if (ch_dist_sum(ch_dist_world(), v, 2) != CH_OK)
        return mine;
    return v[0] > 0 ? SIGINT : v[1] > 0 ? SIGTERM : 0;
}
