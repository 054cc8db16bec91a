"""Stages that run PyTorch: all-reduce, idle cores, and as two hosts."""


from gpurun.config import INFO, NET_ONLY, PLUGIN, RXM, SHM, TORCHRUN, env_or
from gpurun.runner import execute, logf, timed
from gpurun.record import grep, note, variants
from gpurun.nccl import baseline, fabric, plugin_env, socket, start_mps, torchrun_measured


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
