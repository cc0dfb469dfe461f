/* A wall-clock step, as an NTP step or a VM resume makes one, for one process tree.
 *
 * Preloaded (LD_PRELOAD), this library answers every read of the wall clock (clock_gettime with
 * CLOCK_REALTIME or CLOCK_REALTIME_COARSE, gettimeofday, time) with the real time moved by
 * CLOCK_STEP_SECONDS (signed) from the moment the file CLOCK_STEP_FILE exists: a test steps the
 * clock by creating that file. The monotonic and boot-time clocks (and /proc/uptime) are left
 * alone, as a real step leaves them. Build: cc -shared -fPIC -o clock_step.so clock_step.c
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long step(void)
{
    const char *file = getenv("CLOCK_STEP_FILE");
    const char *seconds = getenv("CLOCK_STEP_SECONDS");

    if (file == NULL || seconds == NULL || access(file, F_OK) != 0)
        return 0;
    return strtol(seconds, NULL, 10);
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    long r = syscall(SYS_clock_gettime, id, ts);

    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        ts->tv_sec += step();
    return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    struct timespec ts;

    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *t)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (t != NULL)
        *t = ts.tv_sec;
    return ts.tv_sec;
}
