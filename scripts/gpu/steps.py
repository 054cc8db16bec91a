#!/usr/bin/env python3
"""Where the time of NCCL's network steps goes, from the traces of NCCL's example profiler plugin.

Usage: steps.py NAME DUMP_PREFIX...   (appends a Markdown table row per NAME to stdout)
       steps.py --header

NCCL's proxy moves a network transfer in steps (NCCL_STEPS slots per channel and direction). For
each step the example profiler (ext-profiler/example in NCCL's source, NCCL_PROFILE_EVENT_MASK=16)
records the phases:
  send:    GPU wait (slot given to the GPU until its data is in it), peer wait (until the network
           plugin accepted the isend), network (isend accepted until test says done)
  receive: network (irecv posted until test says done), flush, GPU wait (until the GPU consumed it)
The dumps are files PREFIX_<commHash>_<rank>.json, one line an event. For every proxy operation
(one channel, one direction, one collective) this reads its steps and reports, over all operations
of all ranks: the median time of each phase, how many steps were in each phase on average
while the operation ran, and the operation's time over its steps (the pipeline's period) (Little's law: the sum of the phase's durations over the operation's
time). A pipeline whose steps sit in "GPU wait" waits for the GPU; one whose steps sit in
"network" waits for the transport.
"""
import glob
import re
import statistics
import sys

LINE = re.compile(r'"name": "([A-Za-z ]+)", "cat": "([A-Z_]+)", "ph": "([be])", "id": (\d+), '
                  r'"pid": (\d+), "tid": \d+, "ts": ([-0-9.e+]+)(.*)')
ARG = re.compile(r'"(\w+)": ([-0-9]+)')
SEND = ("SendGpuWait", "SendPeerWait", "SendWait")
RECV = ("RecvWait", "RecvFlushWait", "RecvGpuWait")


def operations(path):
    """The proxy operations of one dump: {send, start, stop, phases: {phase: [durations]}}."""
    ops, op, open_ = [], None, {}
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if not m:
                continue
            name, cat, ph, ident, ts = m.group(1), m.group(2), m.group(3), m.group(4), float(m.group(6))
            args = dict((k, int(v)) for k, v in ARG.findall(m.group(7)))
            if cat == "PROXY" and name in ("ProgressSend", "ProgressRecv"):
                if ph == "b":
                    op = {"send": name == "ProgressSend", "start": ts, "stop": None,
                          "phases": {}}
                elif op is not None:
                    op["stop"] = ts
                    ops.append(op)
                    op = None
            elif cat == "NET" and op is not None and name in SEND + RECV:
                if ph == "b":
                    open_[(name, ident)] = ts
                elif (name, ident) in open_:
                    d = ts - open_.pop((name, ident))
                    if d >= 0:
                        op["phases"].setdefault(name, []).append(d)
    ops = [o for o in ops if o["stop"] is not None and o["stop"] > o["start"]]
    # A state a step never reached has timestamp 0: such a phase spans more than its operation.
    for o in ops:
        span = o["stop"] - o["start"]
        o["phases"] = {k: [d for d in v if d <= span] for k, v in o["phases"].items()}
    return ops


def fmt(x):
    return "-" if x is None else (f"{x:.0f}" if x >= 10 else f"{x:.1f}")


def summary(name, prefixes):
    ops = []
    for p in prefixes:
        for path in sorted(glob.glob(p + "_*.json")):
            ops += operations(path)
    cells = [name, str(len(ops))]
    for send, phases in ((True, SEND), (False, RECV)):
        mine = [o for o in ops if o["send"] == send and o["phases"]]
        steps = sum(len(o["phases"].get(phases[-1 if send else 0], [])) for o in mine)
        cells.append(str(steps))
        for ph in phases:
            ds = [d for o in mine for d in o["phases"].get(ph, [])]
            med = statistics.median(ds) if ds else None
            # Steps in this phase on average while their operation ran.
            occ = [sum(o["phases"].get(ph, [])) / (o["stop"] - o["start"]) for o in mine]
            avg = statistics.mean(occ) if occ else None
            cells.append(f"{fmt(med)} µs / {avg:.2f}" if avg is not None else "-")
        # The pipeline's period: an operation's time over its steps.
        period = [(o["stop"] - o["start"]) / len(o["phases"].get(phases[-1 if send else 0], [1]))
                  for o in mine]
        cells.append(fmt(statistics.median(period)) if period else "-")
    print("| " + " | ".join(cells) + " |")


def main():
    if sys.argv[1:] == ["--header"]:
        print("| run | ops | send steps | send: GPU wait (median / steps in it) | peer wait | network "
              "| µs per send step | recv steps | recv: network | flush | GPU wait | µs per recv step |")
        print("| --- " * 12 + "|")
        return
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    summary(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
