"""Where things are and what the run is: paths and fixed settings, and what `main` decides once for
the whole run (`now`)."""
import os
import time


def env_or(name, default=""):
    """The environment's NAME, or DEFAULT where it is unset or empty."""
    return os.environ.get(name) or default


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
IN, WORK = f"{REPO}/.scratch/gpu-in", f"{REPO}/.scratch/gpu-work"
LF = f"{WORK}/libfabric-cuda"
PLUGIN_DIR = env_or("PLUGIN_DIR", f"{IN}/plugin")
BASELINE_DIR = env_or("BASELINE_DIR", f"{IN}/baseline")
LIBFABRIC_TARBALL = env_or("LIBFABRIC_TARBALL", next((p for p in (
    f"{IN}/libfabric-2.1.0-autogen.tar.xz", f"{IN}/libfabric_2.1.0.orig.tar.xz") if os.path.exists(p)), ""))
NCCL_TESTS_SRC = env_or("NCCL_TESTS_SRC", f"{IN}/nccl-tests")
NCCL_SRC_DIR = env_or("NCCL_SRC_DIR", f"{IN}/nccl-src")
NCCL_PROFILER_TARBALL = env_or("NCCL_PROFILER_TARBALL", f"{IN}/nccl-profiler.tar.xz")
PERF_TARBALL = env_or("PERF_TARBALL", f"{IN}/perf.tar.xz")
OUT = env_or("OUT", f"{REPO}/.scratch/gpu-out")
TIMEOUT = env_or("TIMEOUT", "150")
NCCL_TESTS_DIR = env_or("NCCL_TESTS_DIR", f"{WORK}/nccl-tests")
NCCL_TESTS_MPI_DIR = env_or("NCCL_TESTS_MPI_DIR", f"{WORK}/nccl-tests-mpi")
SUMMARY = f"{OUT}/summary.md"
PLUGIN = f"{WORK}/plugin/libnccl-net-fabric.so"
# Run by mpirun, `bash -c AS_HOST_SH _ [VAR=VALUE ...] COMMAND ...` makes each rank a host of its
# own on GPU 0.
AS_HOST_SH = 'export NCCL_HOSTID=h$OMPI_COMM_WORLD_RANK NCCL_TESTS_DEVICE=0; exec env "$@"'
AS_HOST = ["bash", "-c", AS_HOST_SH, "_"]
NET_ONLY = ["NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"]
INFO = ["NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET"]
RXM, SHM = "NCCL_FABRIC_PROVIDER=tcp;ofi_rxm", "NCCL_FABRIC_PROVIDER=shm"
NATIVE_TCP = ["NCCL_FABRIC_PROVIDER=tcp", "NCCL_FABRIC_ALLOW_NATIVE_TCP=yes"]
TORCHRUN = ["torchrun", "--standalone", "--nproc_per_node", "2"]
START = time.monotonic()


class Now:
    """What `main` decides once, before any stage runs."""
    dry = False  # --dry-run
    shape = "hosts"  # "gpus" or "hosts"
    nccl_dir = ""  # the NCCL that PyTorch loads: nccl-tests link and run against it


now = Now()
