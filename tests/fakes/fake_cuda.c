/*
 * A fake libcuda.so.1 for the checkpoint tests: the checkpoint probe's child loads it
 * exactly as it loads the real driver (ctypes.CDLL("libcuda.so.1"), found through
 * LD_LIBRARY_PATH), and the per-process checkpoint states come from the scenario file
 * named by FAKE_CUDA_SCENARIO, read again on every call:
 *
 *   driver VERSION        cuDriverGetVersion (default 12080, i.e. 12.8)
 *   init-error CODE       cuInit returns CODE
 *   pid PID STATE         running | locked | checkpointed | failed (CUprocessState 0..3)
 *   pid PID error CODE    cuCheckpointProcessGetState(PID) returns CODE
 *   hang [MS]             cuCheckpointProcessGetState sleeps MS ms (no MS: forever)
 *
 * A pid not named returns CUDA_ERROR_INVALID_VALUE (1), as for a process without a
 * CUDA context. Built with -DNO_CHECKPOINT_API it stands for a driver before 555:
 * cuCheckpointProcessGetState is not exported at all.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3 };

static int initialised;

/* Looks the scenario up: fills *state or *code for pid, returns the hang in ms (-1: none, -2: forever). */
static int scenario(int pid, int *state, int *code, int *driver, int *init_error)
{
    const char *path = getenv("FAKE_CUDA_SCENARIO");
    int hang = -1;
    *state = -1;
    *code = CUDA_ERROR_INVALID_VALUE;
    *driver = 12080;
    *init_error = 0;
    if (path == NULL || *path == '\0')
        return hang;
    FILE *fh = fopen(path, "r");
    if (fh == NULL)
        return hang;
    char line[256];
    while (fgets(line, sizeof line, fh) != NULL) {
        char word[32] = "", what[32] = "";
        int a = 0, b = 0;
        int n = sscanf(line, "%31s %d %31s %d", word, &a, what, &b);
        if (n >= 1 && strcmp(word, "hang") == 0) {
            hang = n >= 2 ? a : -2;
        } else if (n >= 2 && strcmp(word, "driver") == 0) {
            *driver = a;
        } else if (n >= 2 && strcmp(word, "init-error") == 0) {
            *init_error = a;
        } else if (n >= 3 && strcmp(word, "pid") == 0 && a == pid) {
            static const char *names[] = {"running", "locked", "checkpointed", "failed"};
            for (int i = 0; i < 4; i++)
                if (strcmp(what, names[i]) == 0) {
                    *state = i;
                    *code = CUDA_SUCCESS;
                }
            if (strcmp(what, "error") == 0 && n == 4) {
                *code = b;
                *state = -1;
            }
        }
    }
    fclose(fh);
    return hang;
}

CUresult cuInit(unsigned int flags)
{
    int state, code, driver, init_error;
    (void)flags;
    scenario(0, &state, &code, &driver, &init_error);
    if (init_error != 0)
        return init_error;
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    int state, code, init_error;
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    scenario(0, &state, &code, version, &init_error);
    return CUDA_SUCCESS;
}

#ifndef NO_CHECKPOINT_API
CUresult cuCheckpointProcessGetState(int pid, int *out)
{
    int state, code, driver, init_error;
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int hang = scenario(pid, &state, &code, &driver, &init_error);
    if (hang == -2)
        for (;;)
            nanosleep(&(struct timespec){3600, 0}, NULL);
    if (hang >= 0) {
        struct timespec ts = {hang / 1000, (long)(hang % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (code == CUDA_SUCCESS)
        *out = state;
    return code;
}
#endif
