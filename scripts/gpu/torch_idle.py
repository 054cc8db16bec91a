"""What an idle NCCL job costs: all-reduce, sleep IDLE seconds, all-reduce again; prints the
CPU seconds each process spent during the sleep (as cores) and its RSS.

Run with torchrun --nproc_per_node 2, with NCCL's Socket transport or the plugin.
"""
import os
import resource
import time

import torch
import torch.distributed as dist


def cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main() -> None:
    rank = int(os.environ["RANK"])
    # AS_HOSTS=1: every rank a host of its own to NCCL (NCCL_HOSTID) on the GPUs there are,
    # as two hosts on one GPU under MPS.
    if os.environ.get("AS_HOSTS") == "1":
        os.environ["NCCL_HOSTID"] = f"h{rank}"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    idle = float(os.environ.get("IDLE", "10"))
    dist.init_process_group("nccl")
    x = torch.ones(64 << 18, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    time.sleep(2)
    c0 = cpu()
    time.sleep(idle)
    cores = (cpu() - c0) / idle
    dist.all_reduce(x)
    torch.cuda.synchronize()
    rss = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
    print(f"RESULT rank={rank} idle_cores={cores:.3f} rss_mib={rss}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
