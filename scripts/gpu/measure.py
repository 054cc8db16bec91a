"""Runs a command and prints, on stderr, the CPU seconds (user + system) and the peak resident
memory of the process tree it started: `python3 measure.py OUT_FILE CMD...` appends
`cpu_s=<s> peak_rss_mib=<MiB> rc=<code>` to OUT_FILE and exits with the command's code."""
import resource
import subprocess
import sys


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    rc = subprocess.call(cmd)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "a") as f:
        f.write(f"cpu_s={ru.ru_utime + ru.ru_stime:.1f} peak_rss_mib={ru.ru_maxrss / 1024:.0f} rc={rc}\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
