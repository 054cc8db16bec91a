#!/usr/bin/env python3
"""Caps every TCP connection on one device at one rate, the way clouds cap each flow.

    capflows.py DEV RATE SECONDS

Expects an HTB root qdisc `1:` on DEV (default class 1:1 uncapped). Every 100 ms, for
SECONDS, it reads /proc/net/tcp and /proc/net/tcp6 and gives each established connection it
has not seen a class of its own at RATE (tc's units: 2gbit), chosen by a u32 filter on both
ports: each end of a connection between two processes of this machine is a line there, one
direction. IPv4 filters sit in a u32 hash table of 256 buckets keyed on the low byte of the
source port, and a connection's filter and class go once it is no longer established: every
packet is then matched against a handful of filters, not against every connection the runs
before it made. IPv6 filters stay in a list. Prints, as it goes, how many connection ends it
capped and let go.
"""

import atexit
import signal
import subprocess
import sys
import time

# The u32 hash table of the IPv4 filters (handle 2:) and its buckets.
TABLE, BUCKETS = 2, 256


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


class Tc:
    """One `tc -batch` process, fed a command a line (no process per command)."""

    def __init__(self):
        self.proc = subprocess.Popen(["tc", "-force", "-batch", "-"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)

    def __call__(self, *args):
        self.proc.stdin.write(" ".join(args) + "\n")

    def flush(self):
        self.proc.stdin.flush()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def main():
    dev, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    tc = Tc()
    filt = ["filter", "add", "dev", dev, "parent", "1:"]
    # The hash table, and the filter that sends every IPv4 TCP packet to its bucket: the
    # source port's low byte (the 32-bit word 20 bytes into a header without options holds
    # both ports).
    tc(*filt, "prio", "1", "handle", f"{TABLE}:", "protocol", "ip", "u32", "divisor", str(BUCKETS))
    tc(*filt, "prio", "1", "protocol", "ip", "u32", "ht", "800::", "match", "ip", "protocol", "6", "0xff",
       "hashkey", "mask", "0x00ff0000", "at", "20", "link", f"{TABLE}:")
    tc.flush()
    live = {}  # (sport, dport, v6) -> (class id, filter handle or None)
    free = []  # class ids let go, for reuse
    fresh = iter(range(0x11, 0xFF00))  # class ids never used
    nodes = [0] * BUCKETS  # the last node id used in each bucket
    counts = {"capped": 0}  # connection ends capped so far (for the line printed at exit)
    until = time.monotonic() + seconds
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    atexit.register(lambda: print(f"capped {counts['capped']} connection ends at {rate}", flush=True))
    while time.monotonic() < until:
        now = set(established())
        added, gone = 0, [k for k in live if k not in now]
        for key in gone:
            cls, handle = live.pop(key)
            if handle:
                tc("filter", "del", "dev", dev, "parent", "1:", "prio", "1", "handle", handle,
                   "protocol", "ip", "u32")
                tc("class", "del", "dev", dev, "classid", f"1:{cls:x}")
                free.append(cls)
        for key in now:
            sport, dport, v6 = key
            cls = None if key in live else free.pop() if free else next(fresh, None)
            if cls is None:
                continue
            counts["capped"] += 1
            added += 1
            tc("class", "add", "dev", dev, "parent", "1:", "classid", f"1:{cls:x}", "htb", "rate", rate,
               "ceil", rate, "quantum", "65536")
            field = "ip6" if v6 else "ip"
            match = ["match", field, "sport", str(sport), "0xffff",
                     "match", field, "dport", str(dport), "0xffff", "flowid", f"1:{cls:x}"]
            handle = None
            if v6:
                tc(*filt, "protocol", "ipv6", "prio", "2", "u32", *match)
            else:
                bucket = sport & (BUCKETS - 1)
                nodes[bucket] = nodes[bucket] % 0xFFF + 1
                handle = f"{TABLE}:{bucket:x}:{nodes[bucket]:x}"
                tc(*filt, "prio", "1", "handle", handle, "protocol", "ip", "u32", "ht",
                   f"{TABLE}:{bucket:x}:", *match)
            live[key] = (cls, handle)
        tc.flush()
        if added or gone:
            print(f"{time.strftime('%H:%M:%S')} +{added} -{len(gone)} connection ends "
                  f"({len(live)} capped now)", flush=True)
        time.sleep(0.1)
    tc.close()


if __name__ == "__main__":
    main()
