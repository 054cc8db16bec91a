"""All-reduce through torch.distributed (NCCL backend) with the plugin loaded; checks the sum.

Run with torchrun --nproc_per_node 2. Every rank contributes rank+1, so each element of the
result must be n*(n+1)/2. Exits non-zero on a wrong result.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    expected = world * (world + 1) / 2
    ok = True
    for mib in (1, 64, 256):
        x = torch.full((mib << 18,), float(rank + 1), device="cuda")
        torch.cuda.synchronize()
        start = time.time()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        took = time.time() - start
        good = bool(torch.all(x == expected).item())
        ok &= good
        if rank == 0:
            print(f"all_reduce {mib} MiB: {'correct' if good else 'WRONG'} ({took * 1e3:.1f} ms)", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT torch_allreduce=" + ("ok" if ok else "wrong"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
