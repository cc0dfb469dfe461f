/* spawn RESULT_FILE ARGV...: run ARGV as a child, reap it with wait4, write
 * "wall_ns cpu_us maxrss_kib exit_code" to RESULT_FILE.
 *
 * Why a C launcher: Linux carries the RSS high-water mark of the process that
 * forks into the child's ru_maxrss (the forked copy of its memory counts until
 * exec), so measuring from the Python bench itself would report the bench's own
 * ~20 MiB for every case. This launcher is small, so the numbers are the child's.
 * wait4 reports the child plus every descendant it reaped (bash -> timeout -> python). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spawn RESULT_FILE ARGV...\n");
        return 64;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
        perror("spawn: fork");
        return 70;
    }
    if (pid == 0) {
        execv(argv[2], argv + 2);
        perror("spawn: exec");
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("spawn: wait4");
        return 70;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long wall = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    long long cpu = (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL
                    + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror("spawn: result file");
        return 70;
    }
    fprintf(f, "%lld %lld %ld %d\n", wall, cpu, ru.ru_maxrss, code);
    fclose(f);
    return 0;
}
