"""Stages that measure the provider alone: fabtests' ceiling and a TCP ping-pong."""
import fcntl
import re
import socket as sockets
import struct

from gpurun.config import IN, LF, WORK, env_or, now
from gpurun.runner import Failed, capture, executable, execute, finish, lines, logf, sleep, start, timed
from gpurun.record import fmt, note, num
from gpurun.build import stage_fabtests


def eth0_ip():
    """eth0's IPv4 address (SIOCGIFADDR; the machine may have no iproute2)."""
    if now.dry:
        return "<eth0-address>"
    s = sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM)
    return sockets.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", b"eth0"))[20:24])


def fabtests_program(d, kind, op):
    """The fabtests program in D, with its arguments, for KIND (bw, pingpong) of an operation:
    "tagged" messages (what the plugin posts; rxm sends a long one by rendezvous) or "writedata",
    RMA writes with remote CQ data (the data goes at once into a buffer the receiver announced, and
    the sender's completion needs no answer from the receiver)."""
    programs = {"bw-tagged": ["fi_rdm_tagged_bw"], "bw-writedata": ["fi_rma_bw", "-e", "rdm", "-o", "writedata"],
                "pingpong-tagged": ["fi_rdm_tagged_pingpong"],
                "pingpong-writedata": ["fi_rma_pingpong", "-o", "writedata"]}
    if f"{kind}-{op}" not in programs:
        raise Failed(f"unknown fabtests operation {op} (tagged, writedata)")
    program, *args = programs[f"{kind}-{op}"]
    return [f"{d}/{program}", *args]


def stage_ceiling():
    """what the provider itself moves here (fabtests, built against the libfabric stage's build):
    for each of $CEILING_OPS ("tagged": fi_rdm_tagged_bw, the default; "writedata": fi_rma_bw -o
    writedata, RMA writes with remote CQ data), each of $CEILING_SIZE (message bytes, 1048576) and
    $CEILING_WINDOW (in flight per flow, 64) and $CEILING_FLOWS flows each way (default "1 2 4"),
    both directions at once, $CEILING_PROVIDER (tcp;ofi_rxm) over eth0's address; the sum of the
    flows' MB/s per direction; each flow moves 3 GiB ($CEILING_ITERS messages if set)"""
    stage_fabtests()
    prov, ip, port = env_or("CEILING_PROVIDER", "tcp;ofi_rxm"), eth0_ip(), 23000
    note("", f"## What {prov} itself moves here (fabtests, both directions at once, over {ip})", "",
         "| operation | message bytes | in flight per flow | flows each way | MB/s one way (sum) "
         "| MB/s the other way (sum) | both, GB/s |", "| --- | --- | --- | --- | --- | --- | --- |")
    for op in env_or("CEILING_OPS", "tagged").split():
        program = fabtests_program(f"{WORK}/fabtests/bin", "bw", op)
        for size in env_or("CEILING_SIZE", "1048576").split():
            for window in env_or("CEILING_WINDOW", "64").split():
                for n in map(int, env_or("CEILING_FLOWS", "1 2 4").split()):
                    iters = max(int(env_or("CEILING_ITERS", str(3221225472 // int(size)))), 20)
                    tag = f"{op}-{size}-{window}-{n}"

                    def pair(k, end, *where):
                        """Pair K's server (-s ADDRESS) or client (ADDRESS)."""
                        cmd = [*program, "-p", prov, f"-E={port + k}", "-S", size, "-W", window, "-I", iters,
                               "-w", iters // 30 + 1, *where]
                        return start(timed(cmd, "60", kill=False), [f"LD_LIBRARY_PATH={LF}/lib"],
                                     out=logf(f"ceiling-{tag}-{k}-{end}"))

                    # 2n pairs: n servers of each direction; on one machine a direction is only
                    # which of the pair sends, so pair k of direction d is server d, client 1-d.
                    servers = [pair(k, "server", "-s", ip) for k in range(2 * n)]
                    sleep(1)
                    for p in servers + [pair(k, "client", ip) for k in range(2 * n)]:
                        finish(p)
                    port += 2 * n
                    # The MB/sec column of each client's result line.
                    rates = []
                    for k in range(2 * n):
                        found = [line.split()[4] for line in lines(logf(f"ceiling-{tag}-{k}-client"))
                                 if re.match("[0-9]", line) and len(line.split()) >= 7]
                        rates.append(float(fmt(num(found[-1] if found else "0"))))
                    a, b = sum(rates[:n]), sum(rates[n:])
                    note(f"| {op} | {size} | {window} | {n} | {a:.0f} | {b:.0f} | {(a + b) / 1000:.2f} |")


def stage_pingpong():
    """one small message's one-way time: a polled TCP socket (scripts/gpu/tcp_pingpong.c) and
    fabtests over $PINGPONG_PROVIDERS (tcp;ofi_rxm tcp), for each of $PINGPONG_OPS ("tagged":
    fi_rdm_tagged_pingpong; "writedata": fi_rma_pingpong -o writedata), $PINGPONG_SIZES bytes (8
    4096), 20000 round trips over eth0's address; fabtests from $FABTESTS_BIN (default
    .scratch/gpu-in/fabtests) or the fabtests stage"""
    d = env_or("FABTESTS_BIN", f"{IN}/fabtests")
    if not executable(f"{d}/fi_rdm_tagged_pingpong"):
        stage_fabtests()
        d = f"{WORK}/fabtests/bin"
    if execute(["cc", "-O2", "-o", f"{WORK}/tcp_pingpong", "scripts/gpu/tcp_pingpong.c"]):
        raise Failed()
    ip, port = eth0_ip(), 24100
    ops, provs = env_or("PINGPONG_OPS", "tagged").split(), env_or("PINGPONG_PROVIDERS", "tcp;ofi_rxm tcp").split()
    programs = {op: fabtests_program(d, "pingpong", op) for op in ops}
    cols = [p if op == "tagged" else f"{p} {op}" for op in ops for p in provs]
    note("", f"## One message's one-way time over {ip} (20000 round trips, µs)", "",
         "| bytes | TCP socket, polled |" + "".join(f" {c} |" for c in cols), "| --- | --- |" + " --- |" * len(cols))
    for size in env_or("PINGPONG_SIZES", "8 4096").split():
        port += 1
        tcp = capture(timed([f"{WORK}/tcp_pingpong", ip, port, size, "20000"], "60", kill=False))[1]
        cells = f"| {size} | " + "\n".join((line.split() + [""] * 4)[3] for line in tcp.splitlines()) + " |"
        for op in ops:
            for prov in provs:
                port += 1
                name = f"{size}-{prov.replace(';', '_')}-{op}"
                cmd = timed([*programs[op], "-p", prov, f"-E={port}", "-S", size, "-I", "20000"], "60", kill=False)
                server = start([*cmd, "-s", ip], [f"LD_LIBRARY_PATH={LF}/lib"], out=logf(f"pingpong-{name}-server"))
                sleep(1)
                execute([*cmd, ip], [f"LD_LIBRARY_PATH={LF}/lib"], out=logf(f"pingpong-{name}-client"))
                finish(server)
                # The usec/xfer column: one way.
                one_way = [w[5] for w in map(str.split, lines(logf(f"pingpong-{name}-client")))
                           if len(w) >= 7 and re.fullmatch(r"[0-9]+[kmg]?", w[0])]
                cells += f" {one_way[-1] if one_way else ''} |"
        note(cells)
