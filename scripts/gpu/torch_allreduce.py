"""All-reduce through torch.distributed (NCCL backend) with the plugin loaded; checks the sum.

Run with torchrun --nproc_per_node 2. Every rank contributes rank+1, so each element of the
result must be n*(n+1)/2. With ROUNDS=n (default 1) the process group is created, used and
destroyed n times: NCCL 2.28 unloads the plugin when its last communicator goes and loads it
again for the next. Exits non-zero on a wrong result.
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # AS_HOSTS=1: every rank a host of its own to NCCL (NCCL_HOSTID) on the GPUs there are,
    # as two hosts on one GPU under MPS.
    if os.environ.get("AS_HOSTS") == "1":
        os.environ["NCCL_HOSTID"] = f"h{rank}"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    rounds = int(os.environ.get("ROUNDS", "1"))
    # A store of our own, so that every round's group starts from fresh keys.
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]) + 1,
        world,
        rank == 0,
        timeout=timedelta(seconds=120),
    )
    expected = world * (world + 1) / 2
    ok = True
    for r in range(rounds):
        dist.init_process_group(
            "nccl", store=dist.PrefixStore(f"round{r}", base), rank=rank, world_size=world
        )
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
                print(
                    f"round {r}: all_reduce {mib} MiB: {'correct' if good else 'WRONG'} "
                    f"({took * 1e3:.1f} ms)",
                    flush=True,
                )
        dist.destroy_process_group()
    if rank == 0:
        print("RESULT torch_allreduce=" + ("ok" if ok else "wrong"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
