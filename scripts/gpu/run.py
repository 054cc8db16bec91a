#!/usr/bin/env python3
"""Real NCCL through the plugin on a GPU machine: builds libfabric with CUDA support, then runs
nccl-tests and PyTorch with every byte crossing the plugin, and writes logs and a summary table.

Usage: python3 scripts/gpu/run.py [--dry-run] STAGE...
  --dry-run   print the commands the stages would run, and run nothing

The shape of the runs: two GPUs in one process (-g 2) where the machine has two GPUs, else two
ranks as two hosts on GPU 0 (MPS, mpirun -np 2, NCCL_HOSTID per rank, -g 1, the MPI build of
nccl-tests; the torch scripts get AS_HOSTS=1). SHAPE=hosts forces the second.

scripts/gpu/prepare.sh makes the inputs on the Debian build machine. Inputs (environment):
  PLUGIN_DIR        folder with libnccl_net_fabric.so and nccl-net-fabric
                    (default .scratch/gpu-in/plugin)
  BASELINE_DIR      folder with an earlier libnccl_net_fabric.so (default .scratch/gpu-in/baseline)
  LIBFABRIC_TARBALL libfabric source: a tree prepared with ./autogen.sh (GPU machines may have no
                    libtool) or the orig tarball (default: whichever is in .scratch/gpu-in)
  NCCL_TESTS_SRC    a copy of NVIDIA/nccl-tests, kept out of this repository
                    (default .scratch/gpu-in/nccl-tests)
  NCCL_SRC_DIR      NCCL source tarballs nccl-<tag>.tar.xz (git archive of NVIDIA/nccl tags, kept
                    out of this repository; default .scratch/gpu-in/nccl-src)
  NCCL_TESTS_DIR    nccl-tests build folder with the *_perf binaries (default: the nccltests stage's)
  NCCL_TESTS_MPI_DIR the same built with MPI=1 (default: the nccltests stage's)
  NCCL_PROFILER_TARBALL ext-profiler/example of NCCL's source, for the steps stage (kept out of
                    this repository; default .scratch/gpu-in/nccl-profiler.tar.xz)
  PERF_TARBALL      perf and its libraries (scripts/gpu/prepare.sh; default .scratch/gpu-in/perf.tar.xz)
  OUT               where logs and summary.md go (default .scratch/gpu-out)
  TIMEOUT           seconds allowed per benchmark (default 150): a run past it counts as a hang
  ITERS, WARMUP     nccl-tests -n / -w (default 10 / 3)
  MINBYTES, MAXBYTES nccl-tests -b / -e (default 1M / 1G)
"""
import inspect
import os
import sys
import time

from gpurun import build, collectives, fabtests, hosts, torchruns, ucx
from gpurun.config import OUT, REPO, SUMMARY, WORK, env_or, now
from gpurun.record import note
from gpurun.runner import Failed, export, log, mkdirs, prepend_library_path, probe


def stage_all():
    """libfabric nccltests doctor loading collectives variants mpi torch (about 10 min)"""
    run_stages(["libfabric", "nccltests", "doctor", "loading", "collectives", "variants", "mpi", "torch"])


STAGES = {
    "libfabric": build.stage_libfabric,
    "nccltests": build.stage_nccltests,
    "pack": build.stage_pack,
    "ncclbuild": build.stage_ncclbuild,
    "fabtests": build.stage_fabtests,
    "doctor": collectives.stage_doctor,
    "loading": collectives.stage_loading,
    "collectives": collectives.stage_collectives,
    "variants": collectives.stage_variants,
    "compare": collectives.stage_compare,
    "mpi": collectives.stage_mpi,
    "bound": collectives.stage_bound,
    "latency": collectives.stage_latency,
    "memory": collectives.stage_memory,
    "versions": collectives.stage_versions,
    "torch": torchruns.stage_torch,
    "idle": torchruns.stage_idle,
    "torchhosts": torchruns.stage_torchhosts,
    "hosts": hosts.stage_hosts,
    "capped": hosts.stage_capped,
    "paced": hosts.stage_paced,
    "targets": hosts.stage_targets,
    "verdict": hosts.stage_verdict,
    "threads": hosts.stage_threads,
    "steps": hosts.stage_steps,
    "ucx": ucx.stage_ucx,
    "ucxhosts": ucx.stage_ucxhosts,
    "conform": ucx.stage_conform,
    "scale": hosts.stage_scale,
    "ceiling": fabtests.stage_ceiling,
    "pingpong": fabtests.stage_pingpong,
    "all": stage_all,
}


def run_stages(names):
    for name in names:
        log(f"stage {name}")
        if now.dry:
            print(f"# stage {name}", flush=True)
        try:
            STAGES[name]()
        except Failed as e:
            if str(e):
                log(str(e))
            log(f"stage {name} failed")


def usage():
    stages = "".join(f"  {name:<12} " + inspect.cleandoc(fn.__doc__).replace("\n", "\n" + " " * 15) + "\n"
                     for name, fn in STAGES.items())
    return f"{__doc__}\nStages:\n{stages}"


def main(args):
    if not args or "-h" in args or "--help" in args:
        print(usage(), end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    now.dry = "--dry-run" in args
    names = [a for a in args if a != "--dry-run"]
    unknown = [n for n in names if n not in STAGES]
    if unknown or not names:
        print(f"no stage {' '.join(unknown)} (--help lists them)" if unknown else usage(), file=sys.stderr)
        return 2
    os.chdir(REPO)
    mkdirs(f"{OUT}/logs", WORK)
    # Never let NVLink multicast be used on a shared machine.
    export("NCCL_NVLS_ENABLE", "0")
    export("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    export("NVSHMEM_DISABLE_NVLS", "1")
    gpus = len(probe(["nvidia-smi", "-L"], "").splitlines())
    now.shape = env_or("SHAPE", "gpus" if gpus >= 2 else "hosts")
    if now.shape == "hosts":
        export("AS_HOSTS", "1")
    now.nccl_dir = probe(["python3", "-c", "import nvidia.nccl as m; print(list(m.__path__)[0])"], "<nvidia.nccl>")
    if now.nccl_dir:
        prepend_library_path(f"{now.nccl_dir}/lib")
    version = "import torch; print('.'.join(map(str, torch.cuda.nccl.version())))"
    note(f"# nccl-net-fabric on a GPU machine, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}", "",
         f"NCCL {probe(['python3', '-c', version], '')}, "
         f"torch {probe(['python3', '-c', 'import torch; print(torch.__version__)'], '')}, libfabric 2.1.0 (built here "
         f"with CUDA), {gpus} GPUs; nccl-tests -b 1M -e 1G -f 4 -n {env_or('ITERS', '10')} -w {env_or('WARMUP', '3')}")
    run_stages(names)
    log(f"done: {SUMMARY}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
