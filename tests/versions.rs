//! Every table version NCCL may look up, v6 to v12, through the exported table in child
//! processes (one per version and provider): init, properties, a transfer, close. Then the
//! features of particular versions: grouped receives (every version has `maxRecvs`),
//! profiler events (v10+), and unloading and reloading the library as NCCL 2.28+ does.

mod common;

use common::scenario::*;
use common::*;
use nccl_net_fabric::nccl::{profiler, ProfilerDescrV1};
use nccl_net_host::{PluginLib, Ptr, RecvBuffer, VERSIONS};
use std::ffi::c_void;
use std::sync::Mutex;
use std::time::Instant;

const CHILD: f64 = 120.0;

fn version() -> u32 {
    std::env::var("NFAB_TABLE").unwrap().parse().unwrap()
}

/// Moves `count` messages of `len` bytes from `send` to `recv` (checked).
fn transfer(lib: &PluginLib, send: Ptr, recv: Ptr, len: usize, count: usize, until: Instant) {
    std::thread::scope(|s| {
        s.spawn(|| recv_n(lib, recv, len, count, until));
        send_n(lib, send, len, count, until);
    });
}

// ---------------------------------------------------------------------------------------
// Each table.

#[test]
#[ignore = "child process of another test"]
fn child_table() {
    let v = version();
    let lib = plugin_version(v);
    assert_eq!(lib.name(), "Fabric");
    lib.init(true).expect("init");
    assert!(lib.devices().expect("devices") >= 1);
    let p = lib.properties(0).expect("getProperties");
    assert_eq!(p.max_recvs, 8, "maxRecvs");
    assert!(p.speed > 0 && !p.name.is_empty());
    match (v, &p.newer) {
        (6..=8, None) => {}
        (9.., Some(n)) => {
            assert!(n.max_p2p_bytes > 0, "maxP2pBytes must be > 0");
            if v == 12 {
                assert_eq!((n.rail_id, n.plane_id), (-1, -1), "railId/planeId unknown");
            }
        }
        _ => panic!("v{v}: properties {p:?}"),
    }
    let until = until(60.0);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    transfer(&lib, send, recv, 65536, 8, until);
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    lib.finalize().expect("finalize");
    println!("RESULT ok=1");
}

#[test]
fn every_table_version_carries_data() {
    for (p, env) in envs(&[]) {
        for v in VERSIONS {
            let mut env = env.clone();
            env.push(("NFAB_TABLE".into(), v.to_string()));
            let f = run_child("child_table", &env, scaled(CHILD));
            ok(&f, &format!("table v{v} over {p}"));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Grouped receives.

/// Sizes of the 8 buffers of a grouped receive and of the sends they take.
const SIZES: [usize; 8] = [1, 4096, 65536, 100, 0, 300_000, 7, 16384];

#[test]
#[ignore = "child process of another test"]
fn child_grouped() {
    let v = version();
    let lib = plugin_version(v);
    lib.init(true).expect("init");
    let until = until(60.0);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    let tags: Vec<i32> = (0..8).map(|i| 1000 + 17 * i).collect();
    for round in 0..4usize {
        // Receive buffers larger than their sends, except in the last round's buffer 3.
        let truncate = round == 3;
        let mut dst: Vec<Vec<u8>> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![0u8; if truncate && i == 3 { n / 2 } else { n + 64 }])
            .collect();
        let bufs: Vec<RecvBuffer> = dst
            .iter_mut()
            .zip(&tags)
            .map(|(d, &tag)| RecvBuffer {
                data: d.as_mut_ptr().cast(),
                size: d.len(),
                tag,
                mhandle: Ptr(std::ptr::null_mut()),
                phandle: Ptr(std::ptr::null_mut()),
            })
            .collect();
        // SAFETY: dst outlives the request, waited for below.
        let r = until_some(until, || unsafe { lib.irecv_group(recv, &bufs) }).expect("irecv");
        // Sends in another order each round.
        let mut order: Vec<usize> = (0..8).collect();
        order.rotate_left((round * 3) % 8);
        if round % 2 == 1 {
            order.reverse();
        }
        let mut src: Vec<Vec<u8>> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(round * 8 + i, n))
            .collect();
        let sends: Vec<Ptr> = order
            .iter()
            .map(|&i| {
                let b = &mut src[i];
                // SAFETY: src outlives the requests, waited for below.
                until_some(until, || unsafe {
                    lib.isend_tagged(
                        send,
                        b.as_mut_ptr().cast(),
                        b.len(),
                        tags[i],
                        Ptr(std::ptr::null_mut()),
                        Ptr(std::ptr::null_mut()),
                    )
                })
                .expect("isend")
            })
            .collect();
        let got = until_some(until, || lib.test_group(r, 8));
        if truncate {
            let e = got.expect_err("a buffer smaller than its send");
            println!("RESULT truncated={}", e.code);
            break;
        }
        let sizes = got.expect("grouped receive");
        for (i, d) in dst.iter().enumerate() {
            assert_eq!(
                sizes[i] as usize, SIZES[i],
                "round {round}, buffer {i}: size"
            );
            assert!(
                d[..SIZES[i]] == pattern(round * 8 + i, SIZES[i])[..],
                "round {round}, buffer {i} took another send"
            );
        }
        for s in sends {
            until_some(until, || lib.test(s)).expect("send");
        }
    }
    println!("RESULT ok=1");
}

/// Calls `f` until it gives a value (a `CallResult<Option<T>>`), or panics at `until`.
fn until_some<T, E: std::fmt::Debug>(
    until: Instant,
    mut f: impl FnMut() -> Result<Option<T>, E>,
) -> Result<T, E> {
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => assert!(Instant::now() < until, "deadline passed"),
            Err(e) => return Err(e),
        }
    }
}

#[test]
#[ignore = "child process of another test"]
fn child_many_sends() {
    let lib = plugin_version(version());
    lib.init(true).expect("init");
    let until = until(60.0);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    // A pair left idle for a while before the first send (NFAB_IDLE_MS): the receiver's
    // endpoint then has nothing in flight, and no call of the receiver drives it.
    if let Some(ms) = std::env::var("NFAB_IDLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    // 32 requests × 8 buffers of sends in flight before any receive.
    let n = 32 * 8;
    let mut src: Vec<Vec<u8>> = (0..n).map(|i| pattern(i, 512)).collect();
    let sends: Vec<Ptr> = src
        .iter_mut()
        .enumerate()
        .map(|(i, b)| {
            // SAFETY: src outlives the requests.
            until_some(until, || unsafe {
                lib.isend_tagged(
                    send,
                    b.as_mut_ptr().cast(),
                    512,
                    (i % 8) as i32,
                    Ptr(std::ptr::null_mut()),
                    Ptr(std::ptr::null_mut()),
                )
            })
            .expect("isend")
        })
        .collect();
    for g in 0..32 {
        let mut dst: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 512]).collect();
        let bufs: Vec<RecvBuffer> = dst
            .iter_mut()
            .enumerate()
            .map(|(i, d)| RecvBuffer {
                data: d.as_mut_ptr().cast(),
                size: 512,
                tag: (7 - i) as i32,
                mhandle: Ptr(std::ptr::null_mut()),
                phandle: Ptr(std::ptr::null_mut()),
            })
            .collect();
        // SAFETY: dst outlives the request, waited for right away.
        let r = until_some(until, || unsafe { lib.irecv_group(recv, &bufs) }).expect("irecv");
        until_some(until, || lib.test_group(r, 8)).expect("grouped receive");
        for (i, d) in dst.iter().enumerate() {
            let tag = 7 - i;
            assert!(*d == pattern(g * 8 + tag, 512), "group {g}, tag {tag}");
        }
    }
    for s in sends {
        until_some(until, || lib.test(s)).expect("send");
    }
    println!("RESULT ok=1");
}

#[test]
fn grouped_receives_take_the_send_with_their_tag() {
    for (p, env) in envs(&[]) {
        for v in [8, 12] {
            let mut env = env.clone();
            env.push(("NFAB_TABLE".into(), v.to_string()));
            let f = run_child("child_grouped", &env, scaled(CHILD));
            ok(&f, &format!("grouped receives, v{v} over {p}"));
            assert!(
                f.result("truncated").is_some_and(|c| c != "0"),
                "{p}: the truncated buffer is an error"
            );
            let f = run_child("child_many_sends", &env, scaled(CHILD));
            ok(&f, &format!("256 sends in flight, v{v} over {p}"));
        }
    }
}

/// Sends posted before any receive, to a receiver whose endpoints no call has driven for
/// longer than the control thread's nudges follow a lane's last work: each provider needs
/// the receiver's endpoint to progress to take a new connection (rxm accepts a CONNECT, shm
/// maps the peer) and to take messages off the wire, so idle endpoints of NCCL's calls must
/// still get turns now and then, or the sends stall until a receive is posted. Progress
/// threads asleep on the endpoints' wait objects must wake for it too.
#[test]
fn sends_reach_a_receiver_left_idle() {
    for threads in ["no", "yes"] {
        for (p, env) in envs(&[
            ("NCCL_FABRIC_PROGRESS_THREAD", threads),
            ("NFAB_IDLE_MS", "1500"),
        ]) {
            let mut env = env.clone();
            env.push(("NFAB_TABLE".into(), "12".into()));
            let f = run_child("child_many_sends", &env, scaled(CHILD));
            ok(
                &f,
                &format!("256 sends after an idle pause, over {p}, progress threads {threads}"),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Profiler events.

/// (type, phandle, plugin id, descriptor, the event handle given or received).
type Event = (i32, usize, i64, Option<(u8, i32, i32, usize)>, usize);

static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

unsafe extern "C" fn record(
    handle: *mut *mut c_void,
    kind: i32,
    phandle: *mut c_void,
    plugin: i64,
    ext: *mut c_void,
) -> i32 {
    let mut events = EVENTS.lock().unwrap();
    // SAFETY: the plugin passes its descriptor with a start, NULL with a stop.
    let descr = unsafe { ext.cast::<ProfilerDescrV1>().as_ref() }
        .map(|d| (d.kind, d.part, d.tag, d.length));
    if kind == profiler::START {
        // SAFETY: handle is the plugin's out-pointer for the event handle.
        unsafe { *handle = (0x1000 + events.len()) as *mut c_void };
    }
    // SAFETY: as above; with a stop it holds the handle the start gave.
    let h = unsafe { *handle } as usize;
    events.push((kind, phandle as usize, plugin, descr, h));
    0
}

#[test]
#[ignore = "child process of another test"]
fn child_profiler() {
    let with = std::env::var("NFAB_PROFILER").is_ok();
    let f: nccl_net_fabric::nccl::ProfilerFn = if with { Some(record) } else { None };
    let lib = plugin_version(version()).with_profiler(f);
    lib.init(true).expect("init");
    let until = until(60.0);
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    let mut src = pattern(1, 5000);
    let mut dst = [vec![0u8; 5000], vec![0u8; 64]];
    let bufs: Vec<RecvBuffer> = dst
        .iter_mut()
        .enumerate()
        .map(|(i, d)| RecvBuffer {
            data: d.as_mut_ptr().cast(),
            size: d.len(),
            tag: i as i32,
            mhandle: Ptr(std::ptr::null_mut()),
            phandle: Ptr((0xa0 + i) as *mut c_void),
        })
        .collect();
    // SAFETY: the buffers outlive the requests, waited for below.
    let r = until_some(until, || unsafe { lib.irecv_group(recv, &bufs) }).expect("irecv");
    let mut small = [7u8; 10];
    let s: Vec<Ptr> = [(src.as_mut_ptr(), 5000, 0), (small.as_mut_ptr(), 10, 1)]
        .iter()
        .map(|&(p, n, tag)| {
            // SAFETY: as above.
            until_some(until, || unsafe {
                lib.isend_tagged(
                    send,
                    p.cast(),
                    n,
                    tag,
                    Ptr(std::ptr::null_mut()),
                    Ptr((0xb0 + tag) as *mut c_void),
                )
            })
            .expect("isend")
        })
        .collect();
    until_some(until, || lib.test_group(r, 2)).expect("receive");
    for s in s {
        until_some(until, || lib.test(s)).expect("send");
    }
    let events = EVENTS.lock().unwrap().clone();
    println!("RESULT events={}", events.len());
    if !with {
        assert!(events.is_empty(), "no profiler, no events: {events:?}");
        println!("RESULT ok=1");
        return;
    }
    let starts: Vec<&Event> = events.iter().filter(|e| e.0 == profiler::START).collect();
    let stops: Vec<&Event> = events.iter().filter(|e| e.0 == profiler::STOP).collect();
    assert_eq!(starts.len(), 4, "{events:?}");
    assert_eq!(stops.len(), 4, "{events:?}");
    let expected = [
        (0xa0, (profiler::RECV, 0, 0, 5000)),
        (0xa1, (profiler::RECV, 1, 1, 64)),
        (0xb0, (profiler::SEND, 0, 0, 5000)),
        (0xb1, (profiler::SEND, 0, 1, 10)),
    ];
    for (phandle, descr) in expected {
        let start = starts
            .iter()
            .find(|e| e.1 == phandle)
            .unwrap_or_else(|| panic!("no start for phandle {phandle:#x}: {events:?}"));
        assert_eq!(start.2, profiler::PLUGIN_ID);
        assert_eq!(start.3, Some(descr), "descriptor of {phandle:#x}");
        assert!(
            stops.iter().any(|e| e.4 == start.4),
            "the event of {phandle:#x} is stopped: {events:?}"
        );
    }
    println!("RESULT ok=1");
}

#[test]
fn profiler_events_follow_each_buffer() {
    let env = provider_env("shm");
    for (v, with) in [(10, true), (12, true), (12, false), (8, false)] {
        let mut env = env.clone();
        env.push(("NFAB_TABLE".into(), v.to_string()));
        if with {
            env.push(("NFAB_PROFILER".into(), "1".into()));
        }
        let f = run_child("child_profiler", &env, scaled(CHILD));
        ok(&f, &format!("profiler v{v} ({with})"));
    }
}

// ---------------------------------------------------------------------------------------
// Unloading and reloading, as NCCL 2.28+ does between communicators.

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
#[ignore = "child process of another test"]
fn child_reload() {
    let until = until(300.0);
    // Fixed thresholds: glibc otherwise raises them after each large free and keeps up to
    // 64 MiB of freed memory resident per arena, which RSS would count as growth.
    // SAFETY: mallopt only changes the allocator's tuning; no allocation is in flight.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
    let mut marks = Vec::new();
    let cycles = (100.0 / slow()).max(5.0) as usize;
    for i in 0..cycles {
        let lib = plugin_version(11);
        let ctx = lib.init_v11(i as u64, true).expect("init");
        let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
        transfer(&lib, send, recv, 65536, 4, until);
        lib.close_send(send).expect("closeSend");
        lib.close_recv(recv).expect("closeRecv");
        lib.finalize_v11(ctx).expect("finalize");
        lib.close().expect("dlclose");
        if i == 4 || i == 49 || i + 1 == cycles {
            // Free memory the allocator keeps in its arenas is not ours: hand it back first,
            // so RSS counts what the process still holds.
            // SAFETY: malloc_trim only returns free pages to the kernel.
            unsafe { libc::malloc_trim(0) };
            marks.push((i + 1, open_fds(), threads(), rss_kib(), heap_in_use()));
            let mapped = std::fs::read_to_string("/proc/self/maps")
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("libnccl_net_fabric"))
                .count();
            println!("RESULT mapped_{}={mapped}", i + 1);
        }
    }
    for (n, fds, threads, rss, heap) in &marks {
        println!("RESULT after_{n}=fds {fds} threads {threads} rss_kib {rss} heap {heap}");
    }
    let (first, last) = (marks[0], marks[marks.len() - 1]);
    // Endpoints closing in the background may hold a descriptor or a provider thread for a
    // moment (one such thread was still there at the first mark in some runs), and lanes
    // left lingering close a few seconds later: what is left behind is growth past the
    // first mark.
    let settled = Instant::now() + std::time::Duration::from_secs(5);
    while (open_fds() > first.1 || threads() > first.2) && Instant::now() < settled {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        open_fds() <= first.1,
        "file descriptors: {marks:?}, now {}",
        open_fds()
    );
    assert!(threads() <= first.2, "threads: {marks:?} {names:?}");
    // Every mark the same: no descriptor kept per cycle.
    assert!(
        marks.iter().all(|m| m.1 == first.1),
        "file descriptors: {marks:?}"
    );
    // A buffer of 64 KiB kept per cycle would add 6 MiB over 100 cycles.
    assert!(last.3 < first.3 + 4 * 1024, "RSS: {marks:?}");
    assert!(last.4 < first.4 + 1024 * 1024, "heap: {marks:?}");
    println!("RESULT ok=1");
}

#[test]
fn reloading_the_library_leaves_nothing_behind() {
    // One flow per comm: each cycle's comm would take its first flow on the next of 12 lanes,
    // and how many of those linger at a mark (5 s after their comm) varies with the cycle.
    for (p, env) in envs(&[("NCCL_FABRIC_FLOWS", "1")]) {
        let f = run_child("child_reload", &env, scaled(CHILD * 2.0));
        ok(&f, &format!("100 reloads over {p}"));
        for l in f
            .stdout
            .lines()
            .filter(|l| l.contains("RESULT after_") || l.contains("RESULT mapped_"))
        {
            eprintln!("{p}: {l}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Communicators one after another: shared lanes stay open for the next one, then close.

/// One communicator: init, a pair on device 0, 4 × 64 KiB, close, finalize. Returns how
/// long connecting took.
fn communicator(lib: &PluginLib, id: u64, until: Instant) -> std::time::Duration {
    let ctx = lib.init_v11(id, true).expect("init");
    let start = Instant::now();
    let (send, recv) = lib.connect_pair(0, until).expect("connect_pair");
    let took = start.elapsed();
    transfer(lib, send, recv, 65536, 4, until);
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    lib.finalize_v11(ctx).expect("finalize");
    took
}

#[test]
#[ignore = "child process of another test"]
fn child_linger() {
    let until = until(120.0);
    let linger: u64 = std::env::var("NCCL_FABRIC_LANE_LINGER_MS")
        .unwrap()
        .parse()
        .unwrap();
    let lib = plugin_version(11);
    // The first communicator opens the control endpoint and the lanes.
    let first = communicator(&lib, 1, until);
    let after_first = open_fds();
    let second = communicator(&lib, 2, until);
    let after_second = open_fds();
    // Past the linger time the lanes close (the control endpoint stays): the control
    // thread's chore closes them within moments; waited for, with a deadline stretched on a
    // slow machine.
    std::thread::sleep(std::time::Duration::from_millis(linger));
    let closed_by = std::time::Instant::now() + scaled(5.0);
    let mut after_wait = open_fds();
    while after_wait >= after_second && std::time::Instant::now() < closed_by {
        std::thread::sleep(std::time::Duration::from_millis(20));
        after_wait = open_fds();
    }
    let third = communicator(&lib, 3, until);
    let after_third = open_fds();
    println!(
        "RESULT connect_us={},{},{}",
        first.as_micros(),
        second.as_micros(),
        third.as_micros()
    );
    println!("RESULT fds={after_first},{after_second},{after_wait},{after_third}");
    assert_eq!(
        after_first, after_second,
        "the second communicator reuses the lanes"
    );
    assert!(
        after_wait < after_second,
        "idle lanes close after {linger} ms: fds {after_second} -> {after_wait}"
    );
    assert_eq!(after_third, after_first, "new lanes, as many as before");
    println!("RESULT ok=1");
}

#[test]
fn lanes_outlive_a_communicator_by_the_linger_time() {
    // shm gives every comm an endpoint of its own: nothing is shared, nothing lingers. One
    // flow per comm: each comm's first flow is the pool's next lane, whose connection to the
    // peer opens with its first message, which would count as descriptors of the second
    // communicator's own.
    let settings = [
        ("NCCL_FABRIC_LANE_LINGER_MS", "1000"),
        ("NCCL_FABRIC_FLOWS", "1"),
    ];
    for (p, env) in envs(&settings) {
        if p == "shm" {
            continue;
        }
        let f = run_child("child_linger", &env, scaled(CHILD));
        ok(&f, &format!("lingering lanes over {p}"));
        eprintln!(
            "{p}: connect µs {:?}, fds {:?}",
            f.result("connect_us"),
            f.result("fds")
        );
    }
}
