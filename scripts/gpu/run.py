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
import fcntl
import inspect
import os
import re
import shlex
import shutil
import socket as sockets
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from glob import glob


def env_or(name, default=""):
    """The environment's NAME, or DEFAULT where it is unset or empty."""
    return os.environ.get(name) or default


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
DRY = False  # --dry-run
SHAPE = "hosts"  # "gpus" or "hosts"; main() decides
NCCL_DIR = ""  # the NCCL that PyTorch loads: nccl-tests link and run against it


class Failed(Exception):
    """A stage that cannot go on (the message, if any, says why)."""


# Logging, commands and the summary.

def log(msg):
    print(f"[gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def seconds():
    """Whole seconds since the driver started."""
    return int(time.monotonic() - START)


def need(ok, msg):
    """Fails the stage with MSG unless OK (a dry run goes on)."""
    if not ok:
        if not DRY:
            raise Failed(msg)
        log(f"{msg} (dry run: going on)")


def _environ(env, unset=()):
    e = {k: v for k, v in os.environ.items() if k not in unset}
    e.update(w.partition("=")[::2] for w in env)
    return e


def _shown(cmd, env, out, append, cwd, unset):
    text = " ".join(shlex.quote(str(a)) for a in [*env, *cmd])
    if unset:
        text = "env " + "".join(f"-u {u} " for u in unset) + text
    if out:
        text += f" {'>>' if append else '>'}{shlex.quote(out)} 2>&1"
    return f"(cd {shlex.quote(cwd)} && {text})" if cwd else text


def start(cmd, env=(), out=None, append=False, cwd=None, unset=(), _bg=True):
    """Starts CMD with the VAR=VALUE words of ENV added to the environment (the names in UNSET
    taken out), output and errors to the file OUT. Returns the process, or its exit code where
    there is none (0 in a dry run, which prints the command instead; 127 if it cannot start)."""
    if DRY:
        print(_shown(cmd, env, out, append, cwd, unset) + (" &" if _bg else ""), flush=True)
        return 0
    f = open(out, "a" if append else "w") if out else None
    try:
        return subprocess.Popen([str(a) for a in cmd], env=_environ(env, unset), cwd=cwd, stdout=f,
                                stderr=subprocess.STDOUT if f else None)
    except OSError as e:
        print(f"{cmd[0]}: {e}", file=f or sys.stderr)
        return 127
    finally:
        if f:
            f.close()


def finish(proc):
    """The exit code of a process from start(), as a shell gives it (128 + N for signal N)."""
    if isinstance(proc, int):
        return proc
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc


def execute(cmd, env=(), out=None, append=False, cwd=None, unset=()):
    """Runs CMD as start() does and returns its exit code."""
    return finish(start(cmd, env, out, append, cwd, unset, _bg=False))


def capture(cmd, env=(), merge=False):
    """Runs CMD and returns (its exit code, its output; with MERGE its errors too)."""
    if DRY:
        print(_shown(cmd, env, None, False, None, ()), flush=True)
        return 0, ""
    try:
        p = subprocess.run([str(a) for a in cmd], env=_environ(env), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT if merge else None, text=True, errors="replace")
    except OSError as e:
        print(f"{cmd[0]}: {e}", file=sys.stderr)
        return 127, ""
    return (128 - p.returncode if p.returncode < 0 else p.returncode), p.stdout


def probe(cmd, placeholder):
    """CMD's output less its last newline ("" where it cannot run); PLACEHOLDER in a dry run."""
    if DRY:
        return placeholder
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.rstrip("\n")
    except OSError:
        return ""


def timed(cmd, secs=None, kill=True):
    """CMD under timeout(1): SECS (default $TIMEOUT), then with KILL a SIGKILL 10 s later."""
    return ["timeout", *(["-k", "10"] if kill else []), secs or TIMEOUT, *cmd]


def logf(name):
    return f"{OUT}/logs/{name}.log"


def measured(name, cmd):
    """CMD under scripts/gpu/measure.py, which writes its CPU seconds and memory to NAME.cost."""
    if not DRY and os.path.exists(f"{OUT}/logs/{name}.cost"):
        os.remove(f"{OUT}/logs/{name}.cost")
    return ["python3", "scripts/gpu/measure.py", f"{OUT}/logs/{name}.cost", *cmd]


def cost(name):
    try:
        with open(f"{OUT}/logs/{name}.cost") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


def mkdirs(*paths):
    for p in paths:
        if DRY:
            print(f"mkdir -p {shlex.quote(p)}")
        else:
            os.makedirs(p, exist_ok=True)


def remove(path):
    if DRY:
        print(f"rm -rf {shlex.quote(path)}")
    else:
        shutil.rmtree(path, ignore_errors=True)


def sleep(secs):
    if not DRY:
        time.sleep(secs)


def export(name, value):
    if DRY:
        print(f"export {name}={shlex.quote(value)}")
    os.environ[name] = value


def prepend_library_path(path):
    old = os.environ.get("LD_LIBRARY_PATH", "")
    if not old.startswith(f"{path}:"):
        export("LD_LIBRARY_PATH", f"{path}:{old}")


@contextmanager
def overriding(**settings):
    """The environment with SETTINGS while the block runs (a stage run with other settings)."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def summary(text):
    """Appends TEXT to the summary (not in a dry run)."""
    if not DRY:
        with open(SUMMARY, "a") as f:
            f.write(text)


def note(*lines):
    summary("".join(f"{line}\n" for line in lines))


def table_header(title):
    note("", f"## {title}", "",
         "| run | test | path | busbw @1 GiB (GB/s) | avg busbw (GB/s) | #wrong | status | time | cost |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def row(name, test, rc, secs, cost_=""):
    """The summary row (see table_header) of run NAME from its nccl-tests log."""
    path = logf(name)
    avg = [re.sub(r"[ A-Z]", "", (line.split(":") + [""])[1]) for line in lines(path) if "Avg bus bandwidth" in line]
    gib = [w[7] for w in results(path) if w[0] == "1073741824"]
    via = grep(path, r"via NET/[A-Za-z]*", 1, only=True)
    status = "ok" if rc == 0 else f"HUNG (killed after {TIMEOUT}s)" if rc in (124, 137) else f"failed rc={rc}"
    note(f"| {name} | {test} | {via[0] if via else '?'} | {gib[-1] if gib else '-'} | {(avg or [''])[-1] or '-'} "
         f"| {wrong(path)} | {status} | {secs}s | {cost_.rsplit(' rc=', 1)[0]} |")


# Reading logs.

def lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def grep(path, pattern, limit=None, only=False):
    """The lines of PATH that match PATTERN (with ONLY, the matches) in its first LIMIT lines that match."""
    found, n = [], 0
    for line in lines(path):
        if re.search(pattern, line):
            found += [m.group(0) for m in re.finditer(pattern, line)] if only else [line]
            n += 1
            if n == limit:
                break
    return found


def num(text):
    """TEXT's leading number (0 if none), as awk reads a field."""
    m = re.match(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text)
    return float(m.group(0)) if m else 0.0


def fmt(x):
    """A number as awk prints it."""
    return str(int(x)) if x == int(x) else f"{x:.6g}"


def results(path):
    """The result lines of an nccl-tests log, split into fields."""
    return [w for w in map(str.split, lines(path)) if len(w) >= 13 and re.fullmatch(r"[0-9]+", w[0])]


def wrong(path):
    """#wrong of every result of an nccl-tests log, out of place and in place."""
    return fmt(sum(num(w[8]) + num(w[12]) for w in results(path)))


def at_gib(path, text):
    """TEXT formatted with the fields of each 1 GiB result of an nccl-tests log."""
    return [text.format(*w) for w in results(path) if w[0] == "1073741824"]


def channels(path, pattern=r"via NET/[A-Za-z]+/[0-9]+"):
    """How many channels use each NET device, as `sort | uniq -c` counts them, on one line."""
    return "".join(f" {n} {via};" for via, n in sorted(Counter(grep(path, pattern, only=True)).items()))


def variants(text):
    """The ;-separated VAR=VALUE lists of TEXT (none in an empty one)."""
    v = text.split("\n")[0].split(";")
    return v[:-1] if v[-1] == "" else v


# The transports, the machine's shape and two ranks as two hosts.

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
    return "2 GPUs in one process (-g 2)" if SHAPE == "gpus" else "two ranks as two hosts on one GPU (MPS)"


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
    if execute(["pgrep", "-f", "nvidia-cuda-mps-control"], out=os.devnull) != 0 or DRY:
        execute(["nvidia-cuda-mps-control", "-d"])


def plugin_env():
    """libfabric with CUDA on the library path, the plugin installed, MPS for two hosts."""
    prepend_library_path(f"{LF}/lib")
    install_plugin()
    if SHAPE == "hosts":
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
    if SHAPE == "gpus":
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
    $HOSTS_ENV (VAR=VALUE ...) goes to every run, Socket's too. A run still going 10 s before its
    time is up leaves every thread's stack in NAME.stacks."""
    log(f"run {name} ({test}, two hosts)")
    t0 = seconds()
    cmd = [*mpirun(env_or("HOSTS_BIND", "--bind-to none")), *AS_HOST, *INFO, *env_or("HOSTS_ENV").split(), *settings,
           f"{NCCL_TESTS_MPI_DIR}/{test}", "-b", env_or("MINBYTES", "1M"), "-e", env_or("MAXBYTES", "1G"), "-f", "2",
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
    if rc in (124, 137) and not DRY:
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


# Builds.

def executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def failed_build(rc, path, tail):
    """Fails the stage, with the last TAIL lines of the build log PATH, where RC says it failed."""
    if rc:
        sys.stderr.write("".join(f"{line}\n" for line in lines(path)[-tail:]))
        raise Failed()


def build_libfabric(prefix, extra, name):
    """libfabric 2.1 into PREFIX with the configure flags EXTRA (scripts/build-libfabric.sh)."""
    env = [f"LIBFABRIC_PREFIX={prefix}", f"LIBFABRIC_TARBALL={LIBFABRIC_TARBALL}", f"LIBFABRIC_CONFIGURE_EXTRA={extra}"]
    failed_build(execute(["bash", "scripts/build-libfabric.sh"], env, out=logf(name)), logf(name), 40)


def mpi_home():
    """Where mpi.h lives, as nccl-tests' MPI_HOME (its include/ and lib/); empty if none."""
    if DRY:
        return "<mpi-home>"
    for d in [*probe(["mpicc", "--showme:incdirs"], "").split(), "/usr/lib/x86_64-linux-gnu/openmpi/include"]:
        if os.path.isfile(f"{d}/mpi.h") and os.path.isdir(f"{d}/../lib"):
            return os.path.abspath(f"{d}/..")
    return ""


def gencode():
    cap = probe(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], "<cap>")
    cap = cap.split("\n")[0].replace(".", "").replace(" ", "")
    return f"NVCC_GENCODE=-gencode=arch=compute_{cap},code=sm_{cap}"


def tool_setup(tool, tarball):
    """TOOL from TARBALL (bin/ and lib/, made by scripts/gpu/prepare.sh) where the machine has none."""
    if shutil.which(tool) or not os.path.isfile(tarball):
        return
    d = f"{WORK}/{tool}"
    if not executable(f"{d}/bin/{tool}"):
        mkdirs(d)
        execute(["tar", "-C", d, "--strip-components=1", "-xJf", tarball])
    if not DRY:
        with open(f"{d}/{tool}", "w") as f:
            f.write(f'#!/bin/sh\nLD_LIBRARY_PATH={d}/lib exec {d}/bin/{tool} "$@"\n')
        os.chmod(f"{d}/{tool}", 0o755)
    export("PATH", f"{d}:{os.environ.get('PATH', '')}")
    if not DRY and execute([tool, "-V"], out=os.devnull) and execute([tool, "--version"], out=os.devnull):
        log(f"{tool} from {tarball} does not run here")


# Stages: each one's docstring is its usage line.

def stage_libfabric():
    """build libfabric 2.1 with --with-cuda --enable-cuda-dlopen (cached)"""
    if os.path.exists(f"{LF}/lib/libfabric.so"):
        log("libfabric with CUDA: cached")
        return
    log("building libfabric 2.1 with CUDA")
    build_libfabric(LF, "--with-cuda=/usr/local/cuda --enable-cuda-dlopen", "libfabric-build")


def stage_nccltests():
    """build nccl-tests from $NCCL_TESTS_SRC against the NCCL PyTorch loads, with MPI=0 and (where
    mpicc is found) MPI=1 (cached)"""
    need(os.path.isfile(f"{NCCL_TESTS_SRC}/src/Makefile"), f"no nccl-tests source in {NCCL_TESTS_SRC}")
    need(NCCL_DIR, "no NCCL found (python3 -c 'import nvidia.nccl')")
    home = f"{WORK}/nccl-home"
    mkdirs(f"{home}/lib")
    execute(["ln", "-sf", f"{NCCL_DIR}/lib/libnccl.so.2", f"{home}/lib/libnccl.so"])
    execute(["ln", "-sfn", f"{NCCL_DIR}/include", f"{home}/include"])
    make = ["make", "-C", f"{NCCL_TESTS_SRC}/src", "-j16", "CUDA_HOME=/usr/local/cuda", f"NCCL_HOME={home}", gencode()]
    builds = []
    if not executable(f"{NCCL_TESTS_DIR}/all_reduce_perf"):
        builds.append(start([*make, "MPI=0", f"BUILDDIR={NCCL_TESTS_DIR}"], out=logf("nccl-tests-build")))
    mpi = mpi_home()
    if mpi and not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
        builds.append(start([*make, "MPI=1", f"MPI_HOME={mpi}", f"BUILDDIR={NCCL_TESTS_MPI_DIR}"],
                            out=logf("nccl-tests-mpi-build")))
    for build in builds:
        finish(build)
    if not DRY:
        failed_build(not executable(f"{NCCL_TESTS_DIR}/all_reduce_perf"), logf("nccl-tests-build"), 20)
        if not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
            log(f"no MPI build of nccl-tests (mpi.h: {mpi or 'not found'})")


def stage_pack():
    """the libfabric and nccl-tests builds as $OUT/builds.tar.xz, to unpack into .scratch/gpu-work
    on the next machine (the libfabric and nccltests stages then find them built)"""
    tests = [f"{d}/{t}_perf" for d in ("nccl-tests", "nccl-tests-mpi") for t in ("all_reduce", "sendrecv", "alltoall")]
    execute(["tar", "-cJf", f"{OUT}/builds.tar.xz", "-C", WORK, "libfabric-cuda/lib", "libfabric-cuda/bin",
             "libfabric-cuda/include", *tests], out=os.devnull)
    log(f"packed {(probe(['du', '-h', f'{OUT}/builds.tar.xz'], '<size>').split() or [''])[0]}")


def nccl_tags():
    """The NCCL tags in $NCCL_TAGS, else those of the tarballs in $NCCL_SRC_DIR."""
    if env_or("NCCL_TAGS"):
        return env_or("NCCL_TAGS").split()
    return [os.path.basename(f)[len("nccl-"):-len(".tar.xz")] for f in sorted(glob(f"{NCCL_SRC_DIR}/nccl-*.tar.xz"))]


def build_nccl(tag, gencode_):
    """NCCL TAG from its source tarball, and nccl-tests (and its MPI build for two hosts) against it."""
    src, tests = f"{WORK}/nccl-{tag}", f"{WORK}/nccl-tests-{tag}"
    build = f"{src}/build"
    if not os.path.exists(f"{build}/lib/libnccl.so"):
        remove(src)
        mkdirs(WORK)
        execute(["tar", "-xJf", f"{NCCL_SRC_DIR}/nccl-{tag}.tar.xz", "-C", WORK])
        make = ["make", "-C", src, "-j16", "src.build", "CUDA_HOME=/usr/local/cuda", f"BUILDDIR={build}", gencode_]
        if execute(make, out=logf(f"nccl-{tag}-build")):
            last = "".join(f"{line} " for line in lines(logf(f"nccl-{tag}-build"))[-3:])
            log(f"NCCL {tag} does not build here: {last[:300]}")
            return
    make = ["make", "-C", f"{NCCL_TESTS_SRC}/src", "-j8", "CUDA_HOME=/usr/local/cuda", f"NCCL_HOME={build}"]
    if not executable(f"{tests}/all_reduce_perf"):
        if execute([*make, "MPI=0", gencode_, f"BUILDDIR={tests}"], out=logf(f"nccl-tests-{tag}-build")):
            log(f"nccl-tests against NCCL {tag} failed to build")
    # The two-hosts shape runs the MPI build (see nccl_test).
    mpi = mpi_home()
    if SHAPE == "hosts" and mpi and not executable(f"{mpi_build_of(tests)}/all_reduce_perf"):
        if execute([*make, "MPI=1", f"MPI_HOME={mpi}", gencode_, f"BUILDDIR={mpi_build_of(tests)}"],
                   out=logf(f"nccl-tests-mpi-{tag}-build")):
            log(f"nccl-tests (MPI) against NCCL {tag} failed to build")
    log(f"NCCL {tag}: built")


def stage_ncclbuild():
    """build NCCL from the source tarballs in $NCCL_SRC_DIR (those named in $NCCL_TAGS, default
    all), and nccl-tests against each (cached)"""
    flags = gencode()
    if DRY:
        for tag in nccl_tags():
            build_nccl(tag, flags)
        return
    builds = [threading.Thread(target=build_nccl, args=(tag, flags)) for tag in nccl_tags()]
    for b in builds:
        b.start()
    for b in builds:
        b.join()


def stage_doctor():
    """the plugin's provider report on this machine (libfabric with CUDA)"""
    plugin_env()
    gpu = probe(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], "<gpu>").split("\n")[0]
    report = capture([f"{PLUGIN_DIR}/nccl-net-fabric", "doctor"], merge=True)[1]
    shm = capture([f"{PLUGIN_DIR}/nccl-net-fabric", "doctor"], ["FI_PROVIDER=shm"], merge=True)[1]
    summary(f"## doctor on {sockets.gethostname()} ({gpu})\n```\n{report}\n"
            + "".join(f"{line}\n" for line in shm.splitlines()[-3:]) + "```\n")


def stage_loading():
    """NCCL_NET_PLUGIN=<path>, NCCL_NET_PLUGIN=fabric and LD_PRELOAD, INFO/TRACE lines"""
    plugin_env()
    note("", "## loading", "")
    ways = {"path": [f"NCCL_NET_PLUGIN={PLUGIN}"],
            "name": ["NCCL_NET_PLUGIN=fabric", f"LD_LIBRARY_PATH={WORK}/plugin:{os.environ['LD_LIBRARY_PATH']}"],
            "preload": [f"LD_PRELOAD={WORK}/plugin/libnccl-net.so"]}
    for how, settings in ways.items():
        cmd = nccl_test(NCCL_TESTS_DIR, "all_reduce_perf", "-b", "1M", "-e", "4M", "-f", "4", "-n", "5", "-w", "1")
        rc = execute(timed(cmd), [*NET_ONLY, "NCCL_NET=Fabric", *INFO, *settings], out=logf(f"loading-{how}"),
                     unset=["NCCL_NET_PLUGIN"])
        loaded = grep(logf(f"loading-{how}"), r"Loaded net plugin [^ ]* \([^)]*\)", 1, only=True)
        note(f"- {how}: rc={rc}, {loaded[0] if loaded else 'plugin not loaded'}, "
             f"{len(grep(logf(f'loading-{how}'), 'via NET/Fabric'))} channels via NET/Fabric")
    # What a user sees: INFO with subsystems INIT,NET, and TRACE.
    info = sorted(set(grep(logf("loading-path"), r"NET/Fabric|NET/Plugin|via NET")))[:20]
    cmd = nccl_test(NCCL_TESTS_DIR, "all_reduce_perf", "-b", "1M", "-e", "1M", "-n", "1", "-w", "0")
    env = [*NET_ONLY, "NCCL_NET=Fabric", "NCCL_DEBUG=TRACE", f"NCCL_NET_PLUGIN={PLUGIN}"]
    execute(timed(cmd), env, out=logf("trace"))
    trace = sorted(set(grep(logf("trace"), "NET/Fabric")))[:40]
    if not DRY:
        for path, found in ((f"{OUT}/info-lines.txt", info), (f"{OUT}/trace-lines.txt", trace)):
            with open(path, "w") as f:
                f.write("".join(f"{line}\n" for line in found))


def stage_collectives():
    """all_reduce, all_gather, sendrecv, alltoall: Socket, tcp;ofi_rxm, native tcp, shm"""
    plugin_env()
    table_header(f"four collectives, {shape_words()}, P2P and SHM off")
    for t in ("all_reduce_perf", "all_gather_perf", "sendrecv_perf", "alltoall_perf"):
        short = t[:-len("_perf")]
        tests_run(f"socket-{short}", t, *socket())
        tests_run(f"rxm-{short}", t, *fabric(RXM))
        tests_run(f"tcp-{short}", t, *fabric(*NATIVE_TCP))
        tests_run(f"shm-{short}", t, *fabric(SHM))


def stage_variants():
    """all_reduce_perf without progress threads, with 1 lane, shm at 2 channels, shm's endpoints
    shared; native tcp refused"""
    plugin_env()
    table_header("all_reduce_perf variants: progress threads, lanes, channels, endpoint sharing; native tcp refused")
    tests_run("rxm-nothreads-all_reduce", "all_reduce_perf", *fabric(RXM, "NCCL_FABRIC_PROGRESS_THREAD=no"))
    tests_run("rxm-1lane-all_reduce", "all_reduce_perf", *fabric(RXM, "NCCL_FABRIC_LANES=1"))
    tests_run("shm-nothreads-all_reduce", "all_reduce_perf", *fabric(SHM, "NCCL_FABRIC_PROGRESS_THREAD=no"))
    tests_run("shm-100g-all_reduce", "all_reduce_perf", *fabric(SHM, "NCCL_FABRIC_SPEED_MBPS=100000"))
    tests_run("shm-device-all_reduce", "all_reduce_perf", *fabric(SHM, "NCCL_FABRIC_ENDPOINTS=device"))
    tests_run("tcp-refused", "all_reduce_perf", *fabric("NCCL_FABRIC_PROVIDER=tcp"))
    if not DRY:
        with open(f"{OUT}/tcp-refused.txt", "w") as f:
            f.write("".join(f"{line[:400]}\n" for line in grep(logf("tcp-refused"), r"NET/Fabric|NET plugin", 4)))


def stage_compare():
    """all_reduce_perf side by side: Socket (as shipped and 4 threads x 4 sockets), and tcp;ofi_rxm
    and shm through the plugin in $BASELINE_DIR and through this one, each with CPU seconds and
    peak RSS of the run; $COMPARE_ROUNDS rounds (default 2)"""
    plugin_env()
    old = baseline()
    table_header(f"all_reduce_perf side by side: {os.path.basename(BASELINE_DIR)} plugin and this one, "
                 f"{shape_words()}, P2P and SHM off")
    tests_run("socket-all_reduce", "all_reduce_perf", *socket())
    tests_run("socket4x4-all_reduce", "all_reduce_perf", *socket("socket4x4"))
    for r in range(1, int(env_or("COMPARE_ROUNDS", "2")) + 1):
        tests_run(f"before-rxm-{r}", "all_reduce_perf", *old, RXM)
        tests_run(f"after-rxm-{r}", "all_reduce_perf", *fabric(RXM))
        tests_run(f"before-shm-{r}", "all_reduce_perf", *old, SHM)
        tests_run(f"after-shm-{r}", "all_reduce_perf", *fabric(SHM))


MPI_RUNS = {
    "socket": socket, "socket4x4": lambda: socket("socket4x4"), "rxm": lambda: fabric(RXM),
    "tcp": lambda: fabric(*NATIVE_TCP), "shm": lambda: fabric(SHM),
    "rxm-4lanes": lambda: fabric(RXM, "NCCL_FABRIC_LANES=4"),
    "rxm-2lanes-threads": lambda: fabric(RXM, "NCCL_FABRIC_LANES=2", "NCCL_FABRIC_PROGRESS_THREAD=yes"),
    "shm-threads": lambda: fabric(SHM, "NCCL_FABRIC_PROGRESS_THREAD=yes"),
}


def mpi_runs(stage, runs, bind, measure):
    """all_reduce_perf as 2 processes (mpirun -np 2 BIND, -g 1, NCCL's settings passed by -x), for
    each name of RUNS (see MPI_RUNS): a summary row each, with CPU and memory where MEASURE."""
    for name in runs:
        settings = [*NET_ONLY, "NCCL_NVLS_ENABLE=0", *INFO, *MPI_RUNS.get(name, list)()]
        cmd = [*mpirun(bind), "-x", "LD_LIBRARY_PATH", *[a for w in settings for a in ("-x", w)],
               *(AS_HOST if SHAPE == "hosts" else []), f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf",
               "-b", env_or("MINBYTES", "1M"), "-e", env_or("MAXBYTES", "1G"), "-f", "4", "-g", "1",
               "-n", env_or("ITERS", "10"), "-w", env_or("WARMUP", "3")]
        t0, run = seconds(), f"{stage}-{name}"
        rc = execute(measured(run, timed(cmd)) if measure else timed(cmd), out=logf(run))
        row(run, "all_reduce_perf", rc, seconds() - t0, cost(run) if measure else "")


def stage_mpi():
    """all_reduce_perf as 2 processes (mpirun --bind-to none): Socket, Socket 4x4, tcp;ofi_rxm,
    native tcp, shm ($MPI_RUNS picks)"""
    plugin_env()
    if not DRY and not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
        note("- mpi: skipped (no nccl-tests built with MPI=1)")
        return
    hosts = ", each a host on GPU 0" if SHAPE == "hosts" else ""
    table_header(f"all_reduce_perf, 2 processes (mpirun -np 2, -g 1{hosts}), P2P and SHM off")
    mpi_runs("mpi", env_or("MPI_RUNS", "socket socket4x4 rxm tcp shm").split(), "--bind-to none", measure=True)


def stage_bound():
    """all_reduce_perf, mpirun -np 2 with its default binding (one core per rank): Socket, the
    plugin as it sizes itself, and lane/thread variants ($BOUND_RUNS picks)"""
    plugin_env()
    if not DRY and not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
        note("- bound: skipped (no MPI build)")
        return
    table_header("all_reduce_perf, mpirun -np 2 with its default binding (one core per rank), -g 1")
    runs = env_or("BOUND_RUNS", "socket rxm rxm-4lanes rxm-2lanes-threads shm shm-threads").split()
    mpi_runs("bound", runs, "", measure=False)
    note(*[line[:400] for line in grep(logf("bound-rxm"), "sizing:", 1)])


def stage_latency():
    """8-byte all_reduce_perf (2000 iterations): Socket, tcp;ofi_rxm, shm (or $LATENCY_RUNS: socket
    fabric rxm shm, repeats allowed)"""
    plugin_env()
    note("", f"## 8-byte all_reduce_perf ({shape_words()}, -n 2000 -w 200), P2P and SHM off: "
         "time in us (out-of-place, in-place)", "")
    ways = {"socket": socket(), "fabric": fabric(), "rxm": fabric(RXM), "shm": fabric(SHM)}
    for i, name in enumerate(env_or("LATENCY_RUNS", "socket rxm shm").split(), 1):
        log(f"run latency-{i}-{name}")
        cmd = nccl_test(NCCL_TESTS_DIR, "all_reduce_perf", "-b", "8", "-e", "8", "-n", "2000", "-w", "200")
        rc = execute(timed(cmd), [*NET_ONLY, *INFO, *ways.get(name, [])], out=logf(f"latency-{i}-{name}"))
        times = [f"{w[5]} / {w[9]} us, #wrong {fmt(num(w[8]) + num(w[12]))}"
                 for w in map(str.split, lines(logf(f"latency-{i}-{name}"))) if len(w) >= 13 and w[0] == "8"]
        note(f"- {name} (rc={rc}): " + "\n".join(times))


def stage_memory():
    """all_reduce_perf with the peak memory broken down by kind of mapping: Socket, Socket 4x4,
    tcp;ofi_rxm and the variants in $MEMORY_RUNS (NAME:VAR=VALUE,VAR=VALUE over tcp;ofi_rxm), shm"""
    plugin_env()
    table_header(f"peak memory of all_reduce_perf, {shape_words()}, by kind of mapping "
                 "(anon / gpu / shm / lib / file, MiB), P2P and SHM off")
    tests_run("mem-socket", "all_reduce_perf", *socket())
    tests_run("mem-socket4x4", "all_reduce_perf", *socket("socket4x4"))
    tests_run("mem-rxm", "all_reduce_perf", *fabric(RXM))
    for spec in env_or("MEMORY_RUNS").split():
        name, settings = spec.split(":")[0], spec.split(":", 1)[-1].replace(",", " ").split()
        tests_run(f"mem-rxm-{name}", "all_reduce_perf", *fabric(RXM, *settings))
    tests_run("mem-shm", "all_reduce_perf", *fabric(SHM))


def stage_versions():
    """all_reduce, alltoall and sendrecv through the plugin with every NCCL built by ncclbuild and
    with PyTorch's: which table NCCL loaded, #wrong, grouped receives"""
    plugin_env()
    note("", f"## NCCL versions: which table each loads, and three collectives through it (tcp;ofi_rxm, "
         f"{shape_words()}, P2P and SHM off, 1M-64M)", "",
         "| NCCL | table loaded | all_reduce | alltoall | sendrecv | grouped-receive INFO lines |",
         "| --- | --- | --- | --- | --- | --- |")
    versions_row("2.28.9-pip", f"{NCCL_DIR}/lib", NCCL_TESTS_DIR)
    for tag in nccl_tags():
        lib, tests = f"{WORK}/nccl-{tag}/build/lib", f"{WORK}/nccl-tests-{tag}"
        if DRY or (os.path.exists(f"{lib}/libnccl.so") and executable(f"{tests}/all_reduce_perf")):
            versions_row(tag, lib, tests)
        else:
            note(f"| {tag} | not built (see logs/nccl-{tag}-build.log) | - | - | - | - |")


def versions_row(label, libdir, tests):
    """all_reduce, alltoall and sendrecv through the plugin with one NCCL: one summary row."""
    cells, grouped = "", 0
    for t in ("all_reduce_perf", "alltoall_perf", "sendrecv_perf"):
        name = f"versions-{label}-{t[:-len('_perf')]}"
        log(f"run {name}")
        cmd = nccl_test(tests, t, "-b", "1M", "-e", "64M", "-f", "4", "-n", "5", "-w", "2")
        env = [f"LD_LIBRARY_PATH={libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}", *NET_ONLY, *INFO, *fabric(RXM)]
        rc = execute(timed(cmd), env, out=logf(name))
        cells += f" | rc={rc}, #wrong {wrong(logf(name))}"
        grouped += len(grep(logf(name), "grouped receive of"))
    loaded = sorted({m for path in glob(f"{OUT}/logs/versions-{label}-*.log")
                     for m in grep(path, r"Loaded net plugin [A-Za-z]* \(v[0-9]*\)", only=True)})
    note(f"| {label} | {''.join(f'{x} ' for x in loaded) or 'none'}{cells} | {grouped} |")


def stage_torch():
    """torch.distributed all-reduce, 2 processes (torchrun), result checked"""
    plugin_env()
    env = [*NET_ONLY, "NCCL_NET=Fabric", *INFO, f"NCCL_NET_PLUGIN={PLUGIN}", RXM, "ROUNDS=3"]
    rc = execute(timed([*TORCHRUN, "scripts/gpu/torch_allreduce.py"]), env, out=logf("torch"))
    result = grep(logf("torch"), r"RESULT torch_allreduce=[a-z]*", only=True)[:1]
    note("", "## PyTorch (torchrun, 2 processes, tcp;ofi_rxm, 3 process groups one after another)", "",
         f"- rc={rc}, {''.join(result)}, {len(grep(logf('torch'), 'via NET/Fabric'))} channels via NET/Fabric, "
         f"{len(grep(logf('torch'), 'Loaded net plugin Fabric'))} plugin loads",
         *[f"- {line}" for line in grep(logf("torch"), r"^round")])


def stage_idle():
    """a torch job that all-reduces, idles 10 s and all-reduces again: cores used while idle and RSS
    per process, Socket against the plugin (and the baseline plugin)"""
    plugin_env()
    note("", "## Idle cost (torchrun, 2 processes, all-reduce, 10 s idle, all-reduce; P2P and SHM off)", "")
    ways = {"socket": socket, "fabric-rxm": lambda: fabric(RXM), "fabric-shm": lambda: fabric(SHM),
            "baseline-rxm": lambda: baseline(RXM)}
    for how, settings in ways.items():
        rc = execute(timed([*TORCHRUN, "scripts/gpu/torch_idle.py"]), [*NET_ONLY, *settings()], out=logf(f"idle-{how}"))
        note(f"- {how} (rc={rc}): " + "".join(f"{r} " for r in grep(logf(f"idle-{how}"), r"RESULT.*", only=True)))


def stage_torchhosts():
    """torch_bw, torch_idle and torch_churn as two hosts on one GPU (AS_HOSTS=1, MPS): Socket as
    shipped, 4x4, 2x8 and the plugin with no NCCL_FABRIC_* set; bandwidth and churn again for each
    of $TORCHHOSTS_FABRIC_VARIANTS (;-separated VAR=VALUE lists)"""
    plugin_env()
    start_mps()
    note("", "## torch.distributed as two hosts on one GPU (torchrun, 2 processes, AS_HOSTS=1), P2P and SHM off", "")
    runs = [("bw", "socket"), ("bw", "socket4x4"), ("bw", "socket2x8"), ("bw", "fabric"), ("idle", "socket"),
            ("idle", "fabric"), ("churn", "socket"), ("churn", "fabric")]
    for script, how in runs:
        torchrun_measured(f"torchhosts-{script}-{how}", f"scripts/gpu/torch_{script}.py", "AS_HOSTS=1",
                          *(fabric() if how == "fabric" else socket(how)))
    for i, v in enumerate(variants(env_or("TORCHHOSTS_FABRIC_VARIANTS")), 1):
        note(f"- torchhosts-*-fabric-v{i}: {v}")
        for script in ("bw", "churn"):
            torchrun_measured(f"torchhosts-{script}-fabric-v{i}", f"scripts/gpu/torch_{script}.py", "AS_HOSTS=1",
                              *fabric(*v.split()))


def stage_hosts():
    """two ranks as two hosts on one GPU (MPS, NCCL_HOSTID per rank, mpirun -np 2 --bind-to none),
    all_reduce_perf -f 2: the plugin with no NCCL_FABRIC_* set and with $HOSTS_FABRIC_VARIANTS
    (;-separated VAR=VALUE lists; default NCCL_FABRIC_DOMAINS=eth0, "none" for none), Socket as
    shipped, 4x4 and 2x8; CPU seconds, peak RSS, the plugin's INFO lines, which NET devices NCCL's
    channels use, and the time per size side by side (scripts/gpu/sizes.py). A variant holding
    the word `baseline` runs the plugin in $BASELINE_DIR; HOSTS_NO_SOCKET=1 skips Socket,
    HOSTS_SOCKETS picks its shapes (default "socket socket4x4 socket2x8"); HOSTS_TEST names
    another nccl-tests binary (sendrecv_perf, alltoall_perf …); HOSTS_BIND replaces mpirun's
    "--bind-to none" ("--bind-to core": one core per rank, mpirun's default), HOSTS_TAG names the
    runs apart and HOSTS_ENV (VAR=VALUE ...) goes to every run, Socket's too; with
    NCCL_FABRIC_TIMES=yes there, the plugin's comms' times are listed too"""
    plugin_env()
    start_mps()
    test = env_or("HOSTS_TEST", "all_reduce_perf")
    tag = (f"-{re.sub(r'_perf$', '', test)}" if env_or("HOSTS_TEST") else "") \
        + (f"-{env_or('HOSTS_TAG')}" if env_or("HOSTS_TAG") else "")
    table_header(f"Two ranks as two hosts on one GPU (MPS), mpirun {env_or('HOSTS_BIND', '--bind-to none')}, "
                 f"{test} {hosts_shape()}")
    shapes = "" if env_or("HOSTS_NO_SOCKET") else os.environ.get("HOSTS_SOCKETS", "socket socket4x4 socket2x8")
    runs = [(f"hosts{tag}-{shape}", socket(shape)) for shape in shapes.split()]
    for name, settings in runs:
        hosts_run(name, test, *settings)
    hosts_run(f"hosts{tag}-fabric", test, *fabric())
    names = [name for name, _ in runs] + [f"hosts{tag}-fabric"]
    spec = env_or("HOSTS_FABRIC_VARIANTS", "NCCL_FABRIC_DOMAINS=eth0")
    for i, v in enumerate([] if spec == "none" else variants(spec), 1):
        # The word "baseline" in a variant runs the plugin in $BASELINE_DIR instead.
        if " baseline " in f" {v} ":
            hosts_run(f"hosts{tag}-fabric-v{i}", test, *baseline(*v.replace("baseline", "").split()))
        else:
            hosts_run(f"hosts{tag}-fabric-v{i}", test, *fabric(*v.split()))
        names.append(f"hosts{tag}-fabric-v{i}")
        note(f"- hosts{tag}-fabric-v{i}: {v}")
    note("", "The plugin's INFO lines (rank 0) and the NET devices NCCL's channels use:", "```")
    for n in names:
        note(*[f"{n}: {line}"[:400] for line in grep(logf(n), r"NET/Fabric.*(provider |sizing|CPUs|only loopback)", 3)],
             f"{n}: channels {channels(logf(n))}")
    note("```")
    # With NCCL_FABRIC_TIMES=yes: where each comm's requests spent their time, as the comms said at close.
    for n in names:
        note(*[re.sub(r".*NET/Fabric : ", lambda _: f"- {n}: ", line, count=1)[:400]
               for line in grep(logf(n), r"NET/Fabric : (send|receive) comm .* requests, ")])
    note("", "Time per size (out-of-place, µs), side by side:", "")
    summary(capture(["python3", "scripts/gpu/sizes.py", *map(logf, names)])[1])


def stage_capped():
    """the hosts shape with every TCP connection on the ranks' path capped at $CAP_RATE (default
    2gbit), the way clouds cap each flow: an HTB class per connection on lo (which carries
    eth0-to-eth0 traffic here), made as connections appear (scripts/gpu/capflows.py; the kernel
    there has no fq), removed afterwards; $CAPPED_TEST (all_reduce_perf), Socket as shipped, 4x4,
    2x8 and the plugin ($HOSTS_FABRIC_VARIANTS as in hosts, default none)"""
    rate, tclog = env_or("CAP_RATE", "2gbit"), logf("capped-tc")
    tool_setup("tc", f"{IN}/tc.tar.xz")
    execute(["tc", "qdisc", "del", "dev", "lo", "root"], out=os.devnull)
    root = ["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1"]
    uncapped = ["tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate", "400gbit",
                "quantum", "65536"]
    if execute(root, out=tclog) or execute(uncapped, out=tclog, append=True):
        with open(tclog, errors="replace") as f:
            note(f"- capped: skipped (an HTB qdisc on lo refused: {f.read(200).rstrip(chr(10))})")
        raise Failed()
    capper = start(["python3", "scripts/gpu/capflows.py", "lo", rate, "3600"], out=tclog, append=True)
    try:
        with overriding(HOSTS_TEST=env_or("CAPPED_TEST", "all_reduce_perf"), HOSTS_TAG="capped",
                        HOSTS_ENV=env_or("HOSTS_ENV"), HOSTS_FABRIC_VARIANTS=env_or("HOSTS_FABRIC_VARIANTS", "none")):
            stage_hosts()
    finally:
        if not isinstance(capper, int):
            capper.terminate()
            capper.wait()
    classes = capture(["tc", "class", "show", "dev", "lo"])[1].count("class htb")
    note(f"- capped: every TCP connection on lo at most {rate} (an HTB class each, made within 100 ms of its "
         f"start by scripts/gpu/capflows.py); {classes} classes")
    execute(["tc", "qdisc", "del", "dev", "lo", "root"], out=tclog, append=True)


def stage_targets():
    """what the performance targets compare, two ranks as two hosts, as much as fits in
    $TARGETS_BUDGET seconds of the driver (default 540; what does not fit is named in the
    summary): all_reduce_perf -b 8 -e 1G (Socket as shipped, 4x4, 2x8, the plugin and
    $HOSTS_FABRIC_VARIANTS), sendrecv_perf and alltoall_perf -b 8 -e 256M, mpirun's default
    binding (one core per rank; also with progress threads), torchhosts; $TARGETS_PARTS picks
    (default "allreduce sendrecv alltoall bound torch")"""
    budget = int(env_or("TARGETS_BUDGET", "540"))
    parts = {
        "allreduce": (stage_hosts, dict(MINBYTES="8", MAXBYTES="1G")),
        "sendrecv": (stage_hosts, dict(MINBYTES="8", MAXBYTES="256M", HOSTS_TEST="sendrecv_perf",
                                       HOSTS_FABRIC_VARIANTS="none")),
        "alltoall": (stage_hosts, dict(MINBYTES="8", MAXBYTES="256M", HOSTS_TEST="alltoall_perf",
                                       HOSTS_FABRIC_VARIANTS="none")),
        # On one core a progress thread that sleeps may be worth it where one that spins is not.
        "bound": (stage_hosts, dict(MINBYTES="1M", MAXBYTES="1G", HOSTS_BIND="--bind-to core", HOSTS_TAG="bound",
                                    HOSTS_FABRIC_VARIANTS="NCCL_FABRIC_PROGRESS_THREAD=yes")),
        "torch": (stage_torchhosts, {}),
    }
    for part in env_or("TARGETS_PARTS", "allreduce sendrecv alltoall bound torch").split():
        if seconds() >= budget:
            note(f"- targets: {part} not run ({seconds()}s of the {budget}s budget used)")
            continue
        log(f"targets: {part}")
        if part not in parts:
            log(f"targets: no part {part}")
            continue
        stage, settings = parts[part]
        with overriding(**settings):
            stage()


THREADS_RUNS = {"socket": socket, "socket2x8": lambda: socket("socket2x8"), "fabric": fabric,
                "fabric-spin": lambda: fabric("NCCL_FABRIC_PROGRESS_SPIN_US=10000000"),
                "fabric-sleep50": lambda: fabric("NCCL_FABRIC_PROGRESS_SPIN_US=50")}


def threads_cmd(name):
    """The 1 GiB all_reduce_perf run of the threads stage, two ranks as two hosts, for NAME (see
    THREADS_RUNS; fabric-spin: progress threads that never sleep)."""
    return timed([*mpirun(env_or("THREADS_BIND", "--bind-to none")), *AS_HOST, *INFO, *THREADS_RUNS.get(name, list)(),
                  f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf", "-b", "1G", "-e", "1G", "-g", "1",
                  "-n", env_or("THREADS_ITERS", "40"), "-w", "5"])


def stage_threads():
    """where the CPU goes at 1 GiB (two ranks as two hosts, all_reduce_perf -n $THREADS_ITERS,
    default 40): CPU seconds by thread name (scripts/gpu/threads.py) for each of $THREADS_RUNS
    (default "socket2x8 fabric fabric-spin"; also socket, fabric-sleep50); where perf is installed
    or comes in $PERF_TARBALL, profiles of each of $PERF_RUNS (socket2x8 fabric) by thread and
    shared object, and by thread and symbol. THREADS_BIND replaces mpirun's "--bind-to none"
    ("--bind-to core": one core per rank)"""
    plugin_env()
    start_mps()
    bind = env_or("THREADS_BIND", "--bind-to none")
    for name in env_or("THREADS_RUNS", "socket2x8 fabric fabric-spin").split():
        log(f"threads {name}")
        note("", f"## CPU by thread: {name}, all_reduce_perf 1 GiB x {env_or('THREADS_ITERS', '40')}, "
             f"two ranks as two hosts, mpirun {bind}")
        execute(["python3", "scripts/gpu/threads.py", SUMMARY, *threads_cmd(name)], out=logf(f"threads-{name}"))
        note(*at_gib(logf(f"threads-{name}"), "busbw at 1 GiB: {7} GB/s (out of place), {11} (in place)"))
    tool_setup("perf", PERF_TARBALL)
    if not DRY and not shutil.which("perf"):
        note("- perf: not installed on this machine")
        return
    for name in env_or("PERF_RUNS", "socket2x8 fabric").split():
        log(f"perf over {name}")
        data = f"{WORK}/perf-{name}.data"
        # System-wide where the kernel lets us, else the run's processes and their children.
        # The run gets this driver's library path back (a carried perf runs with its own).
        run = ["--", "env", f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}", *threads_cmd(name)]
        if execute(["perf", "record", "-F", "499", "-a", "-g", "-o", data, *run], out=logf(f"perf-{name}")):
            execute(["perf", "record", "-F", "499", "-g", "-o", data, *run], out=logf(f"perf-{name}"), append=True)
        report = []
        for keys, more, n in (("comm,dso", [], 30), ("comm,sym", ["-g", "none"], 60)):
            cmd = ["perf", "report", "-i", data, "--no-children", "--sort", keys, "--stdio", *more]
            text = capture(cmd, merge=True)[1]
            report.append([line for line in text.splitlines() if line and not line.startswith("#")][:n])
        note("", f"## perf, {name} (all_reduce_perf 1 GiB, 499 Hz, mpirun {bind}): by thread and object, then by "
             "thread and symbol", *at_gib(logf(f"perf-{name}"), "busbw at 1 GiB: {7} GB/s"),
             "```", *report[0], "", *report[1], "```")


def stage_steps():
    """where the time of NCCL's network steps goes (NCCL's example profiler plugin from
    $NCCL_PROFILER_TARBALL; scripts/gpu/steps.py): all_reduce_perf at $STEPS_SIZES (8 1M 256M),
    two ranks as two hosts, Socket as shipped and 2x8, the plugin and $STEPS_VARIANTS (;-separated
    VAR=VALUE lists); $STEPS_TEST names another nccl-tests binary (sendrecv_perf …)"""
    plugin_env()
    start_mps()
    prof = f"{WORK}/nccl-profiler"
    if not os.path.isfile(f"{prof}/libnccl-profiler-example.so"):
        need(os.path.isfile(NCCL_PROFILER_TARBALL), f"no profiler source ({NCCL_PROFILER_TARBALL})")
        mkdirs(prof)
        execute(["tar", "-C", prof, "--strip-components=1", "-xJf", NCCL_PROFILER_TARBALL])
        sources = sorted(f"./{os.path.basename(f)}" for f in glob(f"{prof}/*.cc")) or ["./*.cc"]
        gxx = ["g++", "-O2", "-Inccl", "-I/usr/local/cuda/include", "-fPIC", "-shared", "-o",
               "libnccl-profiler-example.so", *sources]
        failed_build(execute(gxx, out=logf("profiler-build"), cwd=prof), logf("profiler-build"), 20)
    # 16 collectives of each kind kept: the 12 + 3 of a run (a collective record is 755 MB of
    # address space, touched only where steps are written).
    pools = [f"NCCL_PROFILE_{kind}_POOL_SIZE={n}" for kind, n in (
        ("GROUP_API", 16), ("COLL_API", 16), ("KERNEL_LAUNCH", 16), ("GROUP", 16), ("COLL", 16), ("P2P", 4),
        ("P2P_API", 4))]
    extra = variants(env_or("STEPS_VARIANTS"))
    runs = [("socket", socket()), ("socket2x8", socket("socket2x8")), ("fabric", fabric())] \
        + [(f"fabric-v{i}", fabric(*v.split())) for i, v in enumerate(extra, 1)]
    test = env_or("STEPS_TEST", "all_reduce_perf")
    table_header(f"Steps profiled (NCCL's example profiler), two ranks as two hosts, {test} -n 12 -w 3{hosts_env()}")
    rows = []
    for size in env_or("STEPS_SIZES", "8 1M 256M").split():
        for name, settings in runs:
            dump = f"{WORK}/steps/{name}-{size}"
            mkdirs(f"{WORK}/steps")
            for f in [] if DRY else glob(f"{dump}_*.json"):
                os.remove(f)
            with overriding(MINBYTES=size, MAXBYTES=size, ITERS="12", WARMUP="3"):
                hosts_run(f"steps-{name}-{size}", test, *settings,
                          f"NCCL_PROFILER_PLUGIN={prof}/libnccl-profiler-example.so", "NCCL_PROFILE_EVENT_MASK=16",
                          f"NCCL_PROFILE_DUMP_FILE={dump}", *pools)
            first = [f"{w[5]} µs" for w in results(logf(f"steps-{name}-{size}"))][:1]
            label = f"{name} {size} ({''.join(first)})"
            rows.append(capture(["python3", "scripts/gpu/steps.py", label, dump])[1].rstrip("\n"))
            # Keep the traces, compressed, for a closer look.
            traces = sorted(os.path.basename(f) for f in glob(f"{dump}_*.json"))
            if traces or DRY:
                execute(["tar", "-C", f"{WORK}/steps", "-cJf", f"{OUT}/logs/steps-{name}-{size}.tar.xz",
                         *(traces or [f"{name}-{size}_*.json"])],
                        out=os.devnull)
    note(*[f"- variant: {v}" for v in extra])
    note("", "Where each step's time goes (median time of the phase / steps in that phase on average while the "
         "operation ran):", "")
    summary(capture(["python3", "scripts/gpu/steps.py", "--header"])[1])
    note(*rows)


def ucx_setup():
    """libfabric 2.1 with CUDA and ucx against the UCX in $UCX_TARBALL (cached), and the plugin
    installed. Returns libfabric's prefix, UCX's name, and what a process needs to load them
    (FI_UCX_DEVICES=eth0, UCX_TLS=tcp,cuda_copy,self unless $UCX_TLS says otherwise)."""
    tarball, ucx, lfu = env_or("UCX_TARBALL", f"{IN}/ucx-1.19.0.tar.xz"), f"{WORK}/ucx", f"{WORK}/libfabric-ucx"
    need(os.path.isfile(tarball), f"no UCX at {tarball}")
    if not os.path.exists(f"{lfu}/lib/libfabric.so"):
        remove(ucx)
        if execute(["tar", "-xJf", tarball, "-C", WORK]):
            raise Failed()
        log("building libfabric 2.1 with CUDA and ucx")
        flags = f"--with-cuda=/usr/local/cuda --enable-cuda-dlopen --enable-ucx={ucx}"
        build_libfabric(lfu, flags, "libfabric-ucx-build")
    install_plugin()
    name = re.sub(r"(.)\.tar\.xz$", r"\1", os.path.basename(tarball))
    return lfu, name, [f"LD_LIBRARY_PATH={lfu}/lib:{ucx}/lib:{os.environ.get('LD_LIBRARY_PATH', '')}",
                       f"UCX_MODULE_DIR={ucx}/lib/ucx", "FI_UCX_DEVICES=eth0",
                       f"UCX_TLS={env_or('UCX_TLS', 'tcp,cuda_copy,self')}"]


def stage_ucx():
    """libfabric 2.1 built with CUDA and the ucx provider against the UCX in $UCX_TARBALL (include/
    and lib/ of the libucx-cu13 wheel, see the shared notes), then fi_info -p ucx and the plugin's
    doctor with NCCL_FABRIC_PROVIDER=ucx (FI_UCX_DEVICES=eth0, UCX_TLS=tcp,cuda_copy,self)"""
    lfu, name, ucx_env = ucx_setup()
    doctor = timed([f"{PLUGIN_DIR}/nccl-net-fabric", "doctor"], "60", kill=False)
    info = capture(timed([f"{lfu}/bin/fi_info", "-p", "ucx"], "60", kill=False), ucx_env, merge=True)[1]
    report = capture(doctor, [*ucx_env, "NCCL_FABRIC_PROVIDER=ucx"], merge=True)[1]
    gdr = capture(doctor, [*ucx_env, "NCCL_FABRIC_PROVIDER=ucx", "NCCL_NET_GDR_LEVEL=SYS"], merge=True)[1]
    note("", f"## ucx (libfabric 2.1 with ucx, UCX {name})", "```", *info.splitlines()[:20], "",
         *report.splitlines()[:60], "", "With NCCL_NET_GDR_LEVEL=SYS:",
         *[line for line in gdr.splitlines() if re.search("GPU|GDR|handshake", line)][:20], "```")


def stage_ucxhosts():
    """the hosts shape over ucx: GPU buffers (NCCL_NET_GDR_LEVEL=SYS), host buffers
    (NCCL_FABRIC_HMEM=off) and Socket for each of $UCXHOSTS_TESTS (all_reduce_perf sendrecv_perf
    alltoall_perf), all_reduce also without the GDR setting; NCCL's GPU Direct RDMA lines, /GDRDMA
    channels and the plugin's INFO lines"""
    _, name, ucx_env = ucx_setup()
    start_mps()
    fab = fabric(*ucx_env, "NCCL_FABRIC_PROVIDER=ucx")
    table_header(f"ucx (UCX {name}, FI_UCX_DEVICES=eth0, UCX_TLS={env_or('UCX_TLS', 'tcp,cuda_copy,self')}), two "
                 f"ranks as two hosts on one GPU (MPS), {hosts_shape()}")
    names = []
    for t in env_or("UCXHOSTS_TESTS", "all_reduce_perf sendrecv_perf alltoall_perf").split():
        short = re.sub(r"_perf$", "", t)
        runs = [("gdr", [*fab, "NCCL_NET_GDR_LEVEL=SYS"])] + ([("default", fab)] if short == "all_reduce" else []) \
            + [("host", [*fab, "NCCL_FABRIC_HMEM=off"]), ("socket", socket())]
        for how, settings in runs:
            hosts_run(f"ucx-{short}-{how}", t, *settings)
            names.append(f"ucx-{short}-{how}")
    note("", "NCCL's GPU Direct RDMA lines, the channels' paths and the plugin's INFO lines (rank 0):", "```")
    plugin_lines = r"NET/Fabric.*(provider |handshake|NCCL passes|NCCL uses host|no progress threads)"
    for n in names:
        path = logf(n)
        note(*[f"{n}: {m}"[:300] for m in grep(path, r"GPU Direct RDMA (Enabled|Disabled)[^$]*", 2, only=True)],
             *[f"{n}: {line}"[:500] for line in grep(path, plugin_lines, 5)],
             f"{n}: channels {channels(path, r'via NET/[A-Za-z]+/[0-9]+(/GDRDMA)?')}",
             *[f"{n}: {line}"[:300] for line in grep(path, r"WARN|error|Segmentation", 3)])
    note("```", "", "Time per size (out-of-place, µs), side by side:", "")
    summary(capture(["python3", "scripts/gpu/sizes.py", *map(logf, names)])[1])


def stage_conform():
    """nccl-net-fabric conform over ucx (GPU rows included) with libfabric built with ucx, and over
    $CONFORM_PROVIDERS with the libfabric stage's build where it is there"""
    _, name, ucx_env = ucx_setup()
    conform = [f"{PLUGIN_DIR}/nccl-net-fabric", "conform", "--provider"]
    rc, text = capture(timed([*conform, "ucx", "--plugin", PLUGIN], "240", kill=False), ucx_env, merge=True)
    summary(f"\n## conform over ucx (UCX {name}, {' '.join(ucx_env[2:])})\n```\n{text}exit {rc}\n```\n")
    for p in env_or("CONFORM_PROVIDERS").split():
        if not DRY and not os.path.exists(f"{LF}/lib/libfabric.so"):
            break
        env = [f"LD_LIBRARY_PATH={LF}/lib:{os.environ.get('LD_LIBRARY_PATH', '')}", "NCCL_FABRIC_DOMAINS=eth0,shm"]
        rc, text = capture(timed([*conform, p, "--plugin", PLUGIN], "240", kill=False), env, merge=True)
        summary(f"\n## conform over {p} (libfabric with CUDA)\n```\n{text}exit {rc}\n```\n")


def stage_scale():
    """tests/scale.rs on this machine's cores: $SCALE_HOSTS (default "16 8") network-namespace hosts
    all to all, a host killed and a link cut; the test's release build and the plugin beside it in
    $SCALE_DIR (scripts/gpu/prepare.sh), iproute2's ip from $IP_TARBALL where the machine has none"""
    d = env_or("SCALE_DIR", f"{IN}/scale")
    need(executable(f"{d}/scale"), f"no scale test in {d}")
    tool_setup("ip", env_or("IP_TARBALL", f"{IN}/ip.tar.xz"))
    test = "many_hosts_connect_all_to_all_and_survive_a_killed_host_and_a_cut_link"
    for n in env_or("SCALE_HOSTS", "16 8").split():
        rc = execute(timed([f"{d}/scale", "--exact", test, "--nocapture"], kill=False),
                     [f"LD_LIBRARY_PATH={LF}/lib", f"NFAB_SCALE_HOSTS={n}"], out=logf(f"scale{n}"))
        found = "".join(f"{line[:300]} " for line in grep(logf(f"scale{n}"), "^(tcp|SKIPPED)"))
        note(f"- scale, {n} hosts: rc {rc} {found}")


def stage_fabtests():
    """build fabtests against the libfabric stage's build (cached), for ceiling and pingpong"""
    ft, src = f"{WORK}/fabtests", f"{WORK}/fabtests-src"
    if executable(f"{ft}/bin/fi_rdm_tagged_bw"):
        return
    # A libfabric unpacked from an older builds.tar.xz has no headers: build it here first.
    if not os.path.isfile(f"{LF}/include/rdma/fabric.h"):
        remove(LF)
        stage_libfabric()
    remove(src)
    mkdirs(src)
    if execute(["tar", "-xJf", LIBFABRIC_TARBALL, "-C", src, "--strip-components=1"]):
        raise Failed()
    need(executable(f"{src}/fabtests/configure"), "no configure in fabtests (run scripts/gpu/prepare.sh again)")
    log("building fabtests")
    build = logf("fabtests-build")
    cpus = len(os.sched_getaffinity(0))
    rc = execute(["./configure", f"--prefix={ft}", f"--with-libfabric={LF}"], out=build, cwd=f"{src}/fabtests") \
        or execute(["make", f"-j{cpus}", "install"], out=build, append=True, cwd=f"{src}/fabtests")
    failed_build(rc, build, 30)


def eth0_ip():
    """eth0's IPv4 address (SIOCGIFADDR; the machine may have no iproute2)."""
    if DRY:
        return "<eth0-address>"
    s = sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM)
    return sockets.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", b"eth0"))[20:24])


def fabtests_program(d, kind, op):
    """The fabtests program in D, with its arguments, for KIND (bw, pingpong) of an operation:
    "tagged" messages (what the plugin posts; rxm sends a long one by rendezvous) or "writedata",
    RMA writes with remote CQ data (the data goes at once into a buffer the receiver announced, and
    the sender's completion needs no answer from the receiver)."""
    programs = {"bw-tagged": ["fi_rdm_tagged_bw"], "bw-writedata": ["fi_rma_bw", "-e", "rdm", "-o", "writedata"],
                "pingpong-tagged": ["fi_rdm_tagged_pingpong"],
                "pingpong-writedata": ["fi_rma_pingpong", "-o", "writedata"]}
    if f"{kind}-{op}" not in programs:
        raise Failed(f"unknown fabtests operation {op} (tagged, writedata)")
    program, *args = programs[f"{kind}-{op}"]
    return [f"{d}/{program}", *args]


def stage_ceiling():
    """what the provider itself moves here (fabtests, built against the libfabric stage's build):
    for each of $CEILING_OPS ("tagged": fi_rdm_tagged_bw, the default; "writedata": fi_rma_bw -o
    writedata, RMA writes with remote CQ data), each of $CEILING_SIZE (message bytes, 1048576) and
    $CEILING_WINDOW (in flight per flow, 64) and $CEILING_FLOWS flows each way (default "1 2 4"),
    both directions at once, $CEILING_PROVIDER (tcp;ofi_rxm) over eth0's address; the sum of the
    flows' MB/s per direction; each flow moves 3 GiB ($CEILING_ITERS messages if set)"""
    stage_fabtests()
    prov, ip, port = env_or("CEILING_PROVIDER", "tcp;ofi_rxm"), eth0_ip(), 23000
    note("", f"## What {prov} itself moves here (fabtests, both directions at once, over {ip})", "",
         "| operation | message bytes | in flight per flow | flows each way | MB/s one way (sum) "
         "| MB/s the other way (sum) | both, GB/s |", "| --- | --- | --- | --- | --- | --- | --- |")
    for op in env_or("CEILING_OPS", "tagged").split():
        program = fabtests_program(f"{WORK}/fabtests/bin", "bw", op)
        for size in env_or("CEILING_SIZE", "1048576").split():
            for window in env_or("CEILING_WINDOW", "64").split():
                for n in map(int, env_or("CEILING_FLOWS", "1 2 4").split()):
                    iters = max(int(env_or("CEILING_ITERS", str(3221225472 // int(size)))), 20)
                    tag = f"{op}-{size}-{window}-{n}"

                    def pair(k, end, *where):
                        """Pair K's server (-s ADDRESS) or client (ADDRESS)."""
                        cmd = [*program, "-p", prov, f"-E={port + k}", "-S", size, "-W", window, "-I", iters,
                               "-w", iters // 30 + 1, *where]
                        return start(timed(cmd, "60", kill=False), [f"LD_LIBRARY_PATH={LF}/lib"],
                                     out=logf(f"ceiling-{tag}-{k}-{end}"))

                    # 2n pairs: n servers of each direction; on one machine a direction is only
                    # which of the pair sends, so pair k of direction d is server d, client 1-d.
                    servers = [pair(k, "server", "-s", ip) for k in range(2 * n)]
                    sleep(1)
                    for p in servers + [pair(k, "client", ip) for k in range(2 * n)]:
                        finish(p)
                    port += 2 * n
                    # The MB/sec column of each client's result line.
                    rates = []
                    for k in range(2 * n):
                        found = [line.split()[4] for line in lines(logf(f"ceiling-{tag}-{k}-client"))
                                 if re.match("[0-9]", line) and len(line.split()) >= 7]
                        rates.append(float(fmt(num(found[-1] if found else "0"))))
                    a, b = sum(rates[:n]), sum(rates[n:])
                    note(f"| {op} | {size} | {window} | {n} | {a:.0f} | {b:.0f} | {(a + b) / 1000:.2f} |")


def stage_pingpong():
    """one small message's one-way time: a polled TCP socket (scripts/gpu/tcp_pingpong.c) and
    fabtests over $PINGPONG_PROVIDERS (tcp;ofi_rxm tcp), for each of $PINGPONG_OPS ("tagged":
    fi_rdm_tagged_pingpong; "writedata": fi_rma_pingpong -o writedata), $PINGPONG_SIZES bytes (8
    4096), 20000 round trips over eth0's address; fabtests from $FABTESTS_BIN (default
    .scratch/gpu-in/fabtests) or the fabtests stage"""
    d = env_or("FABTESTS_BIN", f"{IN}/fabtests")
    if not executable(f"{d}/fi_rdm_tagged_pingpong"):
        stage_fabtests()
        d = f"{WORK}/fabtests/bin"
    if execute(["cc", "-O2", "-o", f"{WORK}/tcp_pingpong", "scripts/gpu/tcp_pingpong.c"]):
        raise Failed()
    ip, port = eth0_ip(), 24100
    ops, provs = env_or("PINGPONG_OPS", "tagged").split(), env_or("PINGPONG_PROVIDERS", "tcp;ofi_rxm tcp").split()
    programs = {op: fabtests_program(d, "pingpong", op) for op in ops}
    cols = [p if op == "tagged" else f"{p} {op}" for op in ops for p in provs]
    note("", f"## One message's one-way time over {ip} (20000 round trips, µs)", "",
         "| bytes | TCP socket, polled |" + "".join(f" {c} |" for c in cols), "| --- | --- |" + " --- |" * len(cols))
    for size in env_or("PINGPONG_SIZES", "8 4096").split():
        port += 1
        tcp = capture(timed([f"{WORK}/tcp_pingpong", ip, port, size, "20000"], "60", kill=False))[1]
        cells = f"| {size} | " + "\n".join((line.split() + [""] * 4)[3] for line in tcp.splitlines()) + " |"
        for op in ops:
            for prov in provs:
                port += 1
                name = f"{size}-{prov.replace(';', '_')}-{op}"
                cmd = timed([*programs[op], "-p", prov, f"-E={port}", "-S", size, "-I", "20000"], "60", kill=False)
                server = start([*cmd, "-s", ip], [f"LD_LIBRARY_PATH={LF}/lib"], out=logf(f"pingpong-{name}-server"))
                sleep(1)
                execute([*cmd, ip], [f"LD_LIBRARY_PATH={LF}/lib"], out=logf(f"pingpong-{name}-client"))
                finish(server)
                # The usec/xfer column: one way.
                one_way = [w[5] for w in map(str.split, lines(logf(f"pingpong-{name}-client")))
                           if len(w) >= 7 and re.fullmatch(r"[0-9]+[kmg]?", w[0])]
                cells += f" {one_way[-1] if one_way else ''} |"
        note(cells)


def stage_all():
    """libfabric nccltests doctor loading collectives variants mpi torch (about 10 min)"""
    run_stages(["libfabric", "nccltests", "doctor", "loading", "collectives", "variants", "mpi", "torch"])


STAGES = {
    "libfabric": stage_libfabric, "nccltests": stage_nccltests, "pack": stage_pack, "ncclbuild": stage_ncclbuild,
    "fabtests": stage_fabtests, "doctor": stage_doctor, "loading": stage_loading, "collectives": stage_collectives,
    "variants": stage_variants, "compare": stage_compare, "mpi": stage_mpi, "bound": stage_bound,
    "latency": stage_latency, "memory": stage_memory, "versions": stage_versions, "torch": stage_torch,
    "idle": stage_idle, "torchhosts": stage_torchhosts, "hosts": stage_hosts, "capped": stage_capped,
    "targets": stage_targets, "threads": stage_threads, "steps": stage_steps, "ucx": stage_ucx,
    "ucxhosts": stage_ucxhosts, "conform": stage_conform, "scale": stage_scale, "ceiling": stage_ceiling,
    "pingpong": stage_pingpong, "all": stage_all,
}


def run_stages(names):
    for name in names:
        log(f"stage {name}")
        if DRY:
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
    global DRY, SHAPE, NCCL_DIR
    if not args or "-h" in args or "--help" in args:
        print(usage(), end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    DRY = "--dry-run" in args
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
    SHAPE = env_or("SHAPE", "gpus" if gpus >= 2 else "hosts")
    if SHAPE == "hosts":
        export("AS_HOSTS", "1")
    NCCL_DIR = probe(["python3", "-c", "import nvidia.nccl as m; print(list(m.__path__)[0])"], "<nvidia.nccl>")
    if NCCL_DIR:
        prepend_library_path(f"{NCCL_DIR}/lib")
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
