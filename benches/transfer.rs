//! Throughput and latency of the plugin, measured through its exported C table, side by side
//! with raw libfabric (tagged send/recv on two endpoints of the same provider and domain, no
//! plugin in between) in the same run.
//!
//! `cargo bench --bench transfer` runs `tcp;ofi_rxm` and `shm` (and native `tcp` on
//! libfabric >= 1.18), each in its own process; `-- PROVIDER` runs one, `-- --latency` only
//! the ping-pong, and `NFAB_BENCH_SIZES=4096,65536` streams only the sizes it lists. Prints GB/s per size, the 8-byte half round trip (10 runs, sorted), and
//! plugin/raw ratios, with the CPU seconds the process spent per GB moved (both sides, the
//! plugin's threads included). The plugin runs with the environment's settings: e.g.
//! `NCCL_FABRIC_PROGRESS_THREAD=yes` with `NCCL_FABRIC_PROGRESS_SPIN_US=10000000` (never sleep).
//! `-- --yield` makes each side yield its core whenever its operation is not done yet, as
//! NCCL's proxy thread does when nothing progressed: the shape of a rank whose threads share
//! one core (`taskset -c 0 cargo bench --bench transfer -- --yield`).
//!
//! The ping-pong runs both of its ranks in this one process, each in a thread of its own. Where
//! the sizing gives a device one lane per direction (2 CPUs), both threads' comms of a
//! direction share that lane and meet on it, which no rank of an NCCL job does (it drives its
//! lanes from one proxy thread): `NCCL_FABRIC_LANES=2` gives each thread lanes of its own, the
//! shape of a process per rank.

mod common;

use common::cpu_seconds;
use nccl_net_fabric::discover::discover;
use nccl_net_fabric::endpoint::{Endpoint, Event, Queue};
use nccl_net_fabric::fabric::{runtime_version, version_string, Domain, Fabric};
use nccl_net_fabric::nccl::PTR_HOST;
use nccl_net_fabric::op::{Op, Status};
use nccl_net_fabric::provider::decide;
use nccl_net_fabric::settings::Settings;
use nccl_net_host::{PluginLib, Ptr};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZES: &[usize] = &[4 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20];
const IN_FLIGHT: usize = 8;
const BYTES_PER_SIZE: usize = 512 << 20;
const PINGS: usize = 2000;
/// The 8-byte ping-pong is measured this many times, raw and plugin in turn, and reported as
/// median and spread: a busy machine (every core taken by other work) turns single runs
/// bimodal, since a spinning side that loses its core waits out a scheduler time slice.
const LATENCY_RUNS: usize = 10;

/// The sizes streamed: [`SIZES`], or those `NFAB_BENCH_SIZES` lists (bytes, comma-separated).
fn sizes() -> Vec<usize> {
    match std::env::var("NFAB_BENCH_SIZES") {
        Ok(list) => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        Err(_) => SIZES.to_vec(),
    }
}

fn iters(size: usize) -> usize {
    (BYTES_PER_SIZE / size).clamp(16, 20_000)
}

/// One side of a transfer, whichever way it is implemented.
trait Side: Sync {
    /// Posts one operation on buffer `buf`; `None`: try again.
    fn post(&self, slot: usize, buf: *mut u8, len: usize) -> Option<usize>;
    /// Whether the operation with this token finished.
    fn done(&self, token: usize) -> bool;
}

/// What a side does while its operation is not done: spin, or with `-- --yield` give the core
/// to whichever thread is waiting for it.
fn not_yet() {
    static YIELD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *YIELD.get_or_init(|| std::env::var("NFAB_BENCH_YIELD").is_ok()) {
        std::thread::yield_now();
    }
}

fn drive(side: &dyn Side, bufs: &[usize], len: usize, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut pending = VecDeque::new();
    for i in 0..count {
        if pending.len() == IN_FLIGHT {
            let t = pending.pop_front().expect("non-empty");
            while !side.done(t) {
                assert!(Instant::now() < deadline, "benchmark stalled");
                not_yet();
            }
        }
        let slot = i % IN_FLIGHT;
        loop {
            if let Some(t) = side.post(slot, bufs[slot] as *mut u8, len) {
                pending.push_back(t);
                break;
            }
            assert!(Instant::now() < deadline, "benchmark stalled");
            not_yet();
        }
    }
    for t in pending {
        while !side.done(t) {
            assert!(Instant::now() < deadline, "benchmark stalled");
            not_yet();
        }
    }
}

/// GB/s, and CPU seconds per GB.
fn stream(send: &dyn Side, recv: &dyn Side, len: usize) -> (f64, f64) {
    let count = iters(len);
    let mut sbufs: Vec<Vec<u8>> = (0..IN_FLIGHT).map(|_| vec![1u8; len]).collect();
    let mut rbufs: Vec<Vec<u8>> = (0..IN_FLIGHT).map(|_| vec![0u8; len]).collect();
    let sp: Vec<usize> = sbufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    let rp: Vec<usize> = rbufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    let start = Instant::now();
    let cpu = cpu_seconds();
    std::thread::scope(|s| {
        s.spawn(|| drive(recv, &rp, len, count));
        drive(send, &sp, len, count);
    });
    let gb = (len * count) as f64 / 1e9;
    (
        gb / start.elapsed().as_secs_f64(),
        (cpu_seconds() - cpu) / gb,
    )
}

fn ping_pong(a_send: &dyn Side, a_recv: &dyn Side, b_send: &dyn Side, b_recv: &dyn Side) -> f64 {
    let mut bufs = [[0u8; 8]; 3];
    let [pa, pb, pc] = [0, 1, 2].map(|i| bufs[i].as_mut_ptr() as usize);
    let wait = |side: &dyn Side, buf: usize| {
        let t = loop {
            if let Some(t) = side.post(0, buf as *mut u8, 8) {
                break t;
            }
            not_yet();
        };
        while !side.done(t) {
            not_yet();
        }
    };
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..PINGS {
                wait(b_recv, pc);
                wait(b_send, pc);
            }
        });
        for _ in 0..PINGS {
            wait(a_send, pa);
            wait(a_recv, pb);
        }
    });
    start.elapsed().as_secs_f64() * 1e6 / (2 * PINGS) as f64
}

// ----------------------------------------------------------------------------------------
// The plugin, through its C table.

struct PluginSide<'a> {
    lib: &'a PluginLib,
    comm: Ptr,
    send: bool,
    /// Registrations per buffer address and length: a later size's buffer may be allocated
    /// where an earlier, shorter one was, and a send outside its registration is refused.
    mrs: parking_lot::Mutex<Vec<(usize, usize, Ptr)>>,
}

impl PluginSide<'_> {
    fn mr(&self, buf: *mut u8, len: usize) -> Ptr {
        let mut mrs = self.mrs.lock();
        if let Some(&(_, _, m)) = mrs.iter().find(|(a, l, _)| (*a, *l) == (buf as usize, len)) {
            return m;
        }
        // SAFETY: benchmark buffers outlive the run; registrations are never released early.
        let m = unsafe { self.lib.reg_mr(self.comm, buf.cast(), len, PTR_HOST) }.expect("regMr");
        mrs.push((buf as usize, len, m));
        m
    }
}

impl Side for PluginSide<'_> {
    fn post(&self, _slot: usize, buf: *mut u8, len: usize) -> Option<usize> {
        let mh = if len > 8 {
            self.mr(buf, len)
        } else {
            Ptr(std::ptr::null_mut())
        };
        // SAFETY: the buffer stays valid until done() reports the request finished.
        let r = unsafe {
            if self.send {
                self.lib.isend(self.comm, buf.cast(), len as i32, mh)
            } else {
                self.lib.irecv(self.comm, buf.cast(), len as i32, mh)
            }
        }
        .expect("post");
        r.map(|p| p.0 as usize)
    }
    fn done(&self, token: usize) -> bool {
        self.lib
            .test(Ptr(token as *mut c_void))
            .expect("test")
            .is_some()
    }
}

// ----------------------------------------------------------------------------------------
// Raw libfabric: tagged send/recv between two endpoints, completions polled directly.

struct RawSide {
    queue: parking_lot::Mutex<Queue>,
    peer: u64,
    send: bool,
    ops: Vec<Op>,
    next: std::sync::atomic::AtomicU64,
}

impl RawSide {
    fn new(queue: Queue, peer: u64, send: bool) -> Self {
        RawSide {
            queue: parking_lot::Mutex::new(queue),
            peer,
            send,
            ops: (0..IN_FLIGHT).map(|_| Op::default()).collect(),
            next: 0.into(),
        }
    }
    fn progress(&self, queue: &mut Queue) {
        let mut events = Vec::new();
        queue.poll(&mut events).expect("fi_cq_read");
        for e in events {
            match e {
                // SAFETY: contexts are this benchmark's Ops, alive until their completion.
                Event::Done {
                    context, len, tag, ..
                } => unsafe { &*context.cast::<Op>() }.complete(len, tag),
                // SAFETY: as above.
                Event::Failed(f) => unsafe { &*f.context.cast::<Op>() }.fail(f),
            }
        }
    }
}

impl Side for RawSide {
    fn post(&self, slot: usize, buf: *mut u8, len: usize) -> Option<usize> {
        let op = &self.ops[slot];
        let tag = self.next.load(std::sync::atomic::Ordering::Relaxed);
        let mut queue = self.queue.lock();
        op.mark_queued();
        // SAFETY: the buffer and op stay valid until done() saw the completion.
        let ok = unsafe {
            if self.send {
                queue.send(
                    buf.cast(),
                    len,
                    std::ptr::null_mut(),
                    self.peer,
                    tag,
                    op.context(),
                )
            } else {
                let iov = [libc::iovec {
                    iov_base: buf.cast(),
                    iov_len: len,
                }];
                queue.recv(
                    &iov,
                    &mut [std::ptr::null_mut()],
                    nccl_net_fabric::sys::ADDR_UNSPEC,
                    tag,
                    0,
                    op.context(),
                )
            }
        }
        .expect("post");
        if !ok {
            op.reset();
            self.progress(&mut queue);
            return None;
        }
        op.mark_posted();
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(slot)
    }
    fn done(&self, token: usize) -> bool {
        self.progress(&mut self.queue.lock());
        match self.ops[token].status() {
            Status::Done(_) => {
                self.ops[token].reset();
                true
            }
            Status::Failed => panic!("raw operation failed: {:?}", self.ops[token].failure()),
            _ => false,
        }
    }
}

fn raw_endpoints(settings: &Settings) -> ((Arc<Endpoint>, Queue), (Arc<Endpoint>, Queue)) {
    let d = discover(settings).expect("discover");
    let decision = decide(&d.candidates, settings);
    let &first = decision.devices.first().expect("a device");
    let info = d.info(first);
    let fabric = Fabric::open(info).expect("fabric");
    // Each endpoint on a domain of its own, as the plugin opens its lanes: the ratio then
    // measures what the plugin adds, not how it spreads endpoints over domains.
    let a = Endpoint::open(&Domain::open(&fabric, info).expect("domain"), None).expect("endpoint");
    let b = Endpoint::open(&Domain::open(&fabric, info).expect("domain"), None).expect("endpoint");
    (a, b)
}

fn run_one(provider: &str) {
    let settings = Settings::from_env().expect("settings");
    println!(
        "provider {provider}, libfabric {}, {IN_FLIGHT} in flight, one thread per side{}, raw \
         endpoints each on a domain of their own (as the plugin's); plugin: progress threads \
         {}, {} {}",
        version_string(runtime_version()),
        match std::env::var("NFAB_BENCH_YIELD").is_ok() {
            true => " yielding while it waits",
            false => "",
        },
        if settings.progress_thread {
            "yes"
        } else {
            "no"
        },
        nccl_net_fabric::settings::PROGRESS_SPIN_US,
        settings
            .progress_spin
            .map_or("never".into(), |d| d.as_micros().to_string()),
    );

    // Raw libfabric: a sends to b on one pair of endpoints, b answers on another.
    let ((a, aq), (b, bq)) = raw_endpoints(&settings);
    let ((a2, a2q), (b2, b2q)) = raw_endpoints(&settings);
    let b_addr = a.insert(&b.name).expect("av insert");
    let a2_addr = b2.insert(&a2.name).expect("av insert");
    let raw_send = RawSide::new(aq, b_addr, true);
    let raw_recv = RawSide::new(bq, 0, false);
    let raw_back_send = RawSide::new(b2q, a2_addr, true);
    let raw_back_recv = RawSide::new(a2q, 0, false);

    // The plugin through its table.
    let lib = PluginLib::open(&PluginLib::default_path()).expect("load plugin");
    lib.init(false).expect("init");
    let until = Instant::now() + Duration::from_secs(60);
    let (s1, r1) = lib.connect_pair(0, until).expect("connect");
    let (s2, r2) = lib.connect_pair(0, until).expect("connect");
    let side = |comm, send| PluginSide {
        lib: &lib,
        comm,
        send,
        mrs: parking_lot::Mutex::new(Vec::new()),
    };
    let (p_send, p_recv, p_back_send, p_back_recv) = (
        side(s1, true),
        side(r1, false),
        side(s2, true),
        side(r2, false),
    );

    // Warm-up: connections and registrations.
    stream(&raw_send, &raw_recv, 64 << 10);
    stream(&p_send, &p_recv, 64 << 10);

    println!(
        "{:>10} {:>12} {:>12} {:>8} {:>14} {:>14}",
        "size", "raw GB/s", "plugin GB/s", "ratio", "raw CPU-s/GB", "plugin CPU-s/GB"
    );
    let mut ratios = Vec::new();
    // `-- --latency` measures only the ping-pong.
    let sizes: Vec<usize> = if std::env::var("NFAB_BENCH_LATENCY_ONLY").is_ok() {
        Vec::new()
    } else {
        sizes()
    };
    for &len in &sizes {
        let (raw, raw_cpu) = stream(&raw_send, &raw_recv, len);
        let (plugin, plugin_cpu) = stream(&p_send, &p_recv, len);
        ratios.push(plugin / raw);
        println!(
            "{:>10} {:>12.3} {:>12.3} {:>8.2} {:>14.3} {:>14.3}",
            len,
            raw,
            plugin,
            plugin / raw,
            raw_cpu,
            plugin_cpu
        );
    }
    let (mut raw_lat, mut plugin_lat) = (Vec::new(), Vec::new());
    for _ in 0..LATENCY_RUNS {
        raw_lat.push(ping_pong(
            &raw_send,
            &raw_back_recv,
            &raw_back_send,
            &raw_recv,
        ));
        plugin_lat.push(ping_pong(&p_send, &p_back_recv, &p_back_send, &p_recv));
    }
    let spread = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let text = v
            .iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ");
        (v[v.len() / 2], text)
    };
    let ((raw_med, raw_all), (plugin_med, plugin_all)) =
        (spread(&mut raw_lat), spread(&mut plugin_lat));
    println!("8 B half round trip over {LATENCY_RUNS} runs (us, sorted): raw {raw_all}");
    println!("{:>52} plugin {plugin_all}", "");
    println!(
        "8 B half round trip, median: raw {raw_med:.2} us, plugin {plugin_med:.2} us, ratio {:.2}",
        plugin_med / raw_med
    );
    if !ratios.is_empty() {
        let geo = ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64;
        println!(
            "bandwidth ratio plugin/raw, geometric mean over sizes: {:.2}\n",
            geo.exp()
        );
    }
    // Close as NCCL does, so providers release what they hold (shm's /dev/shm files).
    for side in [&p_send, &p_recv, &p_back_send, &p_back_recv] {
        for (_, _, m) in side.mrs.lock().drain(..) {
            lib.dereg_mr(side.comm, m).expect("deregMr");
        }
    }
    for (s, r) in [(s1, r1), (s2, r2)] {
        lib.close_send(s).expect("closeSend");
        lib.close_recv(r).expect("closeRecv");
    }
}

/// Runs each provider's benchmark in a child process of its own (libfabric reads its
/// environment once per process). Arguments name providers; default: every one available.
fn main() {
    if let Ok(p) = std::env::var("NFAB_BENCH_PROVIDER") {
        return run_one(&p);
    }
    let mut providers: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let latency_only = std::env::args().any(|a| a == "--latency");
    let yields = std::env::args().any(|a| a == "--yield");
    if providers.is_empty() {
        providers = vec!["tcp;ofi_rxm".into(), "shm".into()];
        if runtime_version() >= (1 << 16 | 18) {
            providers.push("tcp".into());
        }
    }
    let mut failed = 0;
    for p in providers {
        let status = Command::new(std::env::current_exe().expect("bench binary"))
            .env("NFAB_BENCH_PROVIDER", &p)
            .env("NCCL_FABRIC_PROVIDER", &p)
            .env(
                "NCCL_FABRIC_DOMAINS",
                std::env::var("NCCL_FABRIC_DOMAINS").unwrap_or_else(|_| "lo,shm".into()),
            )
            .env("NCCL_FABRIC_ALLOW_NATIVE_TCP", "yes")
            .envs(latency_only.then_some(("NFAB_BENCH_LATENCY_ONLY", "1")))
            .envs(yields.then_some(("NFAB_BENCH_YIELD", "1")))
            .status()
            .expect("run provider benchmark");
        if !status.success() {
            eprintln!("benchmark for {p} failed: {status}");
            failed += 1;
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
