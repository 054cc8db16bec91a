"""Communicator churn: create a NCCL process group, all-reduce 1 MiB through it (checked),
destroy it; ROUNDS times (default 40). Prints the total and the median round in seconds.

Run with torchrun --nproc_per_node 2. Each round is a new NCCL communicator; NCCL 2.28 unloads
the network plugin when its last communicator goes and loads it again for the next, so this
measures everything a short-lived group costs: loading, provider set-up, connecting, closing.
"""
import os
import statistics
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
    rounds = int(os.environ.get("ROUNDS", "40"))
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]) + 1,
        world,
        rank == 0,
        timeout=timedelta(seconds=120),
    )
    expected = world * (world + 1) / 2
    ok, took = True, []
    start = time.time()
    for r in range(rounds):
        t = time.time()
        dist.init_process_group(
            "nccl", store=dist.PrefixStore(f"churn{r}", base), rank=rank, world_size=world
        )
        x = torch.full((1 << 18,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        ok &= bool(torch.all(x == expected).item())
        dist.destroy_process_group()
        took.append(time.time() - t)
    total = time.time() - start
    if rank == 0:
        print(
            f"RESULT churn rounds={rounds} total_s={total:.2f} median_s={statistics.median(took):.3f} "
            f"first_s={took[0]:.3f} correct={'yes' if ok else 'NO'}",
            flush=True,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
