/* A healthy nvidia-smi for the benchmark: answers the query the suite makes
 * (--query-gpu=index,name,uuid --format=csv,noheader,nounits) for FAKE_SMI_GPUS GPUs
 * (default 1), and `-L`. The real nvidia-smi is a C program: a script stub would add an
 * interpreter's start-up that the real thing does not have. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *env = getenv("FAKE_SMI_GPUS");
    int gpus = env ? atoi(env) : 1;
    int list = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-L") == 0) list = 1;
    for (int i = 0; i < gpus; i++) {
        if (list)
            printf("GPU %d: NVIDIA H100 80GB HBM3 (UUID: GPU-0000abc%x-fake-4000-8000-%012x)\n", i, i, i);
        else
            printf("%d, NVIDIA H100 80GB HBM3, GPU-0000abc%x-fake-4000-8000-%012x\n", i, i, i);
    }
    return 0;
}
