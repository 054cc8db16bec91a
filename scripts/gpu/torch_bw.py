"""all_reduce bandwidth through torch.distributed (NCCL backend): SIZE_MIB (default 1024) of
float32, WARMUP (3) untimed rounds, then ITERS (10) timed; prints the bus bandwidth as
nccl-tests counts it (bytes x 2(n-1)/n per second) and checks the last result.

Run with torchrun --nproc_per_node 2.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # AS_HOSTS=1: every rank a host of its own to NCCL (NCCL_HOSTID) on the GPUs there are,
    # as two hosts on one GPU under MPS.
    if os.environ.get("AS_HOSTS") == "1":
        os.environ["NCCL_HOSTID"] = f"h{rank}"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    size = int(os.environ.get("SIZE_MIB", "1024")) << 20
    warmup, iters = int(os.environ.get("WARMUP", "3")), int(os.environ.get("ITERS", "10"))
    dist.init_process_group("nccl")
    x = torch.ones(size // 4, device="cuda")
    for _ in range(warmup):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    start = time.time()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    each = (time.time() - start) / iters
    x.fill_(float(rank + 1))
    dist.all_reduce(x)
    good = bool(torch.all(x == world * (world + 1) / 2).item())
    busbw = size * 2 * (world - 1) / world / each / 1e9
    if rank == 0:
        print(f"RESULT busbw_gbs={busbw:.2f} time_ms={each * 1e3:.1f} correct={'yes' if good else 'NO'}", flush=True)
    dist.destroy_process_group()
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
