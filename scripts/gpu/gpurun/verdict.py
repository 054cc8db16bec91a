"""What the targets stage's runs say about each performance target of many flows with few
threads: the plugin beside Socket as shipped and 2x8 from the same call, read back out of the
runs' logs, one table row per target, with the ratio and whether it is met."""
import re

from gpurun.record import average, results
from gpurun.runner import lines

# The parts of the targets stage: nccl-tests binary, the tag its runs are named by, Socket's
# shapes beside the plugin, and the nccl-tests settings.
PARTS = {
    "small": ("all_reduce_perf", "small", "socket socket2x8",
              dict(MINBYTES="8", MAXBYTES="4M", ITERS="200", WARMUP="20")),
    "allreduce": ("all_reduce_perf", "big", "socket socket4x4 socket2x8", dict(MINBYTES="1M", MAXBYTES="1G")),
    "sendrecv": ("sendrecv_perf", "p2p", "socket socket2x8", dict(MINBYTES="1M", MAXBYTES="256M")),
    "alltoall": ("alltoall_perf", "p2p", "socket socket2x8", dict(MINBYTES="1M", MAXBYTES="256M")),
    # stage_capped names its runs itself (tag "capped").
    "capped": ("all_reduce_perf", "capped", "socket2x8", dict(MINBYTES="64M", MAXBYTES="256M")),
}

# What the targets ask: the plugin's busbw (time, for point-to-point) at least this many times
# Socket 2x8's.
WIN = 1.5
MIB = 1 << 20


def prefix(test, tag):
    """The name every run of stage_hosts starts with for TEST (where named) and TAG."""
    return "hosts" + (f"-{re.sub(r'_perf$', '', test)}" if test else "") + (f"-{tag}" if tag else "")


def run_name(part, shape):
    """The run of PART (see PARTS) for SHAPE (socket, socket2x8 ... or fabric)."""
    test, tag, _, _ = PARTS[part]
    return f"{prefix(test, tag)}-{shape}"


class Run:
    """What one run's log and cost file say."""

    def __init__(self, logs, name):
        self.name = name
        self.rows = {int(w[0]): w for w in results(f"{logs}/{name}.log") if w[0].isdigit()}
        self.text = lines(f"{logs}/{name}.log")
        self.cost = dict(re.findall(r"(\w+)=([\d.]+)", " ".join(lines(f"{logs}/{name}.cost"))))

    def __bool__(self):
        return bool(self.rows)

    def _field(self, size, i):
        try:
            return float(self.rows[size][i])
        except (KeyError, ValueError):
            return None

    def time(self, size):
        """Out-of-place time at SIZE (µs)."""
        return self._field(size, 5)

    def busbw(self, size):
        """Out-of-place busbw at SIZE (GB/s)."""
        return self._field(size, 7)

    def average(self):
        """nccl-tests' average busbw (GB/s)."""
        try:
            return float(average(self.text))
        except ValueError:
            return None

    def cpu(self):
        return float(self.cost["cpu_s"]) if "cpu_s" in self.cost else None

    def rss(self):
        return float(self.cost["peak_rss_mib"]) if "peak_rss_mib" in self.cost else None

    def largest(self):
        return max(self.rows) if self.rows else None

    def sizing(self):
        """(CPUs for the rank, busy plugin threads) from the plugin's INFO sizing line."""
        for line in self.text:
            m = re.search(r"so (\d+) CPUs for this rank.*?(?:\((\d+) busy thread|no progress threads)", line)
            if m:
                return int(m.group(1)), int(m.group(2) or 0)
        return None


def ratio(a, b):
    return a / b if a and b else None


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def size_text(size):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def met(ok, baseline_bad=False):
    if baseline_bad:
        return "**baseline disturbed**: Socket 2×8 slower than as shipped; run again"
    return "-" if ok is None else "met" if ok else "**not met**"


def disturbed(shipped_tuned):
    """Whether Socket 2x8 moved less than Socket as shipped at any of SHIPPED_TUNED's (as shipped,
    2x8) pairs of busbw (or of any rate): 2x8 spreads each comm over 16 sockets where as shipped
    uses one, and moved 1.6-2.4 times as much in undisturbed calls; slower, something else took
    the machine's CPUs during its run, and no ratio against it means anything."""
    return any(s is not None and t is not None and t < s for s, t in shipped_tuned)


def bandwidth_row(what, fabric, shipped, tuned, sizes):
    """A target of busbw at SIZES and on average of at least WIN times Socket 2x8 (TUNED), at no
    more CPU: the plugin's figures, Socket's, the ratios, and whether it is met."""
    if not fabric or not tuned:
        return f"| {what} | not run | | | | - |"
    sizes = [s for s in sizes if s in fabric.rows and s in tuned.rows]
    cells = [(size_text(s), fabric.busbw(s), shipped.busbw(s) if shipped else None, tuned.busbw(s)) for s in sizes]
    cells.append(("average", fabric.average(), shipped.average() if shipped else None, tuned.average()))
    ratios = [ratio(f, t) for _, f, _, t in cells]
    cpu = ratio(fabric.cpu(), tuned.cpu())
    ok = None if None in ratios else all(r >= WIN for r in ratios) and cpu is not None and cpu <= 1.0
    bad = disturbed([(s, t) for _, _, s, t in cells])

    def figures(i):
        return ", ".join(f"{c[0]} {fmt(c[i + 1])}" for c in cells)

    plugin = f"{figures(0)} GB/s; {fmt(fabric.cpu(), 1)} CPU-s, {fmt(fabric.rss(), 0)} MiB"
    socket = f"{figures(1)}; {fmt(shipped.cpu(), 1)} CPU-s" if shipped else "not run"
    socket2x8 = f"{figures(2)}; {fmt(tuned.cpu(), 1)} CPU-s, {fmt(tuned.rss(), 0)} MiB"
    shown = ", ".join(f"{label} {fmt(r)}×" for (label, *_), r in zip(cells, ratios))
    return f"| {what} | {plugin} | {socket} | {socket2x8} | {shown}; CPU {fmt(cpu)}× | {met(ok, bad)} |"


def point_to_point_row(what, fabric, shipped, tuned, size=256 * MIB):
    """A target of the plugin's time at SIZE at most 1/WIN of Socket 2x8's."""
    if not fabric or not tuned:
        return f"| {what} | not run | | | | - |"
    f, s, t = fabric.time(size), shipped.time(size) if shipped else None, tuned.time(size)
    shipped_average = shipped.average() if shipped else None
    r = ratio(t, f)
    bad = disturbed([(ratio(size, s), ratio(size, t)), (shipped_average, tuned.average())])
    return (f"| {what} | {fmt(f, 0)} µs, average {fmt(fabric.average())} GB/s; {fmt(fabric.cpu(), 1)} CPU-s | "
            f"{fmt(s, 0)} µs, {fmt(shipped_average)} GB/s | "
            f"{fmt(t, 0)} µs, {fmt(tuned.average())} GB/s; {fmt(tuned.cpu(), 1)} CPU-s | "
            f"{fmt(r)}× 2×8, {fmt(ratio(s, f))}× as shipped; CPU {fmt(ratio(fabric.cpu(), tuned.cpu()))}× | "
            f"{met(None if r is None else r >= WIN, bad)} |")


def every_size_row(pairs):
    """The target of a time no longer than Socket as shipped's at every size, over PAIRS of
    (plugin, Socket as shipped) runs; a size measured in two pairs is judged by the first."""
    seen, slower, faster = set(), [], 0
    for fabric, shipped in pairs:
        if not fabric or not shipped:
            continue
        for size in sorted(set(fabric.rows) & set(shipped.rows) - seen):
            seen.add(size)
            f, s = fabric.time(size), shipped.time(size)
            if f is None or s is None:
                continue
            if f > s:
                slower.append(f"{size_text(size)} {fmt(f, 1)} against {fmt(s, 1)}")
            else:
                faster += 1
    if not seen:
        return "| time ≤ Socket as shipped at every size | not run | | | | - |"
    sizes = f"{size_text(min(seen))}–{size_text(max(seen))}"
    told = "slower at " + "; ".join(slower) + " µs" if slower else "no size slower"
    return (f"| time ≤ Socket as shipped at every size ({sizes}) | faster or as fast at {faster} of "
            f"{len(seen)} sizes; {told} | the same runs | | | {met(not slower)} |")


def threads_row(fabric):
    got = fabric.sizing() if fabric else None
    if not got:
        return "| busy plugin threads ≤ max(2, CPUs/4) | no sizing line | | | | - |"
    cpus, busy = got
    allowed = max(2, cpus // 4)
    return (f"| busy plugin threads ≤ max(2, CPUs/4) | {busy} busy thread(s) at {cpus} CPUs for the rank "
            f"(INFO sizing line) | | | {busy} against {allowed} allowed | {met(busy <= allowed)} |")


def verdict(logs):
    """The targets table (Markdown lines) from the targets stage's logs in LOGS."""
    def run(part, shape):
        return Run(logs, run_name(part, shape))

    def trio(part):
        """PART's runs of the plugin, Socket as shipped and Socket 2x8."""
        return [run(part, s) for s in ("fabric", "socket", "socket2x8")]

    big, capped, sendrecv, alltoall = trio("allreduce"), trio("capped"), trio("sendrecv"), trio("alltoall")
    largest = capped[0].largest() or 256 * MIB
    small = [run("small", s) for s in ("fabric", "socket")]
    rows = [
        bandwidth_row("all_reduce uncapped ≥ 1.5× Socket 2×8 at 512 MiB, 1 GiB and on average, CPU-s ≤", *big,
                      [512 * MIB, 1024 * MIB]),
        bandwidth_row(f"all_reduce per-connection cap ≥ 1.5× Socket 2×8 at {size_text(largest)} and on average, "
                      "CPU-s ≤", *capped, [largest]),
        every_size_row([small[:2], big[:2]]),
        point_to_point_row("sendrecv 256 MiB ≥ 1.5× Socket 2×8", *sendrecv),
        point_to_point_row("alltoall 256 MiB ≥ 1.5× Socket 2×8", *alltoall),
        threads_row(next((r for r in (big[0], small[0], sendrecv[0], alltoall[0], capped[0]) if r.sizing()), None)),
    ]
    return ["| target | plugin | Socket as shipped | Socket 2×8 | ratio | status |",
            "| --- | --- | --- | --- | --- | --- |", *rows]
