"""Side-by-side times per message size from nccl-tests logs: `python3 sizes.py LOG...` prints a
Markdown table, one row per size, one column per log (out-of-place time in µs)."""
import os
import re
import sys


# A line NCCL or the plugin logs (`host:pid:tid [dev] NCCL INFO ...`), which may land in the
# middle of a result row when another thread writes it while nccl-tests prints.
LOGGED = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ \[\d+\] NCCL (INFO|WARN|TRACE).*$")


def times(path):
    """{size: out-of-place time in µs} from an nccl-tests log; a row cut by a log line is
    joined with the rest of it, which follows the log lines."""
    out = {}
    pending = []
    with open(path, errors="replace") as f:
        for line in f:
            w = pending + LOGGED.sub("", line.rstrip("\n")).split()
            pending = []
            if not w:
                continue
            # size count type redop root time algbw busbw #wrong time algbw busbw #wrong
            row = len(w) > 1 and w[0].isdigit() and w[1].isdigit()
            if row and len(w) < 13 and LOGGED.search(line):
                pending = w
                continue
            if row and len(w) >= 13:
                try:
                    out[int(w[0])] = float(w[5])
                except ValueError:
                    pass
    return out


def main(paths):
    cols = [(os.path.basename(p).removesuffix(".log"), times(p)) for p in paths]
    sizes = sorted(set().union(*(t.keys() for _, t in cols)))
    print("| size | " + " | ".join(n for n, _ in cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    for s in sizes:
        cells = [f"{t[s]:.1f}" if s in t else "-" for _, t in cols]
        print(f"| {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
