"""Stages over libfabric's ucx provider with GPU buffers, and the conformance report."""
import os
import re

from gpurun.config import IN, LF, PLUGIN, PLUGIN_DIR, WORK, env_or, now
from gpurun.runner import Failed, capture, execute, log, logf, need, remove, timed
from gpurun.record import channels, grep, note, summary, table_header
from gpurun.nccl import fabric, hosts_run, hosts_shape, install_plugin, socket, start_mps
from gpurun.build import build_libfabric


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
             f"{n}: channels {channels(path, r'Channel [0-9]+/[0-9]+ : .* via NET/[A-Za-z]+/[0-9]+(/GDRDMA)?')}",
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
        if not now.dry and not os.path.exists(f"{LF}/lib/libfabric.so"):
            break
        env = [f"LD_LIBRARY_PATH={LF}/lib:{os.environ.get('LD_LIBRARY_PATH', '')}", "NCCL_FABRIC_DOMAINS=eth0,shm"]
        rc, text = capture(timed([*conform, p, "--plugin", PLUGIN], "240", kill=False), env, merge=True)
        summary(f"\n## conform over {p} (libfabric with CUDA)\n```\n{text}exit {rc}\n```\n")
