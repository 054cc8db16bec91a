"""Stages of two ranks as two hosts on one GPU: bandwidth, capped flows, the targets, threads,
profiled steps, and many hosts."""
import os
import re
import shutil
from glob import glob

from gpurun.config import (
    AS_HOST,
    IN,
    INFO,
    LF,
    NCCL_PROFILER_TARBALL,
    NCCL_TESTS_MPI_DIR,
    OUT,
    PERF_TARBALL,
    SUMMARY,
    WORK,
    env_or,
    now,
)
from gpurun.runner import (
    Failed,
    capture,
    executable,
    execute,
    export,
    failed_build,
    log,
    logf,
    mkdirs,
    need,
    overriding,
    prepend_library_path,
    seconds,
    start,
    timed,
)
from gpurun.record import at_gib, channels, grep, note, results, summary, table_header, variants
from gpurun.nccl import (
    baseline,
    fabric,
    hosts_env,
    hosts_run,
    hosts_shape,
    mpirun,
    plugin_env,
    socket,
    start_mps,
)
from gpurun.build import tool_setup
from gpurun.torchruns import stage_torchhosts
from gpurun.verdict import PARTS, prefix, verdict


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
    first = prefix(env_or("HOSTS_TEST"), env_or("HOSTS_TAG"))
    table_header(f"Two ranks as two hosts on one GPU (MPS), mpirun {env_or('HOSTS_BIND', '--bind-to none')}, "
                 f"{test} {hosts_shape()}")
    shapes = "" if env_or("HOSTS_NO_SOCKET") else os.environ.get("HOSTS_SOCKETS", "socket socket4x4 socket2x8")
    runs = [(f"{first}-{shape}", socket(shape)) for shape in shapes.split()]
    for name, settings in runs:
        hosts_run(name, test, *settings)
    hosts_run(f"{first}-fabric", test, *fabric())
    names = [name for name, _ in runs] + [f"{first}-fabric"]
    spec = env_or("HOSTS_FABRIC_VARIANTS", "NCCL_FABRIC_DOMAINS=eth0")
    for i, v in enumerate([] if spec == "none" else variants(spec), 1):
        # The word "baseline" in a variant runs the plugin in $BASELINE_DIR instead.
        if " baseline " in f" {v} ":
            hosts_run(f"{first}-fabric-v{i}", test, *baseline(*v.replace("baseline", "").split()))
        else:
            hosts_run(f"{first}-fabric-v{i}", test, *fabric(*v.split()))
        names.append(f"{first}-fabric-v{i}")
        note(f"- {first}-fabric-v{i}: {v}")
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
    eth0-to-eth0 traffic here), made as connections appear and removed as they close
    (scripts/gpu/capflows.py; the kernel there has no fq); $CAPPED_TEST (all_reduce_perf),
    Socket as shipped, 4x4, 2x8 and the plugin ($HOSTS_FABRIC_VARIANTS as in hosts, default
    none)"""
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
    try:
        with open(tclog, errors="replace") as f:
            capped = re.findall(r"capped (\d+) connection ends", f.read())
    except OSError:
        capped = []
    note(f"- capped: every TCP connection on lo at most {rate} (an HTB class each, made within 100 ms of its "
         f"start by scripts/gpu/capflows.py, hashed on its ports, and removed once it closed); "
         f"{capped[-1] if capped else 'an unknown number of'} connection ends capped in all")
    execute(["tc", "qdisc", "del", "dev", "lo", "root"], out=tclog, append=True)


def stage_paced():
    """the hosts shape with every TCP connection the ranks make or accept capped at $PACED_MBIT
    Mbit/s (default 250) by its own pacing: scripts/gpu/pacecap.c, preloaded into both ranks,
    sets SO_MAX_PACING_RATE on each socket and TCP paces it by itself, so no qdisc on lo (and
    no lock that every packet takes) stands between the ranks, as none does between two cloud
    hosts; $CAPPED_TEST (all_reduce_perf), Socket's $HOSTS_SOCKETS and the plugin
    ($HOSTS_FABRIC_VARIANTS as in hosts, default none)"""
    mbit, shim = env_or("PACED_MBIT", "250"), f"{WORK}/pacecap.so"
    counts = logf(f"paced{mbit}-sockets")
    mkdirs(WORK)
    if execute(["cc", "-O2", "-shared", "-fPIC", "-o", shim, "scripts/gpu/pacecap.c", "-ldl"],
               out=logf("paced-build")):
        note("- paced: skipped (scripts/gpu/pacecap.c did not build)")
        raise Failed()
    execute(["tc", "qdisc", "del", "dev", "lo", "root"], out=os.devnull)
    preload = f"LD_PRELOAD={shim} PACECAP_MBIT={mbit} PACECAP_LOG={counts}"
    with overriding(HOSTS_TEST=env_or("CAPPED_TEST", "all_reduce_perf"), HOSTS_TAG=f"paced{mbit}",
                    HOSTS_ENV=f"{env_or('HOSTS_ENV')} {preload}".strip(),
                    HOSTS_FABRIC_VARIANTS=env_or("HOSTS_FABRIC_VARIANTS", "none")):
        stage_hosts()
    try:
        with open(counts, errors="replace") as f:
            sockets = sum(int(n) for n in re.findall(r"capped (\d+) sockets", f.read()))
    except OSError:
        sockets = 0
    note(f"- paced: every TCP socket of the ranks paced at most at {mbit} Mbit/s (SO_MAX_PACING_RATE, "
         f"scripts/gpu/pacecap.c; no qdisc on lo); {sockets} sockets capped in all")


def stage_targets():
    """each performance target of many flows with few threads, two ranks as two hosts, the plugin
    with its defaults beside Socket as shipped and 2x8 in the same call, as much as fits in
    $TARGETS_BUDGET seconds of the driver (default 480; what does not fit is named): small
    (all_reduce_perf 8 B-4 MiB, -n 200 -w 20), allreduce (1 MiB-1 GiB, 4x4 too), sendrecv and
    alltoall (1-256 MiB), capped (64-256 MiB, every connection at $CAP_RATE, default 250mbit;
    Socket 2x8 only: as shipped moves less there); then the verdict stage's table. Also bound
    (mpirun's one core per rank) and torch (torchhosts). $TARGETS_PARTS picks (default "small
    allreduce sendrecv alltoall capped"), $TARGETS_VARIANTS (;-separated VAR=VALUE lists) adds
    plugin runs to each part. $TARGETS_NCCL names an NCCL the ncclbuild stage built (a tag, e.g.
    2.30.7-1): every part then runs with it and nccl-tests built against it. Set TIMEOUT=45 or
    so: the default 150 s lets one hang eat the budget"""
    budget = int(env_or("TARGETS_BUDGET", "480"))
    extra = env_or("TARGETS_VARIANTS", "none")
    nccl = env_or("TARGETS_NCCL")
    if nccl:
        lib, tests = f"{WORK}/nccl-{nccl}/build/lib", f"{WORK}/nccl-tests-mpi-{nccl}"
        need(os.path.exists(f"{lib}/libnccl.so") and executable(f"{tests}/all_reduce_perf"),
             f"targets: NCCL {nccl} is not built (run the ncclbuild stage with NCCL_TAGS={nccl})")
        prepend_library_path(lib)
        export("HOSTS_TESTS_DIR", tests)
    parts = {part: (stage_capped if part == "capped" else stage_hosts,
                    dict(HOSTS_TEST=test, HOSTS_TAG=tag, HOSTS_SOCKETS=sockets, HOSTS_FABRIC_VARIANTS=extra,
                         CAP_RATE=env_or("CAP_RATE", "250mbit"), **settings))
             for part, (test, tag, sockets, settings) in PARTS.items()}
    parts["bound"] = (stage_hosts, dict(MINBYTES="1M", MAXBYTES="1G", HOSTS_BIND="--bind-to core", HOSTS_TAG="bound",
                                        HOSTS_FABRIC_VARIANTS="NCCL_FABRIC_PROGRESS_THREAD=yes"))
    parts["torch"] = (stage_torchhosts, {})
    for part in env_or("TARGETS_PARTS", "small allreduce sendrecv alltoall capped").split():
        if seconds() >= budget:
            note(f"- targets: {part} not run ({seconds()}s of the {budget}s budget used)")
            continue
        log(f"targets: {part}")
        if part not in parts:
            log(f"targets: no part {part}")
            continue
        stage, settings = parts[part]
        try:
            with overriding(**settings):
                stage()
        except Failed as e:
            note(f"- targets: {part} failed{f' ({e})' if str(e) else ''}")
    stage_verdict()


def stage_verdict():
    """the targets table from the targets stage's logs in $OUT/logs (also on logs fetched from a GPU
    machine): for each target the plugin, Socket as shipped and 2x8 from the same call, the ratio,
    and whether it is met"""
    nccl = f"NCCL {env_or('TARGETS_NCCL')}" if env_or("TARGETS_NCCL") else "PyTorch's NCCL"
    note("", f"## The targets ({nccl}; scripts/gpu/gpurun/verdict.py, from this call's runs)", "",
         *verdict(f"{OUT}/logs"))


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
    if not now.dry and not shutil.which("perf"):
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
            for f in [] if now.dry else glob(f"{dump}_*.json"):
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
            if traces or now.dry:
                execute(["tar", "-C", f"{WORK}/steps", "-cJf", f"{OUT}/logs/steps-{name}-{size}.tar.xz",
                         *(traces or [f"{name}-{size}_*.json"])],
                        out=os.devnull)
    note(*[f"- variant: {v}" for v in extra])
    note("", "Where each step's time goes (median time of the phase / steps in that phase on average while the "
         "operation ran):", "")
    summary(capture(["python3", "scripts/gpu/steps.py", "--header"])[1])
    note(*rows)


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
