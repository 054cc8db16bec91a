"""Stages on one machine's GPUs: the doctor, loading, the collectives, variants, comparisons,
bindings, latency, memory and NCCL versions."""
import os
import socket as sockets
from glob import glob

from gpurun.config import (
    AS_HOST,
    BASELINE_DIR,
    INFO,
    NATIVE_TCP,
    NCCL_TESTS_DIR,
    NCCL_TESTS_MPI_DIR,
    NET_ONLY,
    OUT,
    PLUGIN,
    PLUGIN_DIR,
    RXM,
    SHM,
    WORK,
    env_or,
    now,
)
from gpurun.runner import (
    capture,
    cost,
    executable,
    execute,
    lines,
    log,
    logf,
    measured,
    probe,
    seconds,
    timed,
)
from gpurun.record import fmt, grep, note, num, row, summary, table_header, wrong
from gpurun.nccl import baseline, fabric, mpirun, nccl_test, plugin_env, shape_words, socket, tests_run
from gpurun.build import nccl_tags


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
    if not now.dry:
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
    if not now.dry:
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
               *(AS_HOST if now.shape == "hosts" else []), f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf",
               "-b", env_or("MINBYTES", "1M"), "-e", env_or("MAXBYTES", "1G"), "-f", "4", "-g", "1",
               "-n", env_or("ITERS", "10"), "-w", env_or("WARMUP", "3")]
        t0, run = seconds(), f"{stage}-{name}"
        rc = execute(measured(run, timed(cmd)) if measure else timed(cmd), out=logf(run))
        row(run, "all_reduce_perf", rc, seconds() - t0, cost(run) if measure else "")


def stage_mpi():
    """all_reduce_perf as 2 processes (mpirun --bind-to none): Socket, Socket 4x4, tcp;ofi_rxm,
    native tcp, shm ($MPI_RUNS picks)"""
    plugin_env()
    if not now.dry and not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
        note("- mpi: skipped (no nccl-tests built with MPI=1)")
        return
    hosts = ", each a host on GPU 0" if now.shape == "hosts" else ""
    table_header(f"all_reduce_perf, 2 processes (mpirun -np 2, -g 1{hosts}), P2P and SHM off")
    mpi_runs("mpi", env_or("MPI_RUNS", "socket socket4x4 rxm tcp shm").split(), "--bind-to none", measure=True)


def stage_bound():
    """all_reduce_perf, mpirun -np 2 with its default binding (one core per rank): Socket, the
    plugin as it sizes itself, and lane/thread variants ($BOUND_RUNS picks)"""
    plugin_env()
    if not now.dry and not executable(f"{NCCL_TESTS_MPI_DIR}/all_reduce_perf"):
        note("- bound: skipped (no MPI build)")
        return
    table_header("all_reduce_perf, mpirun -np 2 with its default binding (one core per rank), -g 1")
    runs = env_or("BOUND_RUNS", "socket rxm rxm-4lanes rxm-2lanes-threads shm shm-threads").split()
    mpi_runs("bound", runs, "", measure=False)
    note(*[line[:400] for line in grep(logf("bound-rxm"), "sizing:", 1)])


def stage_latency():
    """all_reduce_perf from 8 bytes to $LATENCY_MAXBYTES (default 8), -n 2000 -w 200: Socket,
    tcp;ofi_rxm, shm (or $LATENCY_RUNS: socket fabric rxm shm, or NAME:VAR=VALUE,VAR=VALUE for the
    plugin over tcp;ofi_rxm with those settings; repeats allowed, so that variants can take
    turns)"""
    plugin_env()
    top = env_or("LATENCY_MAXBYTES", "8")
    note("", f"## all_reduce_perf 8 B-{top} B ({shape_words()}, -n 2000 -w 200), P2P and SHM off: "
         "time in us (out-of-place, in-place)", "")
    ways = {"socket": socket(), "fabric": fabric(), "rxm": fabric(RXM), "shm": fabric(SHM)}
    for i, spec in enumerate(env_or("LATENCY_RUNS", "socket rxm shm").split(), 1):
        name, _, settings = spec.partition(":")
        env = fabric(RXM, *settings.split(",")) if settings else ways.get(name, [])
        log(f"run latency-{i}-{name}")
        cmd = nccl_test(NCCL_TESTS_DIR, "all_reduce_perf", "-b", "8", "-e", top, "-f", "2", "-n", "2000", "-w", "200")
        rc = execute(timed(cmd), [*NET_ONLY, *INFO, *env], out=logf(f"latency-{i}-{name}"))
        times = [f"{w[0]} B {w[5]} / {w[9]} us, #wrong {fmt(num(w[8]) + num(w[12]))}"
                 for w in map(str.split, lines(logf(f"latency-{i}-{name}"))) if len(w) >= 13 and w[0].isdigit()]
        note(f"- {spec} (rc={rc}): " + "; ".join(times))


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
    versions_row("2.28.9-pip", f"{now.nccl_dir}/lib", NCCL_TESTS_DIR)
    for tag in nccl_tags():
        lib, tests = f"{WORK}/nccl-{tag}/build/lib", f"{WORK}/nccl-tests-{tag}"
        if now.dry or (os.path.exists(f"{lib}/libnccl.so") and executable(f"{tests}/all_reduce_perf")):
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
