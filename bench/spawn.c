/* spawn RESULT_FILE ARGV...: run ARGV (searched on PATH), reap it with wait4 and write
 * "wall_ns cpu_us maxrss_kib exit_code" to RESULT_FILE. In C: a child forked from the Python
 * bench would carry the bench's RSS in its ru_maxrss until it execs (docs/benchmark.md). */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    FILE *f = argc > 2 ? fopen(argv[1], "we") : NULL;
    if (!f) {
        fprintf(stderr, "usage: spawn RESULT_FILE ARGV...\n");
        return 64;
    }
    struct timespec t0, t1;
    struct rusage ru;
    int status = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        perror("spawn: exec");
        _exit(127);
    }
    if (pid < 0 || wait4(pid, &status, 0, &ru) < 0) {
        perror("spawn");
        return 70;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(f, "%lld %lld %ld %d\n", (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec),
            (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec,
            ru.ru_maxrss, WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
    return fclose(f) ? 70 : 0;
}
