#!/usr/bin/env python3
"""Caps every TCP connection on one device at one rate, the way clouds cap each flow.

    capflows.py DEV RATE SECONDS

Expects an HTB root qdisc `1:` on DEV (default class 1:1 uncapped). Every 100 ms, for
SECONDS, it reads /proc/net/tcp and /proc/net/tcp6 and gives each established connection it
has not seen a class of its own at RATE (tc's units: 2gbit), chosen by a u32 filter on both
ports: each end of a connection between two processes of this machine is one direction.
Prints, as it goes, how many connection ends it capped (each end of a connection
between two processes of this machine is a line of /proc/net/tcp, one direction).
"""

import atexit
import signal
import subprocess
import sys
import time


def established():
    """(local port, remote port, ipv6) of every established TCP connection."""
    out = []
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 3 and f[3] == "01":
                out.append((int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16), v6))
    return out


def tc(*args):
    subprocess.run(["tc", *args], check=False, capture_output=True)


def main():
    dev, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    seen = set()
    until = time.monotonic() + seconds
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    atexit.register(lambda: print(f"capped {len(seen)} connections at {rate}", flush=True))
    while time.monotonic() < until:
        before = len(seen)
        for sport, dport, v6 in established():
            if (sport, dport) in seen or len(seen) >= 0xFF00:
                continue
            seen.add((sport, dport))
            cls = f"1:{0x10 + len(seen):x}"
            tc("class", "add", "dev", dev, "parent", "1:", "classid", cls, "htb", "rate", rate,
               "ceil", rate, "quantum", "65536")
            proto, field, prio = ("ipv6", "ip6", "2") if v6 else ("ip", "ip", "1")
            tc("filter", "add", "dev", dev, "parent", "1:", "protocol", proto, "prio", prio,
               "u32", "match", field, "sport", str(sport), "0xffff", "match", field, "dport",
               str(dport), "0xffff", "flowid", cls)
        if len(seen) > before:
            print(f"{time.strftime('%H:%M:%S')} +{len(seen) - before} connection ends "
                  f"({len(seen)} in all)", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
