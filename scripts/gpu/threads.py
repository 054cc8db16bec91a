"""Where a run's CPU time goes, thread by thread: `python3 threads.py OUT_FILE CMD...` runs the
command, reads /proc/PID/task/TID/stat of every process below it four times a second, and
appends to OUT_FILE a Markdown table of CPU seconds by thread name (NCCL's proxy threads,
the plugin's `nfab-*` threads, Socket's helpers, the GPU host thread …), summed over the
processes, with how many threads had the name and their share of the run's wall time.
A thread's figure is the last one read before it exited (at most 0.25 s of it is lost)."""
import os
import subprocess
import sys
import threading
import time

from measure import descendants

TICK = os.sysconf("SC_CLK_TCK")


def sample(root: int, seen: dict) -> None:
    for pid in descendants(root):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            seen[(pid, int(tid))] = (name, cpu)


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    start = time.monotonic()
    child = subprocess.Popen(cmd)
    seen: dict = {}
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            sample(child.pid, seen)
            done.wait(0.25)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    rc = child.wait()
    done.set()
    t.join()
    wall = time.monotonic() - start
    by_name: dict = {}
    for (_, _), (name, cpu) in seen.items():
        n, c = by_name.get(name, (0, 0.0))
        by_name[name] = (n + 1, c + cpu)
    total = sum(c for _, c in by_name.values())
    with open(out, "a") as f:
        f.write(f"\nwall {wall:.1f} s, CPU {total:.1f} s over {len(seen)} threads, rc={rc}\n\n")
        f.write("| thread name | threads | CPU s | cores over the run |\n| --- | --- | --- | --- |\n")
        for name, (n, c) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
            if c >= 0.05:
                f.write(f"| `{name}` | {n} | {c:.1f} | {c / wall:.2f} |\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
