/* A healthy nvidia-smi for the benchmark: one GPU, answering the suite's query
 * (--query-gpu=index,name,uuid --format=csv,noheader,nounits). A C program, as the real
 * one is: a script would add an interpreter's start that the real thing does not have. */
#include <stdio.h>

int main(void) {
    puts("0, NVIDIA H100 80GB HBM3, GPU-0000abc0-fake-4000-8000-000000000000");
    return 0;
}
