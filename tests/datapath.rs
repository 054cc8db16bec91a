//! The data path through the exported C table, as NCCL drives it: two processes, two ranks
//! on threads, many sizes and requests in flight, many comm pairs, connect/close cycles, bad
//! handles, truncated receives and a peer killed mid-transfer. Each scenario runs in child
//! processes, once per provider (`tcp;ofi_rxm`, `shm`, and native `tcp` on libfabric >= 1.18),
//! and every wait has a deadline.

mod common;

use common::*;
use nccl_net_fabric::nccl::{NcclResult, NET_HANDLE_MAXSIZE, PTR_HOST};
use nccl_net_host::{handle_from_hex, handle_to_hex, PluginLib, Ptr};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a child may run, stretched by `NFAB_SLOW` (valgrind).
fn child_timeout() -> Duration {
    common::scaled(120.0)
}
/// Sizes every transfer test covers: empty, tiny, odd, and 4 KiB … 8 MiB.
const SIZES: &[usize] = &[
    0,
    1,
    7,
    4095,
    4096,
    65_537,
    1 << 16,
    1 << 20,
    4 << 20,
    8 << 20,
];
const IN_FLIGHT: usize = 8;

/// `secs` from now, stretched by `NFAB_SLOW` (valgrind).
fn deadline(secs: u64) -> Instant {
    Instant::now() + common::scaled(secs as f64)
}

fn init() -> PluginLib {
    let lib = plugin();
    lib.init(true).expect("init");
    assert!(lib.devices().expect("devices") >= 1);
    lib
}

/// Registered buffers for one side of a stream.
struct Buffers {
    bufs: Vec<Vec<u8>>,
    mrs: Vec<Ptr>,
}

impl Buffers {
    fn new(lib: &PluginLib, comm: Ptr, n: usize, len: usize) -> Self {
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len.max(1)]).collect();
        let mrs = bufs
            .iter_mut()
            .map(|b| {
                // SAFETY: the buffers live until `release` deregisters them.
                unsafe { lib.reg_mr(comm, b.as_mut_ptr().cast(), b.len(), PTR_HOST) }
                    .expect("regMr")
            })
            .collect();
        Buffers { bufs, mrs }
    }
    fn release(self, lib: &PluginLib, comm: Ptr) {
        for m in self.mrs {
            lib.dereg_mr(comm, m).expect("deregMr");
        }
    }
}

/// Sends message i of `len` bytes for i in 0..count, IN_FLIGHT at a time.
fn send_all(lib: &PluginLib, comm: Ptr, len: usize, count: usize, until: Instant) {
    let mut b = Buffers::new(lib, comm, IN_FLIGHT, len);
    let mut pending: VecDeque<(Ptr, usize)> = VecDeque::new();
    for i in 0..count {
        if pending.len() == IN_FLIGHT {
            let (r, sent) = pending.pop_front().expect("non-empty");
            assert_eq!(
                lib.wait(r, until)
                    .unwrap_or_else(|e| panic!("send of {sent} bytes: {e}")),
                sent as i32
            );
        }
        let slot = i % IN_FLIGHT;
        b.bufs[slot][..len].copy_from_slice(&pattern(i, len));
        // SAFETY: the slot's buffer is not touched again until this request completed.
        let r = unsafe {
            lib.isend_until(
                comm,
                b.bufs[slot].as_mut_ptr().cast(),
                len as i32,
                b.mrs[slot],
                until,
            )
        }
        .expect("isend");
        pending.push_back((r, len));
    }
    for (r, sent) in pending {
        assert_eq!(
            lib.wait(r, until)
                .unwrap_or_else(|e| panic!("send of {sent} bytes: {e}")),
            sent as i32
        );
    }
    b.release(lib, comm);
}

/// Receives `count` messages of `len` bytes into buffers `extra` bytes larger, checking
/// each byte and the reported size.
fn recv_all(lib: &PluginLib, comm: Ptr, len: usize, extra: usize, count: usize, until: Instant) {
    let cap = len + extra;
    let mut b = Buffers::new(lib, comm, IN_FLIGHT, cap);
    let mut pending: VecDeque<(Ptr, usize, usize)> = VecDeque::new();
    let check = |b: &Buffers, lib: &PluginLib, r: Ptr, slot: usize, i: usize| {
        let got = lib
            .wait(r, until)
            .unwrap_or_else(|e| panic!("receive {i} of {len} bytes: {e}"));
        assert_eq!(got as usize, len, "message {i}: reported size");
        assert!(
            b.bufs[slot][..len] == pattern(i, len)[..],
            "message {i} of {len} bytes differs"
        );
    };
    for i in 0..count {
        if pending.len() == IN_FLIGHT {
            let (r, slot, j) = pending.pop_front().expect("non-empty");
            check(&b, lib, r, slot, j);
        }
        let slot = i % IN_FLIGHT;
        // SAFETY: the slot's buffer is read only after this request completed.
        let r = unsafe {
            lib.irecv_until(
                comm,
                b.bufs[slot].as_mut_ptr().cast(),
                cap as i32,
                b.mrs[slot],
                until,
            )
        }
        .expect("irecv");
        pending.push_back((r, slot, i));
    }
    for (r, slot, j) in pending {
        check(&b, lib, r, slot, j);
    }
    b.release(lib, comm);
}

fn count_for(len: usize) -> usize {
    if len >= 4 << 20 {
        4
    } else {
        12
    }
}

/// Both directions at once over (send, recv) of each rank.
fn exchange(lib: &PluginLib, send: Ptr, recv: Ptr, until: Instant) {
    std::thread::scope(|s| {
        s.spawn(|| {
            for (k, &len) in SIZES.iter().enumerate() {
                recv_all(
                    lib,
                    recv,
                    len,
                    if k % 2 == 0 { 0 } else { 64 },
                    count_for(len),
                    until,
                );
            }
        });
        for &len in SIZES {
            send_all(lib, send, len, count_for(len), until);
        }
    });
}

// ---------------------------------------------------------------------------------------
// Two ranks on threads in one process.

#[test]
#[ignore = "child process of another test"]
fn child_two_ranks_threads() {
    let lib = init();
    let until = deadline(90);
    let (h0, l0) = lib.listen(0).expect("listen 0");
    let (h1, l1) = lib.listen(0).expect("listen 1");
    let lib = &lib;
    std::thread::scope(|s| {
        // Rank r connects to the other rank's handle and accepts on its own listen comm.
        let rank = |mut peer: [u8; NET_HANDLE_MAXSIZE], listen: Ptr| {
            move || {
                let (mut send, mut recv) = (None, None);
                while send.is_none() || recv.is_none() {
                    if send.is_none() {
                        send = lib.connect(0, &mut peer).expect("connect");
                    }
                    if recv.is_none() {
                        recv = lib.accept(listen).expect("accept");
                    }
                    assert!(Instant::now() < until, "connect/accept deadline");
                }
                lib.close_listen(listen).expect("closeListen");
                let (send, recv) = (send.unwrap(), recv.unwrap());
                exchange(lib, send, recv, until);
                lib.close_send(send).expect("closeSend");
                lib.close_recv(recv).expect("closeRecv");
            }
        };
        let a = s.spawn(rank(h1, l0));
        let b = s.spawn(rank(h0, l1));
        a.join().expect("rank 0");
        b.join().expect("rank 1");
    });
    println!("RESULT ok=1");
}

fn for_each_provider(child: &str, extra: &[(&str, &str)]) {
    let per_comm = extra.contains(&("NCCL_FABRIC_ENDPOINTS", "comm"));
    // libfabric 2.1's native tcp stalls receives with one endpoint per comm under concurrent
    // two-way traffic (seen: a 64 KiB receive never completing in 5 runs of 6); it is tested
    // with the default shared endpoints only, and refused by default anyway.
    for p in data_providers()
        .into_iter()
        .filter(|&p| !(per_comm && p == "tcp"))
    {
        child_over(child, p, extra);
    }
}

/// The child test `child` over `p` with the `extra` settings, finished and successful.
fn child_over(child: &str, p: &str, extra: &[(&str, &str)]) -> common::Finished {
    let mut env = provider_env(p);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let f = run_child(child, &env, child_timeout());
    assert!(
        f.success && f.result("ok").is_some(),
        "{child} over {p} with {extra:?} failed\n--- stdout\n{}\n--- stderr\n{}",
        f.stdout,
        f.stderr
    );
    f
}

#[test]
fn two_ranks_on_threads() {
    for_each_provider("child_two_ranks_threads", &[]);
}

/// `NCCL_FABRIC_HMEM=force` on shm advertises GPU buffers where libfabric does not know the
/// option (1.17); host buffers must still move, on endpoints that answer as the probe did.
#[test]
fn two_ranks_on_threads_with_hmem_forced_on_shm() {
    let mut env = provider_env("shm");
    env.push(("NCCL_FABRIC_HMEM".into(), "force".into()));
    env.push(("NCCL_DEBUG".into(), "INFO".into()));
    let f = run_child("child_two_ranks_threads", &env, child_timeout());
    assert!(
        f.success && f.result("ok").is_some(),
        "--- stdout\n{}\n--- stderr\n{}",
        f.stdout,
        f.stderr
    );
    // NCCL's side: host buffers registered where GPU buffers were offered, said once per
    // direction, with the reason for a device without a PCI path (shm's); nothing where they
    // were not (2.1 shm refuses the option, so force cannot offer them).
    let offered = !f.stderr.contains("GPU buffers: no");
    for side in ["sends", "receives"] {
        let line = format!(
            "NCCL uses host buffers on dev 0 ({side}) although the plugin offers GPU buffers: \
             dev 0 has no PCI path"
        );
        assert_eq!(
            f.stderr.matches(&line).count(),
            usize::from(offered),
            "{line}\n--- stderr\n{}",
            f.stderr
        );
    }
}

#[test]
fn two_ranks_on_threads_with_progress_threads() {
    for_each_provider(
        "child_two_ranks_threads",
        &[("NCCL_FABRIC_PROGRESS_THREAD", "yes")],
    );
}

/// Progress threads posting every operation themselves (the default), and NCCL's calls
/// posting all but the longest: each order of posting keeps every message in its place, and
/// the calls' own posts happen only where allowed (each endpoint tells how many it took when
/// it closes, which lanes that do not linger do before the process ends).
#[test]
fn two_ranks_on_threads_with_progress_threads_posting_more_or_less() {
    let posted_by_calls = |stderr: &str| -> u64 {
        stderr
            .lines()
            .filter_map(|l| l.split("NCCL's calls posted ").nth(1))
            .filter_map(|rest| rest.split(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    for p in data_providers() {
        for bytes in ["0", "1048576"] {
            let f = child_over(
                "child_two_ranks_threads",
                p,
                &[
                    ("NCCL_FABRIC_PROGRESS_THREAD", "yes"),
                    ("NCCL_FABRIC_INLINE_POST_BYTES", bytes),
                    ("NCCL_FABRIC_LANE_LINGER_MS", "0"),
                    ("NCCL_DEBUG", "TRACE"),
                    ("NCCL_FABRIC_LOG", "debug"),
                ],
            );
            let n = posted_by_calls(&f.stderr);
            match bytes {
                "0" => assert_eq!(n, 0, "{p}: calls posted themselves with the setting 0"),
                _ => assert!(n > 0, "{p}: no call posted itself\n{}", f.stderr),
            }
        }
    }
}

#[test]
fn two_ranks_on_threads_with_an_endpoint_per_comm() {
    for_each_provider(
        "child_two_ranks_threads",
        &[("NCCL_FABRIC_ENDPOINTS", "comm")],
    );
}

/// The kernel wait channels of this process's threads named `name`.
fn wait_channels(name: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter_map(|t| {
            let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
            (read("comm").trim() == name).then(|| read("wchan"))
        })
        .collect()
}

/// Whether a thread named `nfab-progress` of this process sleeps in `poll` now (its kernel
/// wait channel), and whether any such thread exists.
fn progress_threads_in_poll() -> (bool, bool) {
    let chans = wait_channels("nfab-progress");
    (!chans.is_empty(), chans.iter().any(|w| w.contains("poll")))
}

#[test]
#[ignore = "child process of another test"]
fn child_sleeping_progress() {
    let lib = init();
    let until = deadline(60);
    let (send, recv) = lib.connect_pair(0, until).expect("connect pair");
    // Whether this kernel names wait channels at all: a thread known to sleep.
    let probe = std::thread::Builder::new()
        .name("wchan-probe".into())
        .spawn(|| std::thread::sleep(Duration::from_secs(2)))
        .expect("probe thread");
    std::thread::sleep(Duration::from_millis(200));
    let shown = wait_channels("wchan-probe")
        .iter()
        .any(|w| !w.trim().is_empty() && w.trim() != "0");
    probe.join().expect("probe");
    println!("RESULT wchan={}", u8::from(shown));
    let mut out = *b"12345678";
    let mut into = [0u8; 8];
    // SAFETY: both buffers outlive their registrations and requests below.
    let (smr, rmr) = unsafe {
        (
            lib.reg_mr(send, out.as_mut_ptr().cast(), 8, PTR_HOST)
                .expect("regMr"),
            lib.reg_mr(recv, into.as_mut_ptr().cast(), 8, PTR_HOST)
                .expect("regMr"),
        )
    };
    for round in 0..3 {
        // SAFETY: as above.
        let r = unsafe { lib.irecv_until(recv, into.as_mut_ptr().cast(), 8, rmr, until) }
            .expect("irecv");
        // A receive waits for a message that comes 400 ms later, and the sending endpoint has
        // nothing to do: where the provider allows, their threads sleep in poll meanwhile.
        let quiet = Instant::now() + Duration::from_millis(400);
        let mut seen = (false, false);
        while Instant::now() < quiet {
            let now = progress_threads_in_poll();
            seen = (seen.0 | now.0, seen.1 | now.1);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(seen.0, "no progress thread found");
        assert_eq!(
            lib.test(r).expect("test"),
            None,
            "received before anything was sent"
        );
        out[0] = b'a' + round;
        // The send wakes the sending thread (its bell), the message the receiving one.
        // SAFETY: as above.
        let s = unsafe { lib.isend_until(send, out.as_mut_ptr().cast(), 8, smr, until) }
            .expect("isend");
        assert_eq!(lib.wait(r, deadline(20)).expect("receive"), 8);
        lib.wait(s, deadline(20)).expect("send");
        assert_eq!(into, out, "data of round {round}");
        println!("RESULT slept{round}={}", u8::from(seen.1));
    }
    lib.dereg_mr(send, smr).expect("deregMr");
    lib.dereg_mr(recv, rmr).expect("deregMr");
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

/// Progress threads sleep in poll on providers whose wait object tells all (tcp and
/// tcp;ofi_rxm) unless told never to, never elsewhere, and wake for a message that comes and
/// for a send handed to them.
#[test]
fn progress_threads_sleep_where_the_provider_wakes_them() {
    for p in data_providers() {
        // The default (20 ms, well inside the 400 ms a receive waits), at once, never.
        for spin in ["default", "0", "10000000"] {
            let mut env = provider_env(p);
            env.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), "yes".into()));
            if spin != "default" {
                env.push(("NCCL_FABRIC_PROGRESS_SPIN_US".into(), spin.into()));
            }
            env.push(("NCCL_DEBUG".into(), "INFO".into()));
            let f = run_child("child_sleeping_progress", &env, child_timeout());
            assert!(
                f.success && f.result("ok").is_some(),
                "over {p} spinning {spin} (µs)\n--- stdout\n{}\n--- stderr\n{}",
                f.stdout,
                f.stderr
            );
            let sleeps = spin != "10000000" && p.starts_with("tcp");
            let shown = f.result("wchan").as_deref() == Some("1");
            if !shown {
                eprintln!(
                    "WARNING: this kernel shows no thread wait channels: whether progress \
                     threads sleep in poll is not checked here"
                );
            }
            // Every round where the threads sleep (a busy machine may keep one from being
            // seen asleep in a round: at least one of the three).
            let slept = (0..3)
                .filter(|r| f.result(&format!("slept{r}")).as_deref() == Some("1"))
                .count();
            if shown && sleeps {
                assert!(
                    slept >= 1,
                    "over {p} spinning {spin} (µs): never seen in poll\n{}",
                    f.stdout
                );
            } else if shown {
                assert_eq!(
                    slept, 0,
                    "over {p} spinning {spin} (µs): seen in poll\n{}",
                    f.stdout
                );
            }
            // The INFO line says which.
            let said = match sleeps {
                true => format!("progress threads sleep in poll on {p}'s sockets"),
                false => "progress threads spin while operations are in flight".to_string(),
            };
            assert!(
                f.stderr.contains(&said),
                "over {p} spinning {spin} (µs): no line {said:?}\n{}",
                f.stderr
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Lanes opened ahead of their comms.

/// Open file descriptors once their count has not changed for half a second (or `until`).
fn settled_fds(until: Instant) -> usize {
    let mut last = (open_fds(), Instant::now());
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        let now = open_fds();
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= common::scaled(0.5) {
            break;
        }
    }
    last.0
}

/// A rank that listens, waits until its file descriptors settle, then connects to its own
/// handle and accepts, counting descriptors at each step.
#[test]
#[ignore = "child process of another test"]
fn child_lanes_open_at_listen() {
    let lib = init();
    let until = deadline(60);
    let fds_init = settled_fds(until);
    let (mut handle, listen) = lib.listen(0).expect("listen");
    let fds_listen = settled_fds(until);
    let (send, recv) = common::hosts::connect_and_accept(&lib, 0, &mut handle, listen, until);
    let fds_connected = open_fds();
    lib.close_listen(listen).expect("closeListen");
    exchange(&lib, send, recv, until);
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT fds_init={fds_init}");
    println!("RESULT fds_listen={fds_listen}");
    println!("RESULT fds_connected={fds_connected}");
    println!("RESULT ok=1");
}

/// A device's lanes (an endpoint and its sockets each) open from `listen` on, on a thread of
/// their own, so that the connect and accept that follow find them open and no call of
/// NCCL's waits for endpoints to set up: over `tcp;ofi_rxm` with 16 lanes a side, listening
/// opens far more descriptors than connecting and accepting then do (on 2.1 about 16 per
/// endpoint, its domain's included, on 1.17 about one; the control endpoint a few).
#[test]
fn lanes_open_from_listen_on() {
    let f = child_over(
        "child_lanes_open_at_listen",
        "tcp;ofi_rxm",
        &[
            ("NCCL_FABRIC_LANES", "16"),
            ("NCCL_FABRIC_PROGRESS_THREAD", "yes"),
        ],
    );
    let n = |k: &str| -> usize { f.result(k).and_then(|v| v.parse().ok()).expect(k) };
    let (init, listen, connected) = (n("fds_init"), n("fds_listen"), n("fds_connected"));
    let (by_listen, by_connect) = (
        listen.saturating_sub(init),
        connected.saturating_sub(listen),
    );
    assert!(
        by_listen >= 16 && by_connect * 4 < by_listen,
        "listen opened {by_listen} descriptors, connect and accept {by_connect} more: the \
         lanes did not open ahead of their comms\n--- stderr\n{}",
        f.stderr
    );
}

// ---------------------------------------------------------------------------------------
// Two processes: handles cross over pipes.

/// A child rank's start: listens, prints its handle, reads its peer's from stdin, and
/// connects to the peer while accepting it: (send comm, receive comm, listen comm).
fn pair_with_peer(lib: &PluginLib, until: Instant) -> (Ptr, Ptr, Ptr) {
    let (handle, listen) = lib.listen(0).expect("listen");
    println!("RESULT handle={}", handle_to_hex(&handle));
    let mut peer = handle_from_hex(&read_stdin_line(Duration::from_secs(30))).expect("peer handle");
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = lib.connect(0, &mut peer).expect("connect");
        }
        if recv.is_none() {
            recv = lib.accept(listen).expect("accept");
        }
        assert!(Instant::now() < until, "connect/accept deadline");
    }
    (send.unwrap(), recv.unwrap(), listen)
}

#[test]
#[ignore = "child process of another test"]
fn child_process_rank() {
    let lib = init();
    let until = deadline(90);
    let (send, recv, listen) = pair_with_peer(&lib, until);
    lib.close_listen(listen).expect("closeListen");
    exchange(&lib, send, recv, until);
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

/// A rank that connects, exchanges, posts a receive its peer never sends to and ends its
/// process with that receive posted and nothing closed, as a job that exits without
/// finalizing does, or with everything closed just before (told `close`): its progress
/// threads are driving the provider, or winding its endpoints down, when the process exits.
#[test]
#[ignore = "child process of another test"]
fn child_rank_exiting_mid_receive() {
    let lib = init();
    let until = deadline(60);
    let (send, recv, listen) = pair_with_peer(&lib, until);
    std::thread::scope(|s| {
        s.spawn(|| recv_all(&lib, recv, 4096, 0, 4, until));
        send_all(&lib, send, 4096, 4, until);
    });
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: the buffer is leaked below, so it outlives the receive, which never completes.
    unsafe {
        lib.irecv_until(
            recv,
            buf.as_mut_ptr().cast(),
            buf.len() as i32,
            Ptr(std::ptr::null_mut()),
            until,
        )
    }
    .expect("irecv");
    std::mem::forget(buf);
    // Both ranks have posted theirs before either exits.
    println!("RESULT posted=1");
    if read_stdin_line(Duration::from_secs(30)) == "close" {
        // Closed just before the exit: the endpoints are still being wound down then.
        lib.close_send(send).expect("closeSend");
        lib.close_recv(recv).expect("closeRecv");
        lib.close_listen(listen).expect("closeListen");
    }
    println!("RESULT ok=1");
}

// ---------------------------------------------------------------------------------------
// Long messages in pieces (`NCCL_FABRIC_PIECE_BYTES`): every shape around the piece size.

const PIECE: usize = 4096;

/// (send bytes, receive bytes): whole messages, pieces that fill the receive, pieces fewer
/// than the receive has room for, an odd last piece, a last piece taking the rest.
const PIECE_CASES: &[(usize, usize)] = &[
    (0, 0),
    (0, 5 * PIECE),
    (1, PIECE),
    (PIECE - 1, PIECE),
    (PIECE, PIECE),
    (PIECE, PIECE + 1),
    (PIECE + 1, PIECE + 1),
    (PIECE + 1, 5 * PIECE),
    (2 * PIECE, 2 * PIECE),
    (2 * PIECE + 1, 4 * PIECE),
    (3 * PIECE, 4 * PIECE + 1),
    (4 * PIECE, 4 * PIECE),
    (4 * PIECE + 1, 4 * PIECE + 1),
    (4 * PIECE + 1, 100_000),
    (100_000, 100_000),
    (100_000, 1 << 20),
    (1 << 20, 1 << 20),
];

/// Posts `b` as a send of its first `len` bytes, or as a receive of all of it.
///
/// # Safety
/// `b` must stay untouched until the request completed.
unsafe fn post_case(
    lib: &PluginLib,
    comm: Ptr,
    send: bool,
    b: &mut [u8],
    len: usize,
    until: Instant,
) -> Ptr {
    let (data, none) = (b.as_mut_ptr().cast(), Ptr(std::ptr::null_mut()));
    // SAFETY: per the caller.
    unsafe {
        match send {
            true => lib.isend_until(comm, data, len as i32, none, until),
            false => lib.irecv_until(comm, data, b.len() as i32, none, until),
        }
    }
    .expect("post")
}

/// One direction of the piece script: every case, eight at a time, in both roles.
fn pieces_one_way(lib: &PluginLib, comm: Ptr, send: bool, until: Instant) {
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    for (round, cases) in PIECE_CASES.chunks(IN_FLIGHT).enumerate() {
        bufs.clear();
        let mut reqs = Vec::new();
        for (k, &(len, cap)) in cases.iter().enumerate() {
            let i = round * IN_FLIGHT + k;
            bufs.push(if send {
                pattern(i, len)
            } else {
                vec![0u8; cap]
            });
            let b = bufs.last_mut().expect("pushed");
            // SAFETY: the buffers stay until this round's requests completed (below).
            reqs.push((unsafe { post_case(lib, comm, send, b, len, until) }, i, len));
        }
        for (r, i, len) in reqs {
            let got = lib
                .wait(r, until)
                .unwrap_or_else(|e| panic!("message {i} of {len} bytes (send {send}): {e}"));
            assert_eq!(
                got as usize, len,
                "message {i}: reported size (send {send})"
            );
            let k = i - round * IN_FLIGHT;
            assert!(
                send || bufs[k][..len] == pattern(i, len)[..],
                "message {i} of {len} bytes differs"
            );
        }
    }
    // A message in 4 pieces into a receive of 2, then one into a receive shorter than a
    // piece: an error for the receive alone; the sender's request ends, and the comm
    // carries on. Not where the provider may report such a receive complete with its own
    // length (quirks: truncation unseen).
    let truncations = match std::env::var("NFAB_NO_TRUNCATION") {
        Ok(_) => vec![],
        Err(_) => vec![
            (4 * PIECE + 100, 2 * PIECE, "truncated"),
            (4 * PIECE + 200, 1000, "truncated_first"),
        ],
    };
    for (long, short, key) in truncations {
        let mut b = if send {
            pattern(99, long)
        } else {
            vec![0u8; short]
        };
        // SAFETY: b outlives the request, waited for right away.
        let got = lib.wait(
            unsafe { post_case(lib, comm, send, &mut b, long, until) },
            until,
        );
        match send {
            true => assert_eq!(got.expect("the long send ends") as usize, long),
            false => println!("RESULT {key}={}", got.expect_err("too long").code),
        }
    }
    let (len, i) = (3 * PIECE + 5, 100);
    let mut b = if send {
        pattern(i, len)
    } else {
        vec![0u8; len]
    };
    // SAFETY: as above.
    let got = lib.wait(
        unsafe { post_case(lib, comm, send, &mut b, len, until) },
        until,
    );
    assert_eq!(got.expect("after the truncation") as usize, len);
    assert!(
        send || b == pattern(i, len),
        "the message after the truncation differs"
    );
}

#[test]
#[ignore = "child process of another test"]
fn child_pieces_rank() {
    let lib = init();
    let until = deadline(60);
    let (send, recv, listen) = meet_peer(&lib, until, std::env::var("NFAB_ACCEPT_FIRST").is_ok());
    lib.close_listen(listen).expect("closeListen");
    std::thread::scope(|s| {
        s.spawn(|| pieces_one_way(&lib, recv, false, until));
        pieces_one_way(&lib, send, true, until);
    });
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

/// Two ranks with these piece sizes and lanes per direction, each sending the piece script to
/// the other; what both logged about their comms.
fn pieces_between(
    env: &[(String, String)],
    pieces: [&str; 2],
    lanes: [&str; 2],
    what: &str,
) -> [String; 2] {
    let native_tcp = env
        .iter()
        .any(|(k, v)| k == "NCCL_FABRIC_PROVIDER" && v == "tcp");
    // Driven by progress threads, libfabric 1.17 rxm and shm, and 2.1 rxm, now and then report
    // a message longer than NCCL's buffer complete with the buffer's length (quirks:
    // truncation unseen).
    let threads = env
        .iter()
        .any(|(k, v)| k == "NCCL_FABRIC_PROGRESS_THREAD" && v == "yes");
    let rxm = env
        .iter()
        .any(|(k, v)| k == "NCCL_FABRIC_PROVIDER" && v.contains("ofi_rxm"));
    let unseen = native_tcp || (threads && (rxm || libfabric_version() < (2, 1)));
    let envs: Vec<Vec<(String, String)>> = pieces
        .iter()
        .enumerate()
        .map(|(k, bytes)| {
            let mut env = env.to_vec();
            env.push(("NCCL_FABRIC_PIECE_BYTES".into(), bytes.to_string()));
            env.push(("NCCL_FABRIC_LANES".into(), lanes[k].to_string()));
            env.push(("NCCL_FABRIC_TIMES".into(), "yes".into()));
            env.push(("NCCL_FABRIC_LOG".into(), "debug".into()));
            env.push(("NCCL_DEBUG".into(), "TRACE".into()));
            if k == 1 {
                env.push(("NFAB_ACCEPT_FIRST".into(), "1".into()));
            }
            if unseen {
                env.push(("NFAB_NO_TRUNCATION".into(), "1".into()));
            }
            env
        })
        .collect();
    let (a, b) = process_pair_apart("child_pieces_rank", [&envs[0], &envs[1]]);
    let done = [a.finish(), b.finish()];
    for (k, f) in done.iter().enumerate() {
        // The other rank's end too: a rank fails when its peer went away.
        let other = &done[1 - k];
        let tail = |t: &str| {
            let mut from = t.len().saturating_sub(4000);
            while !t.is_char_boundary(from) {
                from += 1;
            }
            t[from..].to_string()
        };
        assert!(
            f.success && f.result("ok").is_some(),
            "rank {k} over {what} (pieces {pieces:?}) failed\n--- stdout\n{}\n--- stderr\n{}\n\
             --- the other rank (success {}): stdout\n{}\n--- its stderr, last lines\n{}",
            f.stdout,
            f.stderr,
            other.success,
            tail(&other.stdout),
            tail(&other.stderr)
        );
        if unseen {
            continue;
        }
        for key in ["truncated", "truncated_first"] {
            assert_eq!(
                f.result(key),
                Some((NcclResult::InternalError as i32).to_string()),
                "rank {k} over {what}: {key}: {}",
                f.stderr
            );
        }
        for (posted, sent) in [(8192, 16484), (1000, 16584)] {
            assert!(
                f.stderr.contains(&format!("receive of {posted} bytes"))
                    && f.stderr.contains(&format!("{sent} bytes were sent")),
                "rank {k} over {what}: the WARN names both sizes ({posted}, {sent}): {}",
                f.stderr
            );
        }
    }
    [done[0].stderr.clone(), done[1].stderr.clone()]
}

/// How the connect and accept lines end for a comm that sends whole messages.
const WHOLE: &str = "; whole messages";

/// Long messages go in the pieces both ends offered, one per flow, over as many flows as the
/// rank with fewer lanes has (3 per direction at one, 2 at the other: every comm has 2, and
/// the sender with 3 lets its third go).
#[test]
fn long_messages_go_in_pieces_both_ends_agree_on() {
    let split = format!("messages over {PIECE} bytes in up to 2 pieces over 2 flows");
    let mut providers = provider_envs();
    providers.extend(
        more_providers()
            .into_iter()
            .map(|p| (p.to_string(), provider_env(p))),
    );
    for (p, env) in providers {
        let piece = PIECE.to_string();
        // Shared memory, and rxm before libfabric 2.1, send whole messages whatever is
        // offered (quirks: pieces over shm, pieces over rxm 1.17).
        let old_rxm = p.contains("ofi_rxm") && libfabric_version() < (2, 1);
        let (pieces, whole) = match p.starts_with("shm") || old_rxm {
            false => (2, 0),
            true => (0, 2),
        };
        for log in pieces_between(&env, [&piece, &piece], ["3", "2"], &p) {
            assert!(
                log.matches(&split).count() == pieces && log.matches(WHOLE).count() == whole,
                "over {p}: both comms of each rank send in pieces over 2 flows (whole over \
                 shm): {log}"
            );
            // NCCL_FABRIC_TIMES: each comm said where its requests' time went.
            for comm in ["send comm to", "receive comm from"] {
                assert!(
                    log.lines().any(|l| l.contains(comm)
                        && l.contains(" requests, ")
                        && l.contains("until NCCL's test")),
                    "over {p}: the {comm} comm's times: {log}"
                );
            }
        }
        // One end without pieces: both send whole messages on one lane, and the script still
        // holds.
        let without = format!("{p}, one end without");
        for log in pieces_between(&env, [&piece, "0"], ["2", "2"], &without) {
            assert!(
                log.matches(WHOLE).count() == 2 && !log.contains(&split),
                "over {p}: an end that offers none makes both send whole messages: {log}"
            );
        }
    }
}

/// Starts two rank processes and hands each the other's handle.
fn process_pair(child: &str, env: &[(String, String)]) -> (ChildTest, ChildTest) {
    process_pair_apart(child, [env, env])
}

/// As [`process_pair`], each rank with its own environment.
fn process_pair_apart(child: &str, envs: [&[(String, String)]; 2]) -> (ChildTest, ChildTest) {
    let mut a = spawn_child(child, envs[0], child_timeout());
    let mut b = spawn_child(child, envs[1], child_timeout());
    let ha = a.read_result("handle");
    let hb = b.read_result("handle");
    a.send_line(&hb);
    b.send_line(&ha);
    (a, b)
}

/// Two `child_process_rank` processes with `env`, both finished and successful (`what` names
/// the run in the failure): each rank's name and outcome, for further checks.
fn ranks_over(env: &[(String, String)], what: &str) -> [(&'static str, common::Finished); 2] {
    let (a, b) = process_pair("child_process_rank", env);
    let ranks = [("a", a.finish()), ("b", b.finish())];
    for (name, f) in &ranks {
        assert!(
            f.success,
            "rank {name} over {what} failed ({})\n--- stdout\n{}\n--- stderr\n{}",
            f.status, f.stdout, f.stderr
        );
    }
    ranks
}

/// Provider environments for two-process tests: each provider with NCCL's calls driving
/// everything, with progress threads that post and progress, and with both (the threads,
/// and NCCL's calls taking turns when no thread is in one).
fn provider_envs() -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    for p in data_providers() {
        out.push((p.to_string(), provider_env(p)));
        let mut threaded = provider_env(p);
        threaded.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), "yes".into()));
        out.push((format!("{p} with progress threads"), threaded));
        let mut both = provider_env(p);
        both.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), "both".into()));
        out.push((
            format!("{p} with progress threads and NCCL's calls driving"),
            both,
        ));
    }
    out
}

#[test]
fn two_processes() {
    for (p, env) in provider_envs() {
        ranks_over(&env, &p);
    }
}

/// Pieces over several flows, or on one flow where progress threads drive it; whole messages
/// on one flow that NCCL's calls drive, unless `NCCL_FABRIC_PIECE_BYTES` asks for pieces. The
/// INFO line says which, and the comms of both ranks send that way.
#[test]
fn pieces_over_flows_or_where_threads_drive_unless_asked() {
    let version = nccl_net_fabric::fabric::runtime_version();
    let providers: Vec<&str> = data_providers()
        .into_iter()
        .chain(more_providers())
        .filter(|p| nccl_net_fabric::quirks::pieces_pay(p, version))
        .collect();
    assert!(!providers.is_empty(), "no provider here takes pieces");
    let by_calls = "whole messages: one flow per comm, which NCCL's calls drive";
    let in_pieces = "go in pieces, up to one per flow";
    for p in providers {
        for (threads, piece, flows, pieces) in [
            ("no", None, "1", false),
            ("no", None, "0", true),
            ("yes", None, "1", true),
            ("no", Some("1048576"), "1", true),
        ] {
            let mut env = provider_env(p);
            env.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), threads.into()));
            env.push(("NCCL_FABRIC_FLOWS".into(), flows.into()));
            if let Some(bytes) = piece {
                env.push(("NCCL_FABRIC_PIECE_BYTES".into(), bytes.into()));
            }
            // The test host logs like NCCL: TRACE shows the comms' debug lines.
            env.push(("NCCL_FABRIC_LOG".into(), "debug".into()));
            env.push(("NCCL_DEBUG".into(), "TRACE".into()));
            let what = format!("{p}, progress threads {threads}, pieces {piece:?}, flows {flows}");
            for (name, f) in ranks_over(&env, &what) {
                let log = &f.stderr;
                assert_eq!(
                    (log.contains(in_pieces), log.contains(by_calls)),
                    (pieces, !pieces),
                    "rank {name} over {what}: the INFO line\n{log}"
                );
                // Both comms of the rank, as both ends agreed.
                assert_eq!(
                    log.matches(WHOLE).count(),
                    if pieces { 0 } else { 2 },
                    "rank {name} over {what}: the comms' lines\n{log}"
                );
            }
        }
    }
}

/// Providers the other tests do not cover, each as two processes, with NCCL's calls driving and
/// with progress threads: `udp;ofi_rxd` (manual progress, layered on a datagram provider, and
/// completions without a source), and on 1.17 `sockets`, `net` and `net;ofi_rxm`.
fn more_providers() -> Vec<&'static str> {
    let mut providers = vec!["udp;ofi_rxd"];
    if libfabric_version() < (1, 18) {
        providers.extend(["sockets", "net", "net;ofi_rxm"]);
    }
    providers
}

#[test]
fn two_processes_on_more_providers() {
    for p in more_providers() {
        for threads in ["no", "yes"] {
            let mut env = provider_env(p);
            env.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), threads.into()));
            for (name, f) in ranks_over(&env, &format!("{p} (progress threads {threads})")) {
                assert!(
                    !f.stderr.contains("NCCL WARN"),
                    "rank {name} over {p}: {}",
                    f.stderr
                );
            }
        }
    }
}

/// The handshake and liveness probes over another provider than the data's, as a provider
/// whose names do not fit NCCL's handle (ucx) needs: the data endpoints' names travel in the
/// handshake. Data over shm and udp;ofi_rxd, control over tcp;ofi_rxm.
#[test]
fn two_processes_with_the_handshake_on_another_provider() {
    for p in ["shm", "udp;ofi_rxd"] {
        for threads in ["no", "yes"] {
            let mut env = provider_env(p);
            env.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), threads.into()));
            env.push(("NCCL_FABRIC_CONTROL_PROVIDER".into(), "tcp;ofi_rxm".into()));
            env.push(("NCCL_DEBUG".into(), "INFO".into()));
            for (name, f) in ranks_over(&env, &format!("{p} (progress threads {threads})")) {
                assert!(
                    f.stderr.contains(
                        "NCCL_FABRIC_CONTROL_PROVIDER=tcp;ofi_rxm: the handshake runs over tcp;ofi_rxm on lo"
                    ),
                    "rank {name} over {p}: {}",
                    f.stderr
                );
                assert!(
                    !f.stderr.contains("WARN"),
                    "rank {name} over {p}: {}",
                    f.stderr
                );
            }
        }
    }
}

/// Whether the libfabric in use has the ucx provider: `scripts/test.sh` says so
/// (`NFAB_UCX=1`) when it built libfabric 2.1 with it, and then its absence fails the test.
fn ucx_expected() -> bool {
    let expected = std::env::var_os("NFAB_UCX").is_some_and(|v| v == "1");
    if !expected {
        eprintln!(
            "ucx: not built into this libfabric (scripts/test.sh sets NFAB_UCX=1 where it is)"
        );
    }
    expected
}

/// Ranks whose processes end with receives posted, nothing closed or everything closed just
/// before, their progress threads driving the provider: both exit successfully (no fault in the libraries'
/// exit-time teardown), over every provider, ucx among them where it is built.
#[test]
fn ranks_exit_cleanly_with_receives_posted() {
    let mut providers: Vec<&str> = data_providers();
    if ucx_expected() {
        providers.push("ucx");
    }
    for p in providers {
        let mut env = provider_env(p);
        env.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), "yes".into()));
        if p == "ucx" {
            for (k, v) in [
                ("NCCL_FABRIC_DOMAINS", "ucx"),
                ("NCCL_SOCKET_IFNAME", "lo"),
                ("FI_UCX_DEVICES", "lo"),
                ("UCX_TLS", "sm,self"),
            ] {
                env.push((k.into(), v.into()));
            }
        }
        for round in 0..EXIT_ROUNDS {
            let (mut a, mut b) = process_pair("child_rank_exiting_mid_receive", &env);
            a.read_result("posted");
            b.read_result("posted");
            // Every other round closes everything just before the exit.
            let how = ["exit", "close"][round % 2];
            a.send_line(how);
            b.send_line(how);
            for (name, f) in [("a", a.finish()), ("b", b.finish())] {
                assert!(
                    f.success && f.result("ok").is_some(),
                    "over {p}, round {round}: rank {name} exited {}\n--- stdout\n{}\n--- stderr\n{}",
                    f.status,
                    f.stdout,
                    f.stderr
                );
            }
        }
    }
}

/// Pairs of processes per provider in [`ranks_exit_cleanly_with_receives_posted`].
const EXIT_ROUNDS: usize = 6;

/// ucx (host memory): endpoint names of 1024 bytes, so the handshake runs over another
/// provider; two processes on this host (UCX over shared memory) and on two hosts (UCX over
/// TCP on the hosts' link), with NCCL's calls driving and with progress threads.
#[test]
fn two_processes_over_ucx() {
    use common::hosts::{host_env, hosts_or_skip, pair_on_hosts, Hosts, IFACE};
    if !ucx_expected() {
        return;
    }
    let expect_route = |f: &common::Finished, where_: &str, iface: &str| {
        assert!(
            f.stderr.contains("endpoint names are 1024 bytes")
                && f.stderr
                    .contains(&format!("the handshake runs over tcp;ofi_rxm on {iface}")),
            "ucx {where_}: {}",
            f.stderr
        );
    };
    for threads in ["no", "yes"] {
        let mut env = provider_env("ucx");
        for (k, v) in [
            ("NCCL_FABRIC_DOMAINS", "ucx"),
            // NCCL's own interface filter places the handshake on loopback.
            ("NCCL_SOCKET_IFNAME", "lo"),
            ("FI_UCX_DEVICES", "lo"),
            ("UCX_TLS", "sm,self"),
            ("NCCL_FABRIC_PROGRESS_THREAD", threads),
            ("NCCL_DEBUG", "INFO"),
        ] {
            env.push((k.into(), v.into()));
        }
        for (_, f) in ranks_over(&env, &format!("ucx (threads {threads})")) {
            expect_route(&f, "on one host", "lo (NCCL_SOCKET_IFNAME");
        }
    }
    if !hosts_or_skip() {
        return;
    }
    let env = host_env(
        "ucx",
        &[
            ("FI_UCX_DEVICES", IFACE),
            ("UCX_TLS", "tcp,self"),
            // UCX prefers IPv6, and the hosts' link-local IPv6 addresses do not connect.
            ("UCX_TCP_AF_PRIO", "inet"),
            // UCX 1.13's connections across the hosts are at times refused at first (1 run in
            // 5 gave up after its default 25 tries, "reached maximum number of connection
            // retries"); UCX's own advice is to raise the count.
            ("UCX_TCP_MAX_CONN_RETRIES", "255"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_FABRIC_PROGRESS_THREAD", "yes"),
        ],
    );
    // The first message, of 0 bytes, used to wait out its deadline at both ends now and
    // then (2 runs in 33 of this test alone under three busy loops at a45f8c6, 1 in 21 at
    // 171c4d8) with both ranks alive. UCX's own logs of such a run (UCX_LOG_LEVEL=debug)
    // showed UCX 1.13's TCP transport failing to set up one connection between two workers
    // of the two hosts: one side connected to the other's interface about 4500 times in the
    // 60 s, each connection accepted there and closed again in UCX's ACCEPTING state, while
    // that side's own connection the other way waited for its acknowledgement. The two
    // workers were a sending lane and the receiving lane it sends to, which connected to
    // each other at once: inserting a peer's address is, for ucx, creating an endpoint to it,
    // and each receiving flow inserted its sender's. Receives over ucx match by tag alone,
    // so receiving flows no longer insert their peer's address (connection::comm_on), and
    // only the sending side connects. A failure shows both ranks' output.
    let hosts = Hosts::new(2);
    let (a, b) = pair_on_hosts(&hosts, "child_process_rank", &env, child_timeout());
    let ranks = [("a", a.finish()), ("b", b.finish())];
    for (k, (name, f)) in ranks.iter().enumerate() {
        let (other, g) = &ranks[1 - k];
        assert!(
            f.success,
            "rank {name} over ucx on two hosts failed ({})\n{}\n{}\n--- rank {other} ({})\n{}\n{}",
            f.status, f.stdout, f.stderr, g.status, g.stdout, g.stderr
        );
        expect_route(f, "on two hosts", IFACE);
    }
}

/// The same two ranks on two hosts (network namespaces joined by a veth pair), with no
/// domain filter: what a job across machines runs.
#[test]
fn two_processes_on_two_hosts() {
    use common::hosts::{host_env, hosts_or_skip, pair_on_hosts, providers, Hosts};
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        for threads in ["no", "yes"] {
            let hosts = Hosts::new(2);
            let env = host_env(p, &[("NCCL_FABRIC_PROGRESS_THREAD", threads)]);
            let (a, b) = pair_on_hosts(&hosts, "child_process_rank", &env, child_timeout());
            for (name, f) in [("a", a.finish()), ("b", b.finish())] {
                assert!(
                    f.success,
                    "rank {name} over {p} (progress threads {threads}) on two hosts failed\n--- \
                     stdout\n{}\n--- stderr\n{}",
                    f.stdout, f.stderr
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// 16 comm pairs at once.

/// Streams `count` messages on every comm of `comms` at once from one thread, as NCCL's
/// progress thread serves many comms: round robin, up to 4 requests in flight per comm.
fn stream_many(
    lib: &PluginLib,
    comms: &[Ptr],
    sending: bool,
    lens: &[usize],
    count: usize,
    until: Instant,
) {
    const DEPTH: usize = 4;
    let mut bufs: Vec<Vec<Vec<u8>>> = lens
        .iter()
        .map(|&l| (0..DEPTH).map(|_| vec![0u8; l]).collect())
        .collect();
    let mut pending: Vec<VecDeque<(Ptr, usize, usize)>> = vec![VecDeque::new(); comms.len()];
    let mut posted = vec![0usize; comms.len()];
    let mut done = vec![0usize; comms.len()];
    while done.iter().any(|&d| d < count) {
        assert!(
            Instant::now() < until,
            "deadline passed with {done:?} of {count} done"
        );
        for k in 0..comms.len() {
            // Complete the oldest request of this comm if it is done.
            if let Some(&(r, slot, i)) = pending[k].front() {
                if let Some(n) = lib.test(r).expect("test") {
                    pending[k].pop_front();
                    assert_eq!(n as usize, lens[k], "comm {k} message {i} size");
                    if !sending {
                        assert!(
                            bufs[k][slot] == pattern(i + k, lens[k]),
                            "comm {k} message {i} differs"
                        );
                    }
                    done[k] += 1;
                }
            }
            if posted[k] < count && pending[k].len() < DEPTH {
                let i = posted[k];
                let slot = i % DEPTH;
                if sending {
                    bufs[k][slot] = pattern(i + k, lens[k]);
                }
                let p = bufs[k][slot].as_mut_ptr().cast();
                // SAFETY: each slot is reused only after its previous request completed.
                let r = unsafe {
                    if sending {
                        lib.isend(comms[k], p, lens[k] as i32, Ptr(std::ptr::null_mut()))
                    } else {
                        lib.irecv(comms[k], p, lens[k] as i32, Ptr(std::ptr::null_mut()))
                    }
                }
                .expect("post");
                if let Some(r) = r {
                    pending[k].push_back((r, slot, i));
                    posted[k] += 1;
                }
            }
        }
    }
}

#[test]
#[ignore = "child process of another test"]
fn child_sixteen_pairs() {
    let lib = init();
    let until = deadline(90);
    let pairs: Vec<(Ptr, Ptr)> = (0..16)
        .map(|_| lib.connect_pair(0, until).expect("connect_pair"))
        .collect();
    let lens: Vec<usize> = (0..16).map(|k| 4096 * (k + 1) + k).collect();
    let sends: Vec<Ptr> = pairs.iter().map(|p| p.0).collect();
    let recvs: Vec<Ptr> = pairs.iter().map(|p| p.1).collect();
    let lib = &lib;
    std::thread::scope(|s| {
        s.spawn(|| stream_many(lib, &recvs, false, &lens, 16, until));
        stream_many(lib, &sends, true, &lens, 16, until);
    });
    for (send, recv) in pairs {
        lib.close_send(send).expect("closeSend");
        lib.close_recv(recv).expect("closeRecv");
    }
    println!("RESULT ok=1");
}

#[test]
fn sixteen_comm_pairs_at_once() {
    for_each_provider("child_sixteen_pairs", &[]);
    for_each_provider("child_sixteen_pairs", &[("NCCL_FABRIC_ENDPOINTS", "comm")]);
}

/// Sixteen comm pairs with an endpoint each, driven by progress threads, over the providers
/// the other tests leave out. Each endpoint's domain opens while other threads read
/// completions on domains of the same provider: with one fabric for all, libfabric 1.17 `net`
/// crashed in 11 of 12 runs on 2 busy cores (quirks: domains opening under progress).
#[test]
fn sixteen_comm_pairs_on_more_providers() {
    for p in more_providers() {
        child_over(
            "child_sixteen_pairs",
            p,
            &[
                ("NCCL_FABRIC_ENDPOINTS", "comm"),
                ("NCCL_FABRIC_PROGRESS_THREAD", "yes"),
            ],
        );
    }
}

/// Shared endpoints spread over lanes: 16 comm pairs on 3 lanes open exactly 3 receiving and
/// 3 sending endpoints, driven by the device's 2 progress threads, and every byte still
/// arrives.
#[test]
fn sixteen_comm_pairs_over_three_lanes() {
    let version = nccl_net_fabric::fabric::runtime_version();
    // Where endpoints cannot be shared (shm before 1.19), comms get their own (the faults
    // tests check it).
    let shared = data_providers()
        .into_iter()
        .filter(|p| nccl_net_fabric::quirks::sharing_stalls(p, version).is_none());
    for p in shared {
        let f = child_over(
            "child_sixteen_pairs",
            p,
            &[
                ("NCCL_FABRIC_ENDPOINTS", "device"),
                ("NCCL_FABRIC_LANES", "3"),
                ("NCCL_FABRIC_PROGRESS_THREAD", "yes"),
                ("NCCL_FABRIC_THREADS", "2"),
                // The test host logs like NCCL: TRACE shows each endpoint opened.
                ("NCCL_DEBUG", "TRACE"),
            ],
        );
        let opened = f.stderr.matches(" comms (").count();
        assert_eq!(opened, 6, "data endpoints opened over {p}\n{}", f.stderr);
        let driven = f.stderr.matches("a progress thread drives it").count();
        assert_eq!(
            driven, 6,
            "endpoints driven by threads over {p}\n{}",
            f.stderr
        );
        assert!(
            f.stderr
                .contains("2 progress thread(s) per device drive all its endpoints"),
            "the sizing line over {p}\n{}",
            f.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------
// 50 connect/close cycles without growth.

#[test]
#[ignore = "child process of another test"]
fn child_cycles() {
    let lib = init();
    let cycle = |lib: &PluginLib| {
        let until = deadline(30);
        let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
        std::thread::scope(|s| {
            s.spawn(|| recv_all(lib, recv, 65_536, 0, 4, until));
            send_all(lib, send, 65_536, 4, until);
        });
        // Registering the same range repeatedly must neither fail nor leak.
        let mut buf = vec![0u8; 1 << 20];
        let mrs: Vec<Ptr> = (0..8)
            .map(|_| {
                // SAFETY: buf outlives the registrations, deregistered just below.
                unsafe { lib.reg_mr(send, buf.as_mut_ptr().cast(), buf.len(), PTR_HOST) }
                    .expect("repeated regMr")
            })
            .collect();
        for m in mrs {
            lib.dereg_mr(send, m).expect("deregMr");
        }
        lib.close_send(send).expect("closeSend");
        lib.close_recv(recv).expect("closeRecv");
    };
    // Closes return at once; endpoints the provider still held operations on close in
    // the background within a moment (see control::adopt), so counts are read once they
    // settled, with a deadline.
    let settled = |limit: Option<(usize, usize)>| {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let now = (open_fds(), heap_in_use());
            let done = match limit {
                Some((fds, heap)) => now.0 <= fds && now.1 <= heap + (256 << 10),
                None => {
                    std::thread::sleep(Duration::from_millis(500));
                    now == (open_fds(), heap_in_use())
                }
            };
            if done || Instant::now() > until {
                return now;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    for _ in 0..5 {
        cycle(&lib);
    }
    let (fds, heap) = settled(None);
    let rss = rss_kib();
    for _ in 0..50 {
        cycle(&lib);
    }
    let (fds2, heap2) = settled(Some((fds, heap)));
    let rss2 = rss_kib();
    println!("RESULT fds={fds}->{fds2}");
    println!("RESULT heap={heap}->{heap2}");
    println!("RESULT rss_kib={rss}->{rss2}");
    assert!(
        fds2 <= fds,
        "open fds grew from {fds} to {fds2} over 50 cycles"
    );
    // A leaked comm pair (two request pools, ~13 KiB) per cycle would add ~650 KiB;
    // libfabric's own bookkeeping adds well under 64 KiB over 50 cycles.
    assert!(
        heap2 <= heap + (256 << 10),
        "heap in use grew from {heap} to {heap2} bytes over 50 cycles"
    );
    println!("RESULT ok=1");
}

#[test]
fn fifty_connect_close_cycles_without_growth() {
    for_each_provider("child_cycles", &[]);
    for_each_provider("child_cycles", &[("NCCL_FABRIC_ENDPOINTS", "comm")]);
}

// ---------------------------------------------------------------------------------------
// Bad input: malformed, zeroed, stale handles; a receive smaller than the send.

#[test]
#[ignore = "child process of another test"]
fn child_bad_handles() {
    let lib = init();
    let code = |r: Result<Option<Ptr>, nccl_net_host::CallError>| match r {
        Ok(_) => panic!("connect accepted a bad handle"),
        Err(e) => e.code,
    };
    // Zeroed.
    let mut zero = [0u8; NET_HANDLE_MAXSIZE];
    assert_eq!(
        code(lib.connect(0, &mut zero)),
        NcclResult::InvalidArgument as i32
    );
    // Corrupted bytes of a real handle: the checksum catches them.
    let (good, listen) = lib.listen(0).expect("listen");
    for i in [0usize, 5, 9, 30, 45] {
        let mut bad = good;
        bad[i] ^= 0x5a;
        assert_eq!(
            code(lib.connect(0, &mut bad)),
            NcclResult::InvalidArgument as i32,
            "byte {i}"
        );
    }
    // Random garbage.
    let mut junk = [0u8; NET_HANDLE_MAXSIZE];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = (i * 37 + 11) as u8;
    }
    assert_eq!(
        code(lib.connect(0, &mut junk)),
        NcclResult::InvalidArgument as i32
    );
    // A well-formed handle whose address libfabric rejects (or cannot reach).
    let fake = nccl_net_fabric::handshake::Handle {
        token: 1,
        nonce: 99,
        owner: nccl_net_fabric::handshake::Identity { host: 0, pid: 1 },
        addr: vec![0xff; 3],
    };
    let mut buf = [0u8; NET_HANDLE_MAXSIZE];
    fake.write(&mut buf).expect("encode");
    println!(
        "RESULT bad_address={}",
        connect_must_fail(&lib, &mut buf, "a fake address")
    );
    // Stale: the listen comm is closed before anyone connects.
    lib.close_listen(listen).expect("closeListen");
    let mut stale = good;
    assert_eq!(
        connect_must_fail(&lib, &mut stale, "a stale handle"),
        NcclResult::RemoteError as i32
    );
    // NULL and foreign pointers are refused, not dereferenced as ours.
    assert!(lib.accept(Ptr(std::ptr::null_mut())).is_err());
    let mut not_a_comm = [0u64; 64];
    assert_eq!(
        lib.close_send(Ptr(not_a_comm.as_mut_ptr().cast()))
            .unwrap_err()
            .code,
        NcclResult::InvalidArgument as i32
    );
    assert_eq!(
        lib.test(Ptr(not_a_comm.as_mut_ptr().cast()))
            .unwrap_err()
            .code,
        NcclResult::InvalidArgument as i32
    );
    println!("RESULT ok=1");
}

/// Calls connect until it fails (returning the code); connecting, or no answer within 20 s,
/// fails the test.
fn connect_must_fail(lib: &PluginLib, handle: &mut [u8; NET_HANDLE_MAXSIZE], what: &str) -> i32 {
    let until = deadline(20);
    loop {
        match lib.connect(0, handle) {
            Err(e) => return e.code,
            Ok(Some(_)) => panic!("connected through {what}"),
            Ok(None) => assert!(Instant::now() < until, "{what} did not fail in time"),
        }
    }
}

#[test]
fn bad_handles_give_errors_not_crashes() {
    for_each_provider(
        "child_bad_handles",
        &[("NCCL_FABRIC_CONNECT_TIMEOUT_MS", "1500")],
    );
}

/// An mhandle registered on one comm and passed to another: an error and a WARN, no crash
/// (each endpoint has its own domain, so the descriptor would mean nothing there).
#[test]
#[ignore = "child process of another test"]
fn child_foreign_mhandle() {
    let lib = init();
    let until = deadline(30);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    let mut buf = pattern(3, 4096);
    // SAFETY: buf outlives the registration, released below.
    let mh =
        unsafe { lib.reg_mr(recv, buf.as_mut_ptr().cast(), buf.len(), PTR_HOST) }.expect("regMr");
    // SAFETY: the call must fail before anything is posted.
    let r = unsafe { lib.isend(send, buf.as_mut_ptr().cast(), 4096, mh) };
    let code = r.expect_err("an mhandle of another comm is refused").code;
    assert_eq!(code, NcclResult::InvalidArgument as i32);
    lib.dereg_mr(recv, mh).expect("deregMr");
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
fn an_mhandle_of_another_comm_is_refused() {
    let f = run_child(
        "child_foreign_mhandle",
        &provider_env("tcp;ofi_rxm"),
        child_timeout(),
    );
    assert!(
        f.success && f.result("ok").is_some(),
        "--- stdout\n{}\n--- stderr\n{}",
        f.stdout,
        f.stderr
    );
    assert!(
        f.stderr.contains("registered on another comm"),
        "a WARN says what happened: {}",
        f.stderr
    );
}

#[test]
#[ignore = "child process of another test"]
fn child_truncated() {
    let lib = init();
    let until = deadline(30);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    let mut src = pattern(1, 4096);
    let mut dst = vec![0u8; 1024];
    // SAFETY: both buffers outlive the requests, which are waited for below.
    let r = unsafe {
        lib.irecv_until(
            recv,
            dst.as_mut_ptr().cast(),
            1024,
            Ptr(std::ptr::null_mut()),
            until,
        )
    }
    .expect("irecv");
    // SAFETY: as above.
    let s = unsafe {
        lib.isend_until(
            send,
            src.as_mut_ptr().cast(),
            4096,
            Ptr(std::ptr::null_mut()),
            until,
        )
    }
    .expect("isend");
    let got = lib.wait(r, until);
    let e = got.expect_err("a 1 KiB receive of a 4 KiB send must fail");
    println!("RESULT truncated={}", e.code);
    assert_ne!(e.code, -1, "it failed by error code, not by deadline");
    // The sender may finish or fail; either way within the deadline.
    let _ = lib.wait(s, until);
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
fn receive_smaller_than_send_is_an_error() {
    for p in data_providers() {
        let f = run_child("child_truncated", &provider_env(p), child_timeout());
        assert!(f.success, "over {p}\n{}\n{}", f.stdout, f.stderr);
        assert_eq!(
            f.result("truncated"),
            Some((NcclResult::InternalError as i32).to_string()),
            "over {p}: {}",
            f.stderr
        );
        assert!(
            f.stderr.contains("truncated"),
            "WARN names the truncation: {}",
            f.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------
// Close with requests still in flight.

#[test]
#[ignore = "child process of another test"]
fn child_close_in_flight() {
    let lib = init();
    let until = deadline(60);
    for _ in 0..3 {
        // Pair a: receives posted that no send will ever match. Pair b: sends posted that no
        // receive will take (1 MiB: past every eager limit, so they cannot complete).
        let (a_send, a_recv) = lib.connect_pair(0, until).expect("connect_pair");
        let (b_send, b_recv) = lib.connect_pair(0, until).expect("connect_pair");
        // The provider may still hold these buffers after close (the plugin then keeps the
        // requests' memory): they must outlive the process.
        let bufs: &'static mut [Vec<u8>] = Vec::leak((0..16).map(|_| vec![0u8; 1 << 20]).collect());
        let mut sends_in_flight = 0;
        for (i, b) in bufs.iter_mut().enumerate() {
            let (comm, p) = (if i < 8 { a_recv } else { b_send }, b.as_mut_ptr().cast());
            // SAFETY: the buffers are leaked, so valid for as long as anyone may touch them.
            unsafe {
                if i < 8 {
                    lib.irecv_until(comm, p, 1 << 20, Ptr(std::ptr::null_mut()), until)
                        .expect("irecv");
                } else {
                    // Sends nobody receives: post what the provider takes within a second
                    // (shm may refuse more once its queues to the peer are full).
                    let posted = lib.isend_until(
                        comm,
                        p,
                        1 << 20,
                        Ptr(std::ptr::null_mut()),
                        deadline(1).min(until),
                    );
                    sends_in_flight += usize::from(posted.is_ok());
                }
            }
        }
        assert!(
            sends_in_flight >= 1,
            "no send was in flight when its comm closed"
        );
        let started = Instant::now();
        for (close, comm) in [(0, a_recv), (1, b_send), (0, b_recv), (1, a_send)] {
            if close == 0 {
                lib.close_recv(comm)
                    .expect("closeRecv with receives in flight");
            } else {
                lib.close_send(comm)
                    .expect("closeSend with sends in flight");
            }
        }
        // Closes never wait (docs/faults.md): ten times the 50 ms it states for eight comms.
        assert!(
            started.elapsed() <= scaled(0.5),
            "closing took {:?}",
            started.elapsed()
        );
    }
    // The plugin still carries data afterwards.
    let (send, recv) = lib
        .connect_pair(0, until)
        .expect("connect_pair after closes");
    std::thread::scope(|s| {
        s.spawn(|| recv_all(&lib, recv, 65_536, 0, 8, until));
        send_all(&lib, send, 65_536, 8, until);
    });
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
fn close_with_requests_in_flight() {
    for_each_provider(
        "child_close_in_flight",
        &[("NCCL_FABRIC_CLOSE_TIMEOUT_MS", "300")],
    );
    for_each_provider(
        "child_close_in_flight",
        &[
            ("NCCL_FABRIC_CLOSE_TIMEOUT_MS", "300"),
            ("NCCL_FABRIC_ENDPOINTS", "comm"),
        ],
    );
    // Ops may still sit in the progress thread's queue when their comm closes, and the
    // progress threads take unmatched messages in (shm then holds a same-process sender's
    // memory: closing it first crashed libfabric 2.1 when the receiver closed).
    for_each_provider(
        "child_close_in_flight",
        &[
            ("NCCL_FABRIC_CLOSE_TIMEOUT_MS", "300"),
            ("NCCL_FABRIC_PROGRESS_THREAD", "yes"),
        ],
    );
}

#[test]
#[ignore = "child process of another test"]
fn child_stall_warning() {
    let lib = init();
    let until = deadline(30);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    let buf: &'static mut [u8] = Vec::leak(vec![0u8; 4096]);
    // SAFETY: the buffer is leaked, so valid for as long as the provider may hold it.
    let r = unsafe {
        lib.irecv_until(
            recv,
            buf.as_mut_ptr().cast(),
            4096,
            Ptr(std::ptr::null_mut()),
            until,
        )
    }
    .expect("irecv");
    let stop = Instant::now() + Duration::from_millis(700);
    while Instant::now() < stop {
        assert_eq!(lib.test(r).expect("test"), None, "nothing was sent");
        std::thread::sleep(Duration::from_millis(10));
    }
    lib.close_recv(recv).expect("closeRecv");
    lib.close_send(send).expect("closeSend");
    println!("RESULT ok=1");
}

#[test]
fn a_stalled_request_is_reported_once() {
    for p in data_providers() {
        let mut env = provider_env(p);
        env.push(("NCCL_FABRIC_STALL_WARN_MS".into(), "200".into()));
        let f = run_child_ok("child_stall_warning", &env, child_timeout());
        let warns = f.stderr.matches("has not finished after").count();
        assert_eq!(warns, 1, "over {p}: {}", f.stderr);
        assert!(
            f.stderr.contains("a receive of 4096 bytes from pid"),
            "over {p}: {}",
            f.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------
// A peer killed mid-transfer.

#[test]
#[ignore = "child process of another test"]
fn child_victim() {
    // Connects both ways, then streams forever; the test kills it.
    let lib = init();
    let (send, recv, _) = meet_peer(&lib, deadline(60), false);
    println!("RESULT streaming=1");
    let _ = recv;
    send_all(&lib, send, 1 << 20, 1_000_000, deadline(120));
}

#[test]
#[ignore = "child process of another test"]
fn child_survivor() {
    let lib = init();
    let (send, recv, _) = meet_peer(&lib, deadline(60), true);
    let mut buf = vec![0u8; 1 << 20];
    let mut back = vec![0u8; 1 << 20];
    println!("RESULT receiving=1");
    // Receive until the peer dies: the error must come within the deadline.
    let died = deadline(30);
    let recv_err = loop {
        // SAFETY: buf outlives the request, which is waited for right away.
        let r = match unsafe {
            lib.irecv_until(
                recv,
                buf.as_mut_ptr().cast(),
                buf.len() as i32,
                Ptr(std::ptr::null_mut()),
                died,
            )
        } {
            Ok(r) => r,
            Err(e) => break e,
        };
        if let Err(e) = lib.wait(r, died) {
            break e;
        }
    };
    assert_ne!(
        recv_err.code, -1,
        "receive from a dead peer hit the deadline instead of failing"
    );
    println!("RESULT recv_error={}", recv_err.code);
    // Sending to the dead peer fails too, or at least never hangs: bounded by a deadline.
    let until = deadline(30);
    let send_err = (0..64).find_map(|_| {
        // SAFETY: back outlives the request, which is waited for right away.
        let s = match unsafe {
            lib.isend_until(
                send,
                back.as_mut_ptr().cast(),
                back.len() as i32,
                Ptr(std::ptr::null_mut()),
                until,
            )
        } {
            Ok(s) => s,
            Err(e) => return Some(e),
        };
        lib.wait(s, until).err()
    });
    println!("RESULT send_error={}", send_err.map_or(0, |e| e.code));
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
fn peer_killed_mid_transfer() {
    for (p, env) in provider_envs() {
        let mut survivor = spawn_child("child_survivor", &env, child_timeout());
        let mut victim = spawn_child("child_victim", &env, child_timeout());
        let hs = survivor.read_result("handle");
        let hv = victim.read_result("handle");
        survivor.send_line(&hv);
        victim.send_line(&hs);
        let _ = victim.read_result("streaming");
        std::thread::sleep(Duration::from_millis(300));
        victim.kill();
        let started = Instant::now();
        let f = survivor.finish();
        eprintln!(
            "{p}: survivor finished {:?} after the kill: {:?}",
            started.elapsed(),
            f.result("send_error")
        );
        assert!(
            f.success,
            "survivor over {p} failed\n--- stdout\n{}\n--- stderr\n{}",
            f.stdout, f.stderr
        );
        let code: i32 = f
            .result("recv_error")
            .and_then(|v| v.parse().ok())
            .expect("recv_error");
        assert_eq!(code, NcclResult::RemoteError as i32, "over {p}: {code}");
        // The WARN says the peer is gone (liveness), or gives the provider's text for the
        // failed operation.
        assert!(
            f.stderr.contains("is gone") || f.stderr.contains("failed: "),
            "a WARN says what happened: {}",
            f.stderr
        );
    }
}

/// The check every child's output goes through: a panic in the plugin fails the test, one in
/// test code is the test's own business.
#[test]
fn plugin_panics_are_told_from_test_panics() {
    assert!(plugin_panicked("thread 'nfab-progress' panicked at src/driver.rs:10:5:").is_some());
    assert!(plugin_panicked(
        "NCCL WARN NET/Fabric : test: internal error (boom); this is a plugin bug, please report it"
    )
    .is_some());
    assert!(plugin_panicked("thread 'child' panicked at tests/datapath.rs:1:1:").is_none());
}

// ---------------------------------------------------------------------------------------
// NCCL's buffers: one registration, messages sent from and received into its slots.

#[test]
#[ignore = "child process of another test"]
fn child_slots_of_one_registration() {
    let lib = init();
    let until = deadline(60);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    // As NCCL's 4 MiB buffers: 8 slots of 512 KiB (a message in pieces) and, at another
    // size, messages that do not begin at a piece boundary of the registration.
    for (len, stride) in [
        (512 << 10, 512 << 10),
        (300_000, 300_000),
        (1 << 20, 1 << 20),
    ] {
        let slots = 8;
        let mut out = vec![0u8; slots * stride];
        let mut into = vec![0u8; slots * stride];
        // SAFETY: both buffers outlive their registrations, deregistered below.
        let (smr, rmr) = unsafe {
            (
                lib.reg_mr(send, out.as_mut_ptr().cast(), out.len(), PTR_HOST)
                    .expect("regMr"),
                lib.reg_mr(recv, into.as_mut_ptr().cast(), into.len(), PTR_HOST)
                    .expect("regMr"),
            )
        };
        for round in 0..3 {
            let mut reqs = Vec::new();
            for slot in 0..slots {
                let i = round * slots + slot;
                out[slot * stride..slot * stride + len].copy_from_slice(&pattern(i, len));
                // SAFETY: each slot is touched again only after both requests completed.
                unsafe {
                    let at = into.as_mut_ptr().add(slot * stride).cast();
                    let r = lib
                        .irecv_until(recv, at, len as i32, rmr, until)
                        .expect("irecv");
                    let from = out.as_mut_ptr().add(slot * stride).cast();
                    let s = lib
                        .isend_until(send, from, len as i32, smr, until)
                        .expect("isend");
                    reqs.push((r, s));
                }
            }
            for (slot, (r, s)) in reqs.into_iter().enumerate() {
                assert_eq!(lib.wait(r, until).expect("receive"), len as i32);
                lib.wait(s, until).expect("send");
                let i = round * slots + slot;
                assert!(
                    into[slot * stride..slot * stride + len] == pattern(i, len)[..],
                    "message {i} of {len} bytes, slot {slot}, differs"
                );
            }
        }
        lib.dereg_mr(send, smr).expect("deregMr");
        lib.dereg_mr(recv, rmr).expect("deregMr");
    }
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

/// Messages sent from and received into slots of one registration, as NCCL's are, arrive
/// whole, pieces included (over rxm, a long message is read from where its descriptor's
/// registration begins: a send from the middle of one needs its own, see `mr`).
#[test]
fn slots_of_one_registration_carry_their_own_messages() {
    for_each_provider("child_slots_of_one_registration", &[]);
}
