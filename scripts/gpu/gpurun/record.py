"""The summary: tables with one row per run, notes, and what is read back out of the logs."""
import re
from collections import Counter

from gpurun.config import SUMMARY, TIMEOUT, now
from gpurun.runner import lines, logf


def summary(text):
    """Appends TEXT to the summary (not in a dry run)."""
    if not now.dry:
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
    avg = average(lines(path))
    gib = [w[7] for w in results(path) if w[0] == "1073741824"]
    via = grep(path, r"via NET/[A-Za-z]*", 1, only=True)
    status = "ok" if rc == 0 else f"HUNG (killed after {TIMEOUT}s)" if rc in (124, 137) else f"failed rc={rc}"
    note(f"| {name} | {test} | {via[0] if via else '?'} | {gib[-1] if gib else '-'} | {avg or '-'} "
         f"| {wrong(path)} | {status} | {secs}s | {cost_.rsplit(' rc=', 1)[0]} |")


def average(log):
    """nccl-tests' average busbw as the last "Avg bus bandwidth" line of LOG (its lines) gives it,
    as text; empty if none."""
    found = [re.sub(r"[ A-Z]", "", (line.split(":") + [""])[1]) for line in log if "Avg bus bandwidth" in line]
    return found[-1] if found else ""


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


# A line NCCL or the plugin logs (`host:pid:tid [dev] NCCL INFO ...`), which may land in the
# middle of a result line when another thread writes it while nccl-tests prints.
LOGGED = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ \[\d+\] NCCL (INFO|WARN|TRACE).*$")


def results(path):
    """The result lines of an nccl-tests log, split into fields (size count type redop root
    time algbw busbw #wrong time algbw busbw #wrong); one cut by a log line is joined with the
    rest of it, which follows the log lines."""
    found, pending = [], []
    for line in lines(path):
        w = pending + LOGGED.sub("", line).split()
        pending = []
        started = len(w) > 1 and w[0].isdigit() and w[1].isdigit()
        if started and len(w) < 13 and LOGGED.search(line):
            pending = w
        elif started and len(w) >= 13:
            found.append(w)
    return found


def wrong(path):
    """#wrong of every result of an nccl-tests log, out of place and in place."""
    return fmt(sum(num(w[8]) + num(w[12]) for w in results(path)))


def at_gib(path, text):
    """TEXT formatted with the fields of each 1 GiB result of an nccl-tests log."""
    return [text.format(*w) for w in results(path) if w[0] == "1073741824"]


def channels(path, pattern=r"Channel [0-9]+/[0-9]+ : .* via NET/[A-Za-z]+/[0-9]+"):
    """How many of NCCL's channels use each NET device, on one line: the distinct channel numbers
    of its "Channel NN/c : ... via NET/..." lines (every rank writes one per channel, connection
    and direction)."""
    seen = {(line.split("/")[0], line.rsplit(" via ", 1)[1]) for line in grep(path, pattern, only=True)}
    return "".join(f" {n} {via};" for via, n in sorted(Counter(via for _, via in seen).items()))


def variants(text):
    """The ;-separated VAR=VALUE lists of TEXT (none in an empty one)."""
    v = text.split("\n")[0].split(";")
    return v[:-1] if v[-1] == "" else v
