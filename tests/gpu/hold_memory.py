"""Test only: hold nearly all free memory of one GPU, as a workload would, until killed.

    python hold_memory.py [INDEX]

Allocates with torch.empty in 1 GiB, then 64 MiB, then 2 MiB pieces until CUDA is out of
memory, gives back a few MiB so that this process itself keeps working, prints
``HOLDING FREE_BYTES TOTAL_BYTES`` and waits for SIGTERM. Only memory is taken: no GPU
setting is touched, and everything is released when the process ends.
"""

from __future__ import annotations

import signal
import sys


def main() -> None:
    import torch

    device = torch.device("cuda", int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    held = []
    for piece in (1 << 30, 64 << 20, 2 << 20):
        while True:
            try:
                held.append(torch.empty(piece, dtype=torch.uint8, device=device))
            except RuntimeError:  # torch.cuda.OutOfMemoryError
                break
    for _ in range(4):  # "minus a little": 8 MiB back
        if held and held[-1].numel() == 2 << 20:
            held.pop()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    print(f"HOLDING {free} {total} {len(held)}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
