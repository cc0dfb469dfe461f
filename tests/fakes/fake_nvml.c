/*
 * A fake libnvidia-ml.so.1 for tests: the real nvidia-ml-py bindings load it
 * (through LD_LIBRARY_PATH, or because a library with this soname is already
 * loaded), and the GPUs and faults it reports come from the scenario file named
 * by FAKE_NVML_SCENARIO. The format is documented in tests/fakes/README.md.
 *
 * Only the symbols the suite calls are defined: nvidia-ml-py resolves each
 * function lazily and raises NVMLError_FunctionNotFound for a missing one.
 * The scenario is read again on every nvmlInit*, so one process can go through
 * several scenarios.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    OK = 0, E_UNINITIALIZED = 1, E_INVALID_ARGUMENT = 2, E_NOT_SUPPORTED = 3,
    E_NO_PERMISSION = 4, E_NOT_FOUND = 6, E_INSUFFICIENT_SIZE = 7,
    E_DRIVER_NOT_LOADED = 9, E_TIMEOUT = 10, E_LIBRARY_NOT_FOUND = 12,
    E_FUNCTION_NOT_FOUND = 13, E_CORRUPTED_INFOROM = 14, E_GPU_IS_LOST = 15,
    E_RESET_REQUIRED = 16, E_UNKNOWN = 999,
};

#define EV_SINGLE_ECC 0x1ULL
#define EV_DOUBLE_ECC 0x2ULL
#define EV_PSTATE 0x4ULL
#define EV_XID 0x8ULL
#define EV_CLOCK 0x10ULL

#define MAX_GPUS 16
#define MAX_MIG 7
#define MAX_PROCS 16
#define MAX_EVENTS 64
#define MAX_HANGS 8
#define MAX_SETS 8

/* Fields a scenario can declare unsupported (NVML_ERROR_NOT_SUPPORTED). */
enum { F_ECC, F_RETIRED, F_REMAP, F_CLOCKS, F_TEMP, F_SLOWDOWN, F_COMPUTE, F_PROCS, F_MIG,
       F_EVENTS, F_MEMORY, F_RECOVERY, F_FABRIC, F_PERSISTENCE, F_PCIE, F_UTILIZATION, F_NVLINK,
       F_COUNT };
static const char *FIELD_NAMES[F_COUNT] = {"ecc", "retired", "remap", "clocks", "temperature",
    "slowdown", "compute-mode", "processes", "mig", "events", "memory", "recovery", "fabric",
    "persistence", "pcie", "utilization", "nvlink"};

#define MAX_LINKS 18
#define FI_GPU_RECOVERY_ACTION 230

typedef struct { int gpu; int mig; } fdev;  /* mig == -1: the physical GPU */

typedef struct { unsigned int pid; unsigned long long mib; char name[64]; } fproc;

typedef struct {
    char name[96];
    char uuid[96];
    unsigned long long mem_total_mib, mem_used_mib;
    unsigned long long ecc[2][2];  /* [corrected/uncorrected][volatile/aggregate] */
    int handle_error;              /* returned by GetHandleByIndex (lost/unknown) */
    int query_error;               /* returned by every query on the handle */
    unsigned int retired_pending;
    unsigned int remap[4];         /* corrected, uncorrected, pending, failure */
    unsigned long long clocks;
    unsigned int temp, slowdown, shutdown;
    unsigned int compute_mode;
    int nprocs;
    fproc procs[MAX_PROCS];
    int nmps;
    fproc mps[MAX_PROCS];          /* MPS clients (nvmlDeviceGetMPSComputeRunningProcesses_v3) */
    unsigned int recovery;         /* the GPU recovery action field value */
    int fabric;                    /* 0: no fabric support; else 1 + state */
    unsigned int fabric_state, fabric_status;
    unsigned int persistence;
    unsigned int pcie[4];          /* current gen, current width, max gen, max width */
    unsigned int util_gpu;
    int nlinks;                    /* NVLink links (0: PCIe only, NOT_SUPPORTED) */
    unsigned int links_down;       /* bit i: link i inactive */
    unsigned long long link_errors[MAX_LINKS];
    unsigned long long link_error_step;  /* added to every link's counters on each read */
    int field_error[F_COUNT];      /* a supported field that fails with this code */
    unsigned int mig_mode, nmig;
    int unsupported[F_COUNT];
} fgpu;

typedef struct {
    int gpu;
    unsigned long long type;
    unsigned long long data;
    long delay_ms;
    char when[256]; /* "@PATH": due once PATH exists (delay_ms unused) */
} fevent;

typedef struct { char sym[96]; long ms; } fhang;

typedef struct {
    int used;
    unsigned long long mask[MAX_GPUS];
    double registered_at[MAX_GPUS];
    int delivered[MAX_EVENTS];
} fset;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int init_error;
static int ngpus;
static char driver[64];
static int cuda_driver;
static fgpu gpus[MAX_GPUS];
static fdev phys[MAX_GPUS];
static fdev migs[MAX_GPUS][MAX_MIG];
static int nevents;
static fevent events[MAX_EVENTS];
static int nhangs;
static fhang hangs[MAX_HANGS];
#define MAX_MISSING 8
static int nmissing;
static char missing[MAX_MISSING][96];
static fset sets[MAX_SETS];

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* A scenario's `hang SYMBOL [MS]`: the call sleeps before doing anything. */
static void maybe_hang(const char *sym) {
    long ms = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nhangs; i++)
        if (strcmp(hangs[i].sym, sym) == 0) ms = hangs[i].ms;
    pthread_mutex_unlock(&mu);
    if (ms < 0) for (;;) sleep_ms(1000);
    if (ms > 0) sleep_ms(ms);
}

static void set_defaults(void) {
    ngpus = 1;
    init_error = 0;
    nevents = 0;
    nhangs = 0;
    nmissing = 0;
    snprintf(driver, sizeof driver, "550.54.15");
    cuda_driver = 12040;
    memset(gpus, 0, sizeof gpus);
    memset(sets, 0, sizeof sets);
    for (int i = 0; i < MAX_GPUS; i++) {
        fgpu *g = &gpus[i];
        snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
        snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-fake-4000-8000-%012x", 0xabc0 + i, i);
        g->mem_total_mib = 81559;
        g->mem_used_mib = 0;
        g->temp = 40;
        g->slowdown = 87;
        g->shutdown = 92;
        g->persistence = 1;
        g->pcie[0] = g->pcie[2] = 5;
        g->pcie[1] = g->pcie[3] = 16;
        phys[i].gpu = i;
        phys[i].mig = -1;
        for (int m = 0; m < MAX_MIG; m++) { migs[i][m].gpu = i; migs[i][m].mig = m; }
    }
}

static int field_index(const char *name) {
    for (int f = 0; f < F_COUNT; f++)
        if (strcmp(FIELD_NAMES[f], name) == 0) return f;
    return -1;
}

static unsigned int compute_mode_value(const char *s) {
    if (strcmp(s, "DEFAULT") == 0) return 0;
    if (strcmp(s, "EXCLUSIVE_THREAD") == 0) return 1;
    if (strcmp(s, "PROHIBITED") == 0) return 2;
    if (strcmp(s, "EXCLUSIVE_PROCESS") == 0) return 3;
    return 99;
}

static int bad(const char *path, int lineno, const char *line) {
    fprintf(stderr, "fake_nvml: %s:%d: cannot parse: %s\n", path, lineno, line);
    return -1;
}

/* Parse the scenario; -1 on a malformed line (nvmlInit then fails with UNKNOWN). */
static int load_scenario(void) {
    set_defaults();
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path || !*path) return 0;
    FILE *fh = fopen(path, "r");
    if (!fh) {
        fprintf(stderr, "fake_nvml: cannot open scenario %s\n", path);
        return -1;
    }
    char raw[512];
    int lineno = 0, rc = 0;
    while (fgets(raw, sizeof raw, fh)) {
        lineno++;
        char line[512];
        snprintf(line, sizeof line, "%s", raw);
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        line[strcspn(line, "\r\n")] = 0;
        char *save = NULL;
        char *key = strtok_r(line, " \t", &save);
        if (!key) continue;
        char *a = strtok_r(NULL, " \t", &save);
        if (strcmp(key, "gpus") == 0 && a) {
            ngpus = atoi(a);
            if (ngpus < 0 || ngpus > MAX_GPUS) { rc = bad(path, lineno, raw); break; }
        } else if (strcmp(key, "init-error") == 0 && a) {
            init_error = atoi(a);
        } else if (strcmp(key, "driver") == 0 && a) {
            snprintf(driver, sizeof driver, "%s", a);
        } else if (strcmp(key, "cuda-driver") == 0 && a) {
            cuda_driver = atoi(a);
        } else if (strcmp(key, "hang") == 0 && a && nhangs < MAX_HANGS) {
            char *ms = strtok_r(NULL, " \t", &save);
            snprintf(hangs[nhangs].sym, sizeof hangs[nhangs].sym, "%s", a);
            hangs[nhangs].ms = ms ? atol(ms) : -1;
            nhangs++;
        } else if (strcmp(key, "missing") == 0 && a && nmissing < MAX_MISSING) {
            snprintf(missing[nmissing++], sizeof missing[0], "%s", a);
        } else if (strcmp(key, "event") == 0 && a && nevents < MAX_EVENTS) {
            char *kind = strtok_r(NULL, " \t", &save);
            char *data = strtok_r(NULL, " \t", &save);
            char *delay = strtok_r(NULL, " \t", &save);
            if (!kind || !data || !delay) { rc = bad(path, lineno, raw); break; }
            fevent *e = &events[nevents];
            memset(e, 0, sizeof *e);
            e->gpu = atoi(a);
            if (strcmp(kind, "xid") == 0) e->type = EV_XID;
            else if (strcmp(kind, "ecc-single") == 0) e->type = EV_SINGLE_ECC;
            else if (strcmp(kind, "ecc-double") == 0) e->type = EV_DOUBLE_ECC;
            else { rc = bad(path, lineno, raw); break; }
            e->data = strtoull(data, NULL, 0);
            if (delay[0] == '@') snprintf(e->when, sizeof e->when, "%s", delay + 1);
            else e->delay_ms = atol(delay);
            nevents++;
        } else if (strcmp(key, "gpu") == 0 && a) {
            int i = atoi(a);
            char *prop = strtok_r(NULL, " \t", &save);
            if (i < 0 || i >= MAX_GPUS || !prop) { rc = bad(path, lineno, raw); break; }
            fgpu *g = &gpus[i];
            char rest[256] = "";
            if (save) snprintf(rest, sizeof rest, "%s", save + strspn(save, " \t"));
            char *v1 = strtok_r(NULL, " \t", &save);
            char *v2 = strtok_r(NULL, " \t", &save);
            char *v3 = strtok_r(NULL, " \t", &save);
            char *v4 = strtok_r(NULL, " \t", &save);
            if (strcmp(prop, "name") == 0 && *rest) {
                snprintf(g->name, sizeof g->name, "%s", rest);
            } else if (strcmp(prop, "uuid") == 0 && v1) {
                snprintf(g->uuid, sizeof g->uuid, "%s", v1);
            } else if (strcmp(prop, "memory") == 0 && v1) {
                g->mem_total_mib = strtoull(v1, NULL, 10);
                g->mem_used_mib = v2 ? strtoull(v2, NULL, 10) : 0;
            } else if (strcmp(prop, "ecc") == 0 && v1 && v2 && v3) {
                /* gpu I ecc corrected|uncorrected volatile|aggregate N */
                int t = strcmp(v1, "uncorrected") == 0 ? 1 : 0;
                int c = strcmp(v2, "aggregate") == 0 ? 1 : 0;
                g->ecc[t][c] = strtoull(v3, NULL, 10);
            } else if (strcmp(prop, "lost") == 0) {
                g->handle_error = E_GPU_IS_LOST;
            } else if (strcmp(prop, "unknown-error") == 0) {
                g->handle_error = E_UNKNOWN;
            } else if (strcmp(prop, "query-error") == 0 && v1) {
                g->query_error = atoi(v1);
            } else if (strcmp(prop, "retired-pending") == 0) {
                g->retired_pending = v1 ? (unsigned)atoi(v1) : 1;
            } else if (strcmp(prop, "remap") == 0 && v1 && v2 && v3 && v4) {
                g->remap[0] = atoi(v1); g->remap[1] = atoi(v2);
                g->remap[2] = atoi(v3); g->remap[3] = atoi(v4);
            } else if (strcmp(prop, "clocks-event-reasons") == 0 && v1) {
                g->clocks = strtoull(v1, NULL, 0);
            } else if (strcmp(prop, "temperature") == 0 && v1) {
                g->temp = atoi(v1);
                if (v2) g->slowdown = atoi(v2);
                if (v3) g->shutdown = atoi(v3);
            } else if (strcmp(prop, "compute-mode") == 0 && v1) {
                g->compute_mode = compute_mode_value(v1);
                if (g->compute_mode == 99) { rc = bad(path, lineno, raw); break; }
            } else if (strcmp(prop, "process") == 0 && v1 && g->nprocs < MAX_PROCS) {
                fproc *p = &g->procs[g->nprocs++];
                p->pid = atoi(v1);
                p->mib = v2 ? strtoull(v2, NULL, 10) : 0;
                snprintf(p->name, sizeof p->name, "%s", v3 ? v3 : "python");
            } else if (strcmp(prop, "mig") == 0 && v1) {
                g->nmig = atoi(v1);
                if (g->nmig > MAX_MIG) { rc = bad(path, lineno, raw); break; }
                g->mig_mode = 1;
            } else if (strcmp(prop, "unsupported") == 0 && v1 && field_index(v1) >= 0) {
                g->unsupported[field_index(v1)] = 1;
            } else if (strcmp(prop, "field-error") == 0 && v1 && v2 && field_index(v1) >= 0) {
                g->field_error[field_index(v1)] = atoi(v2);
            } else if (strcmp(prop, "mps-process") == 0 && v1 && g->nmps < MAX_PROCS) {
                fproc *p = &g->mps[g->nmps++];
                p->pid = atoi(v1);
                p->mib = v2 ? strtoull(v2, NULL, 10) : 0;
                snprintf(p->name, sizeof p->name, "%s", v3 ? v3 : "python");
            } else if (strcmp(prop, "recovery-action") == 0 && v1) {
                g->recovery = (unsigned)atoi(v1);
            } else if (strcmp(prop, "fabric") == 0 && v1) {
                g->fabric = 1;
                g->fabric_state = (unsigned)atoi(v1);
                g->fabric_status = v2 ? (unsigned)atoi(v2) : 0;
            } else if (strcmp(prop, "persistence") == 0 && v1) {
                g->persistence = (unsigned)atoi(v1);
            } else if (strcmp(prop, "pcie") == 0 && v1 && v2 && v3 && v4) {
                g->pcie[0] = atoi(v1); g->pcie[1] = atoi(v2);
                g->pcie[2] = atoi(v3); g->pcie[3] = atoi(v4);
            } else if (strcmp(prop, "utilization") == 0 && v1) {
                g->util_gpu = (unsigned)atoi(v1);
            } else if (strcmp(prop, "nvlink") == 0 && v1) {
                g->nlinks = atoi(v1);
                if (g->nlinks < 0 || g->nlinks > MAX_LINKS) { rc = bad(path, lineno, raw); break; }
                g->links_down = v2 ? (unsigned)strtoul(v2, NULL, 0) : 0;
            } else if (strcmp(prop, "nvlink-errors") == 0 && v1) {
                g->link_error_step = strtoull(v1, NULL, 10);
            } else {
                rc = bad(path, lineno, raw);
                break;
            }
        } else {
            rc = bad(path, lineno, raw);
            break;
        }
    }
    fclose(fh);
    return rc;
}

static nvmlReturn_t do_init(const char *sym) {
    pthread_mutex_lock(&mu);
    int rc = load_scenario();
    pthread_mutex_unlock(&mu);
    if (rc != 0) return E_UNKNOWN;
    maybe_hang("nvmlInit");
    maybe_hang(sym);
    if (init_error) return init_error;
    pthread_mutex_lock(&mu);
    initialized++;
    pthread_mutex_unlock(&mu);
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init("nvmlInitWithFlags"); }
nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }

nvmlReturn_t nvmlShutdown(void) {
    maybe_hang("nvmlShutdown");
    pthread_mutex_lock(&mu);
    int was = initialized;
    if (initialized > 0) initialized--;
    pthread_mutex_unlock(&mu);
    return was ? OK : E_UNINITIALIZED;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINITIALIZED: return "Uninitialized";
    case E_INVALID_ARGUMENT: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_NO_PERMISSION: return "Insufficient Permissions";
    case E_NOT_FOUND: return "Not Found";
    case E_INSUFFICIENT_SIZE: return "Insufficient Size";
    case E_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case E_TIMEOUT: return "Timeout";
    case E_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case E_FUNCTION_NOT_FOUND: return "Function Not Found";
    case E_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case E_GPU_IS_LOST: return "GPU is lost";
    case E_RESET_REQUIRED: return "GPU requires restart";
    default: return "Unknown Error";
    }
}

/* A scenario's `missing SYMBOL`: the call answers FUNCTION_NOT_FOUND, as an older (or newer) driver's
 * NVML that lacks it would through the bindings. */
static int is_missing(const char *sym) {
    for (int i = 0; i < nmissing; i++)
        if (strcmp(missing[i], sym) == 0) return 1;
    return 0;
}

/* Common prologue: initialised, optional hang, a valid handle, the GPU's query error. */
#define ENTER(sym) do { \
        if (is_missing(sym)) return E_FUNCTION_NOT_FOUND; \
        maybe_hang(sym); \
        if (!initialized) return E_UNINITIALIZED; \
    } while (0)

static fgpu *gpu_of(void *handle, nvmlReturn_t *err) {
    fdev *d = (fdev *)handle;
    if (!d || d->gpu < 0 || d->gpu >= ngpus) { *err = E_INVALID_ARGUMENT; return NULL; }
    fgpu *g = &gpus[d->gpu];
    if (g->handle_error) { *err = g->handle_error; return NULL; }
    if (g->query_error) { *err = g->query_error; return NULL; }
    *err = OK;
    return g;
}

#define GPU_OR_RETURN(g, handle) \
    nvmlReturn_t _err; fgpu *g = gpu_of(handle, &_err); if (!g) return _err

#define SUPPORTED_OR_RETURN(g, field) do { \
        if ((g)->unsupported[field]) return E_NOT_SUPPORTED; \
        if ((g)->field_error[field]) return (g)->field_error[field]; \
    } while (0)

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return E_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return E_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return OK;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetDriverVersion");
    return copy_str(version, length, driver);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER("nvmlDeviceGetCount_v2");
    if (!count) return E_INVALID_ARGUMENT;
    *count = (unsigned int)ngpus;
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    ENTER("nvmlDeviceGetHandleByIndex_v2");
    if (!device || index >= (unsigned int)ngpus) return E_INVALID_ARGUMENT;
    if (gpus[index].handle_error) return gpus[index].handle_error;
    *device = &phys[index];
    return OK;
}

nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned int *index) {
    ENTER("nvmlDeviceGetIndex");
    GPU_OR_RETURN(g, device);
    (void)g;
    *index = (unsigned int)((fdev *)device)->gpu;
    return OK;
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    ENTER("nvmlDeviceGetName");
    GPU_OR_RETURN(g, device);
    fdev *d = device;
    if (d->mig >= 0) {
        char buf[160];
        snprintf(buf, sizeof buf, "%s MIG 1g.10gb", g->name);
        return copy_str(name, length, buf);
    }
    return copy_str(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    ENTER("nvmlDeviceGetUUID");
    GPU_OR_RETURN(g, device);
    fdev *d = device;
    if (d->mig >= 0) {
        char buf[160];
        snprintf(buf, sizeof buf, "MIG-%08x-fake-4000-8000-%06x%06x", 0xabc0 + d->gpu, d->gpu, d->mig);
        return copy_str(uuid, length, buf);
    }
    return copy_str(uuid, length, g->uuid);
}

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_MEMORY);
    memory->total = g->mem_total_mib << 20;
    memory->used = g->mem_used_mib << 20;
    memory->free = memory->total - memory->used;
    return OK;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, int errorType, int counterType,
                                         unsigned long long *eccCounts) {
    ENTER("nvmlDeviceGetTotalEccErrors");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_ECC);
    if (errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1) return E_INVALID_ARGUMENT;
    *eccCounts = g->ecc[errorType][counterType];
    return OK;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *device, int *isPending) {
    ENTER("nvmlDeviceGetRetiredPagesPendingStatus");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_RETIRED);
    *isPending = (int)g->retired_pending;
    return OK;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    ENTER("nvmlDeviceGetRemappedRows");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_REMAP);
    *corrRows = g->remap[0];
    *uncRows = g->remap[1];
    *isPending = g->remap[2];
    *failureOccurred = g->remap[3];
    return OK;
}

static nvmlReturn_t clocks(void *device, unsigned long long *reasons) {
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_CLOCKS);
    *reasons = g->clocks;
    return OK;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *device, unsigned long long *reasons) {
    ENTER("nvmlDeviceGetCurrentClocksEventReasons");
    return clocks(device, reasons);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *device, unsigned long long *reasons) {
    ENTER("nvmlDeviceGetCurrentClocksThrottleReasons");
    return clocks(device, reasons);
}

nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp) {
    ENTER("nvmlDeviceGetTemperature");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_TEMP);
    if (sensor != 0) return E_INVALID_ARGUMENT;
    *temp = g->temp;
    return OK;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(void *device, int threshold, unsigned int *temp) {
    ENTER("nvmlDeviceGetTemperatureThreshold");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_SLOWDOWN);
    if (threshold == 0) *temp = g->shutdown;
    else if (threshold == 1) *temp = g->slowdown;
    else return E_NOT_SUPPORTED;
    return OK;
}

nvmlReturn_t nvmlDeviceGetComputeMode(void *device, int *mode) {
    ENTER("nvmlDeviceGetComputeMode");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_COMPUTE);
    *mode = (int)g->compute_mode;
    return OK;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    ENTER("nvmlDeviceGetComputeRunningProcesses_v3");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_PROCS);
    if (!infoCount) return E_INVALID_ARGUMENT;
    unsigned int have = *infoCount;
    *infoCount = (unsigned int)g->nprocs;
    if (g->nprocs == 0) return OK;
    if (!infos || have < (unsigned int)g->nprocs) return E_INSUFFICIENT_SIZE;
    for (int i = 0; i < g->nprocs; i++) {
        infos[i].pid = g->procs[i].pid;
        infos[i].usedGpuMemory = g->procs[i].mib << 20;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return OK;
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(void *device, unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos) {
    ENTER("nvmlDeviceGetMPSComputeRunningProcesses_v3");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_PROCS);
    if (!infoCount) return E_INVALID_ARGUMENT;
    unsigned int have = *infoCount;
    *infoCount = (unsigned int)g->nmps;
    if (g->nmps == 0) return OK;
    if (!infos || have < (unsigned int)g->nmps) return E_INSUFFICIENT_SIZE;
    for (int i = 0; i < g->nmps; i++) {
        infos[i].pid = g->mps[i].pid;
        infos[i].usedGpuMemory = g->mps[i].mib << 20;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return OK;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    ENTER("nvmlSystemGetProcessName");
    for (int i = 0; i < ngpus; i++)
        for (int p = 0; p < gpus[i].nprocs; p++)
            if (gpus[i].procs[p].pid == pid) return copy_str(name, length, gpus[i].procs[p].name);
    for (int i = 0; i < ngpus; i++)
        for (int p = 0; p < gpus[i].nmps; p++)
            if (gpus[i].mps[p].pid == pid) return copy_str(name, length, gpus[i].mps[p].name);
    return E_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned int *current, unsigned int *pending) {
    ENTER("nvmlDeviceGetMigMode");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_MIG);
    *current = g->mig_mode;
    *pending = g->mig_mode;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned int *count) {
    ENTER("nvmlDeviceGetMaxMigDeviceCount");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_MIG);
    *count = g->mig_mode ? MAX_MIG : 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, void **mig) {
    ENTER("nvmlDeviceGetMigDeviceHandleByIndex");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_MIG);
    if (!g->mig_mode) return E_INVALID_ARGUMENT;
    if (index >= MAX_MIG) return E_INVALID_ARGUMENT;
    if (index >= g->nmig) return E_NOT_FOUND;
    *mig = &migs[((fdev *)device)->gpu][index];
    return OK;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER("nvmlSystemGetCudaDriverVersion");
    if (!version) return E_INVALID_ARGUMENT;
    if (cuda_driver <= 0) return E_NOT_SUPPORTED;
    *version = cuda_driver;
    return OK;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    ENTER("nvmlSystemGetCudaDriverVersion_v2");
    if (!version) return E_INVALID_ARGUMENT;
    if (cuda_driver <= 0) return E_NOT_SUPPORTED;
    *version = cuda_driver;
    return OK;
}

/* Field values: only the GPU recovery action is known; other ids answer NOT_SUPPORTED per value. */
typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    unsigned int valueType;
    unsigned int nvmlReturn;
    unsigned long long value;
} nvmlFieldValue_t;

nvmlReturn_t nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
    ENTER("nvmlDeviceGetFieldValues");
    GPU_OR_RETURN(g, device);
    if (count < 0 || !values) return E_INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)(now_ms() * 1000);
        v->latencyUsec = 0;
        v->valueType = 1;  /* unsigned int */
        v->value = 0;
        if (v->fieldId != FI_GPU_RECOVERY_ACTION || g->unsupported[F_RECOVERY]) {
            v->nvmlReturn = E_NOT_SUPPORTED;
        } else if (g->field_error[F_RECOVERY]) {
            v->nvmlReturn = (unsigned)g->field_error[F_RECOVERY];
        } else {
            v->nvmlReturn = OK;
            v->value = g->recovery;
        }
    }
    return OK;
}

typedef struct {
    unsigned char clusterUuid[16];
    unsigned int status;
    unsigned int cliqueId;
    unsigned char state;
} nvmlGpuFabricInfo_t;

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *device, nvmlGpuFabricInfo_t *info) {
    ENTER("nvmlDeviceGetGpuFabricInfo");
    GPU_OR_RETURN(g, device);
    if (!g->fabric) return E_NOT_SUPPORTED;
    SUPPORTED_OR_RETURN(g, F_FABRIC);
    if (!info) return E_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->status = g->fabric_status;
    info->cliqueId = 1;
    info->state = (unsigned char)g->fabric_state;
    return OK;
}

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    unsigned int status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

#define FABRIC_INFO_V2 0x02000024u

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *device, nvmlGpuFabricInfo_v2_t *info) {
    ENTER("nvmlDeviceGetGpuFabricInfoV");
    GPU_OR_RETURN(g, device);
    if (!g->fabric) return E_NOT_SUPPORTED;
    SUPPORTED_OR_RETURN(g, F_FABRIC);
    if (!info || info->version != FABRIC_INFO_V2) return E_INVALID_ARGUMENT;
    memset(info->clusterUuid, 0, sizeof info->clusterUuid);
    info->status = g->fabric_status;
    info->cliqueId = 1;
    info->state = (unsigned char)g->fabric_state;
    info->healthMask = 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(void *device, int *mode) {
    ENTER("nvmlDeviceGetPersistenceMode");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_PERSISTENCE);
    *mode = (int)g->persistence;
    return OK;
}

static nvmlReturn_t pcie(void *device, int which, unsigned int *out) {
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_PCIE);
    *out = g->pcie[which];
    return OK;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *device, unsigned int *gen) {
    ENTER("nvmlDeviceGetCurrPcieLinkGeneration");
    return pcie(device, 0, gen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *device, unsigned int *width) {
    ENTER("nvmlDeviceGetCurrPcieLinkWidth");
    return pcie(device, 1, width);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(void *device, unsigned int *gen) {
    ENTER("nvmlDeviceGetMaxPcieLinkGeneration");
    return pcie(device, 2, gen);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(void *device, unsigned int *width) {
    ENTER("nvmlDeviceGetMaxPcieLinkWidth");
    return pcie(device, 3, width);
}

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *util) {
    ENTER("nvmlDeviceGetUtilizationRates");
    GPU_OR_RETURN(g, device);
    SUPPORTED_OR_RETURN(g, F_UTILIZATION);
    util->gpu = g->util_gpu;
    util->memory = 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned int link, int *active) {
    ENTER("nvmlDeviceGetNvLinkState");
    GPU_OR_RETURN(g, device);
    if (!g->nlinks) return E_NOT_SUPPORTED;
    SUPPORTED_OR_RETURN(g, F_NVLINK);
    if (link >= (unsigned int)g->nlinks) return E_INVALID_ARGUMENT;
    *active = (g->links_down >> link) & 1 ? 0 : 1;
    return OK;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(void *device, unsigned int link, int counter,
                                             unsigned long long *value) {
    ENTER("nvmlDeviceGetNvLinkErrorCounter");
    GPU_OR_RETURN(g, device);
    if (!g->nlinks) return E_NOT_SUPPORTED;
    SUPPORTED_OR_RETURN(g, F_NVLINK);
    if (link >= (unsigned int)g->nlinks || counter < 0 || counter > 4) return E_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    if (counter == 0) g->link_errors[link] += g->link_error_step;
    *value = g->link_errors[link];
    pthread_mutex_unlock(&mu);
    return OK;
}

/* Events: each scenario event is due `delay` ms after its GPU was registered in a set,
 * and each set delivers it once. */
typedef struct {
    void *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

nvmlReturn_t nvmlEventSetCreate(void **set) {
    ENTER("nvmlEventSetCreate");
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_SETS; i++) {
        if (!sets[i].used) {
            memset(&sets[i], 0, sizeof sets[i]);
            sets[i].used = 1;
            *set = &sets[i];
            pthread_mutex_unlock(&mu);
            return OK;
        }
    }
    pthread_mutex_unlock(&mu);
    return E_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(void *set) {
    ENTER("nvmlEventSetFree");
    pthread_mutex_lock(&mu);
    ((fset *)set)->used = 0;
    pthread_mutex_unlock(&mu);
    return OK;
}

static const unsigned long long SUPPORTED_EVENTS = EV_SINGLE_ECC | EV_DOUBLE_ECC | EV_PSTATE | EV_XID | EV_CLOCK;

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    ENTER("nvmlDeviceGetSupportedEventTypes");
    GPU_OR_RETURN(g, device);
    *types = g->unsupported[F_EVENTS] ? 0 : SUPPORTED_EVENTS;
    return OK;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    ENTER("nvmlDeviceRegisterEvents");
    GPU_OR_RETURN(g, device);
    if (g->unsupported[F_EVENTS] || (types & ~SUPPORTED_EVENTS)) return E_NOT_SUPPORTED;
    fset *s = set;
    int i = ((fdev *)device)->gpu;
    pthread_mutex_lock(&mu);
    s->mask[i] |= types;
    s->registered_at[i] = now_ms();
    pthread_mutex_unlock(&mu);
    return OK;
}

nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeoutms) {
    ENTER("nvmlEventSetWait_v2");
    fset *s = set;
    double deadline = now_ms() + timeoutms;
    for (;;) {
        double t = now_ms(), next = -1;
        pthread_mutex_lock(&mu);
        for (int e = 0; e < nevents; e++) {
            fevent *ev = &events[e];
            if (s->delivered[e] || ev->gpu < 0 || ev->gpu >= ngpus || !(s->mask[ev->gpu] & ev->type))
                continue;
            /* An event due when a file appears is looked for on every poll (20 ms). */
            double due = !ev->when[0] ? s->registered_at[ev->gpu] + ev->delay_ms
                         : access(ev->when, F_OK) == 0 ? t : t + 20;
            if (due <= t) {
                s->delivered[e] = 1;
                data->device = &phys[ev->gpu];
                data->eventType = ev->type;
                data->eventData = ev->data;
                data->gpuInstanceId = 0xFFFFFFFFu;
                data->computeInstanceId = 0xFFFFFFFFu;
                pthread_mutex_unlock(&mu);
                return OK;
            }
            if (next < 0 || due < next) next = due;
        }
        pthread_mutex_unlock(&mu);
        if (t >= deadline) return E_TIMEOUT;
        double until = next < 0 || next > deadline ? deadline : next;
        long ms = (long)(until - t) + 1;
        sleep_ms(ms > 20 ? 20 : ms);
    }
}
