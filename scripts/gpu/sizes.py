"""Side-by-side times per message size from nccl-tests logs: `python3 sizes.py LOG...` prints a
Markdown table, one row per size, one column per log (out-of-place time in µs)."""
import os
import sys

from gpurun.record import results


def times(path):
    """{size: out-of-place time in µs} from an nccl-tests log."""
    out = {}
    for w in results(path):
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
