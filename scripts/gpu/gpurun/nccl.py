"""NCCL under each transport: Socket shapes, the plugin, two ranks as two hosts, nccl-tests and
torchrun runs with their rows."""
import os
import re
import shutil
import subprocess
import threading
import time

from gpurun.config import (
    AS_HOST,
    BASELINE_DIR,
    INFO,
    LF,
    NCCL_TESTS_DIR,
    NCCL_TESTS_MPI_DIR,
    NET_ONLY,
    OUT,
    PLUGIN,
    PLUGIN_DIR,
    TIMEOUT,
    TORCHRUN,
    WORK,
    env_or,
    now,
)
from gpurun.runner import (
    cost,
    execute,
    export,
    finish,
    log,
    logf,
    measured,
    mkdirs,
    prepend_library_path,
    probe,
    seconds,
    start,
    timed,
)
from gpurun.record import grep, note, row


SOCKET_SHAPES = {"socket": [], "socket4x4": ["NCCL_SOCKET_NTHREADS=4", "NCCL_NSOCKS_PERTHREAD=4"],
                 "socket2x8": ["NCCL_SOCKET_NTHREADS=2", "NCCL_NSOCKS_PERTHREAD=8"]}


def socket(shape="socket"):
    """NCCL's Socket transport: as shipped, 4 threads x 4 sockets (socket4x4) or 2 x 8 (socket2x8)."""
    return ["NCCL_NET=Socket", "NCCL_NET_PLUGIN=none", *SOCKET_SHAPES[shape]] if shape in SOCKET_SHAPES else []


def fabric(*settings):
    """The plugin, with SETTINGS (VAR=VALUE)."""
    return ["NCCL_NET=Fabric", f"NCCL_NET_PLUGIN={PLUGIN}", *settings]


def baseline(*settings):
    """The plugin in $BASELINE_DIR, with SETTINGS."""
    mkdirs(f"{WORK}/baseline")
    execute(["cp", "-f", f"{BASELINE_DIR}/libnccl_net_fabric.so", f"{WORK}/baseline/libnccl-net-fabric.so"])
    return ["NCCL_NET=Fabric", f"NCCL_NET_PLUGIN={WORK}/baseline/libnccl-net-fabric.so", *settings]


def shape_words():
    return "2 GPUs in one process (-g 2)" if now.shape == "gpus" else "two ranks as two hosts on one GPU (MPS)"


def install_plugin():
    """The plugin under the names NCCL looks for, in .scratch/gpu-work/plugin."""
    mkdirs(f"{WORK}/plugin")
    execute(["cp", "-f", f"{PLUGIN_DIR}/libnccl_net_fabric.so", PLUGIN])
    execute(["ln", "-sf", "libnccl-net-fabric.so", f"{WORK}/plugin/libnccl-net.so"])


def start_mps():
    """MPS, so that two ranks on the one GPU run their kernels at once."""
    export("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps")
    export("CUDA_MPS_LOG_DIRECTORY", "/tmp/mpslog")
    mkdirs("/tmp/mps", "/tmp/mpslog")
    if execute(["pgrep", "-f", "nvidia-cuda-mps-control"], out=os.devnull) != 0 or now.dry:
        execute(["nvidia-cuda-mps-control", "-d"])


def plugin_env():
    """libfabric with CUDA on the library path, the plugin installed, MPS for two hosts."""
    prepend_library_path(f"{LF}/lib")
    install_plugin()
    if now.shape == "hosts":
        start_mps()


def mpirun(bind="--bind-to none"):
    return ["mpirun", "--allow-run-as-root", *bind.split(), "-np", "2"]


def mpi_build_of(tests_dir):
    """The MPI build beside a build of nccl-tests (nccl-tests-mpi-TAG for nccl-tests-TAG)."""
    if tests_dir == NCCL_TESTS_DIR:
        return NCCL_TESTS_MPI_DIR
    return os.path.dirname(tests_dir) + "/nccl-tests-mpi" + tests_dir.rpartition("/nccl-tests")[2]


def hosts_shape():
    """How hosts_run runs nccl-tests, for a table's title."""
    return (f"-b {env_or('MINBYTES', '1M')} -e {env_or('MAXBYTES', '1G')} -f 2 -n {env_or('ITERS', '10')} "
            f"-w {env_or('WARMUP', '3')}" + hosts_env())


def hosts_env():
    return f", {env_or('HOSTS_ENV')}" if env_or("HOSTS_ENV") else ""


def nccl_test(tests_dir, test, *args):
    """One nccl-tests binary in the machine's shape: from TESTS_DIR with -g 2, or as two ranks, two
    hosts, from its MPI build with -g 1 (mpirun $HOSTS_BIND, default --bind-to none)."""
    if now.shape == "gpus":
        return [f"{tests_dir}/{test}", *args, "-g", "2"]
    return [*mpirun(env_or("HOSTS_BIND", "--bind-to none")), *AS_HOST, f"{mpi_build_of(tests_dir)}/{test}",
            *args, "-g", "1"]


def tests_run(name, test, *settings):
    """One nccl-tests run through the plugin (or Socket), P2P and SHM off, timed out at $TIMEOUT,
    its CPU seconds and peak RSS measured; a summary row."""
    log(f"run {name} ({test})")
    t0 = seconds()
    cmd = nccl_test(NCCL_TESTS_DIR, test, "-b", env_or("MINBYTES", "1M"), "-e", env_or("MAXBYTES", "1G"), "-f", "4",
                    "-n", env_or("ITERS", "10"), "-w", env_or("WARMUP", "3"))
    rc = execute(measured(name, timed(cmd)), [*NET_ONLY, *INFO, *settings], out=logf(name))
    row(name, test, rc, seconds() - t0, cost(name))


def hosts_run(name, test, *settings):
    """TEST as two ranks, each a host of its own to NCCL (NCCL_HOSTID), on GPU 0, every byte over
    the network transport; CPU seconds of both ranks, peak RSS of the larger; a summary row.
    $HOSTS_TESTS_DIR names another MPI build of nccl-tests (default $NCCL_TESTS_MPI_DIR).
    $HOSTS_ENV (VAR=VALUE ...) goes to every run, Socket's too. A run still going 10 s before its
    time is up leaves every thread's stack in NAME.stacks."""
    log(f"run {name} ({test}, two hosts)")
    t0 = seconds()
    tests = env_or("HOSTS_TESTS_DIR", NCCL_TESTS_MPI_DIR)
    cmd = [*mpirun(env_or("HOSTS_BIND", "--bind-to none")), *AS_HOST, *INFO, *env_or("HOSTS_ENV").split(), *settings,
           f"{tests}/{test}", "-b", env_or("MINBYTES", "1M"), "-e", env_or("MAXBYTES", "1G"), "-f", "2",
           "-g", "1", "-n", env_or("ITERS", "10"), "-w", env_or("WARMUP", "3")]
    proc = start(measured(name, timed(cmd)), out=logf(name))

    def still_running():
        if proc.poll() is None:
            stacks(test, f"{OUT}/logs/{name}.stacks")

    watcher = threading.Timer(int(TIMEOUT) - 10, still_running)
    watcher.daemon = True
    if not isinstance(proc, int) and int(TIMEOUT) > 10:
        watcher.start()
    rc = finish(proc)
    watcher.cancel()
    row(name, test, rc, seconds() - t0, cost(name))
    if rc in (124, 137) and not now.dry:
        # A killed rank can leave MPS refusing the next client ("busy or unavailable").
        try:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, stderr=subprocess.DEVNULL)
        except OSError:
            pass
        time.sleep(3)
        start_mps()


def stacks(name, path):
    """Each thread of each process called NAME: its name, kernel wait channel and, where gdb is
    installed, its stack."""
    def read(p):
        try:
            with open(p) as f:
                return f.read().rstrip("\n")
        except OSError:
            return ""

    out = []
    for pid in probe(["pgrep", "-x", name], "").split():
        out.append(f"== pid {pid}")
        for tid in sorted(os.listdir(f"/proc/{pid}/task")):
            out.append(f"{tid} {read(f'/proc/{pid}/task/{tid}/comm')} {read(f'/proc/{pid}/task/{tid}/wchan')}")
        if shutil.which("gdb"):
            bt = probe(["timeout", "20", "gdb", "-batch", "-p", pid, "-ex", "thread apply all bt 12"], "")
            out += [line[:200] for line in bt.splitlines() if re.match(r"Thread|#", line)]
    with open(path, "w") as f:
        f.write("".join(f"{line}\n" for line in out))


def torchrun_measured(name, script, *settings):
    """A 2-process torchrun of SCRIPT, timed out at $TIMEOUT, with CPU seconds and peak memory; a
    summary line with its RESULT lines and cost."""
    log(f"run {name}")
    t0 = seconds()
    rc = execute(measured(name, timed([*TORCHRUN, script])), [*NET_ONLY, *INFO, *settings], out=logf(name))
    found = "".join(f"{r} " for r in grep(logf(name), r"RESULT.*", only=True))
    note(f"- {name} (rc={rc}, {seconds() - t0} s): {found} {cost(name)}")
