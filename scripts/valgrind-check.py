#!/usr/bin/env python3
"""Reads the memcheck logs in a folder and fails if an invalid read or write has a frame of
the plugin (its Rust code or its generated libfabric wrappers) on its stack. Errors entirely
inside libfabric or the C library are listed, not counted."""
import pathlib
import re
import sys

OURS = re.compile(r"nccl_net_fabric|fabric_wrappers|libnccl_net_fabric|mr_reg\.c")
START = re.compile(r"^==\d+== (Invalid (read|write|free)|Mismatched free|Syscall param .* points to unaddressable)")


def blocks(text):
    """Yields each error report: its first line and its stack lines."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if START.match(lines[i]):
            block = [lines[i]]
            i += 1
            while i < len(lines) and re.match(r"^==\d+==\s+(at|by|Address|  )", lines[i]):
                block.append(lines[i])
                i += 1
            yield block
        else:
            i += 1


def main(folder):
    logs = sorted(pathlib.Path(folder).glob("*.log"))
    ours, theirs = [], []
    for log in logs:
        for block in blocks(log.read_text(errors="replace")):
            stack = [l for l in block if " at " in l or " by " in l]
            (ours if any(OURS.search(l) for l in stack) else theirs).append((log.name, block))
    print(f"valgrind-check: {len(logs)} process log(s) in {folder}")
    for name, block in theirs:
        print(f"  (inside libfabric or libc, {name}) {block[0]}")
    for name, block in ours:
        print(f"  PLUGIN FRAME ({name}):")
        print("\n".join("    " + l for l in block[:25]))
    if not logs:
        print("valgrind-check: no logs: did the children run under valgrind?")
        return 1
    print(
        f"valgrind-check: {len(ours)} invalid access(es) with a plugin frame, "
        f"{len(theirs)} elsewhere"
    )
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
