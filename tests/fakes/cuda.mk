# The fake CUDA driver the checkpoint tests load (kept apart from the NVML fake's Makefile).
# `make -C tests/fakes -f cuda.mk` builds build/cuda/libcuda.so.1 (a 555+ driver with the
# checkpoint API) and build/cuda-old/libcuda.so.1 (an older driver without it).
CC ?= gcc
CFLAGS ?= -O2 -g -Wall -Wextra -Werror -std=c11
BUILD := build

.PHONY: all clean

all: $(BUILD)/cuda/libcuda.so.1 $(BUILD)/cuda-old/libcuda.so.1

$(BUILD)/cuda/libcuda.so.1: fake_cuda.c cuda.mk
	mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ fake_cuda.c

$(BUILD)/cuda-old/libcuda.so.1: fake_cuda.c cuda.mk
	mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DNO_CHECKPOINT_API -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ fake_cuda.c

clean:
	rm -rf $(BUILD)/cuda $(BUILD)/cuda-old
