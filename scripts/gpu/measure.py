"""Runs a command and records what it cost: `python3 measure.py OUT_FILE CMD...` appends
`cpu_s=<s> peak_rss_mib=<MiB> ... rc=<code>` to OUT_FILE and exits with the command's code.

cpu_s and peak_rss_mib are the kernel's figures for the process tree (user + system CPU
seconds; the largest resident set of any one process). While the command runs, the resident
memory of its processes is also sampled twice a second from /proc/PID/smaps, and the sample
with the most is broken down by kind of mapping, so a run's memory can be attributed:
anon_mib (private anonymous memory: malloc arenas, provider buffer pools, thread stacks),
gpu_mib (mappings of /dev/nvidia*: pinned host memory and GPU mappings), shm_mib (/dev/shm
files), lib_mib (shared libraries) and file_mib (other files)."""
import os
import resource
import subprocess
import sys
import threading


def descendants(root: int) -> list:
    """The pids of root and every process below it."""
    parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(p for p, pp in parent.items() if pp == pid)
    return tree


def kind(path: str) -> str:
    if not path or path.startswith("["):
        return "anon"
    if path.startswith("/dev/nvidia"):
        return "gpu"
    if path.startswith("/dev/shm"):
        return "shm"
    if ".so" in os.path.basename(path):
        return "lib"
    return "file"


def breakdown(pids: list) -> dict:
    """Resident KiB by kind of mapping, summed over pids."""
    kib = {"anon": 0, "gpu": 0, "shm": 0, "lib": 0, "file": 0}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps") as f:
                path = ""
                for line in f:
                    first = line.split(maxsplit=1)[0]
                    if "-" in first and not first.endswith(":"):
                        fields = line.split(maxsplit=5)
                        path = fields[5].strip() if len(fields) > 5 else ""
                    elif first == "Rss:":
                        kib[kind(path)] += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return kib


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    proc = subprocess.Popen(cmd)
    peak = {"anon": 0, "gpu": 0, "shm": 0, "lib": 0, "file": 0}
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.5):
            now = breakdown(descendants(proc.pid))
            if sum(now.values()) > sum(peak.values()):
                peak = now

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    done.set()
    sampler.join()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    parts = " ".join(f"{k}_mib={v // 1024}" for k, v in peak.items())
    with open(out, "a") as f:
        f.write(
            f"cpu_s={ru.ru_utime + ru.ru_stime:.1f} peak_rss_mib={ru.ru_maxrss / 1024:.0f} "
            f"{parts} rc={rc}\n"
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
