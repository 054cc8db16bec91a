//! What an idle communicator costs: CPU seconds per second of wall time (cores) a process
//! spends while a connected pair of comms waits with nothing in flight, and the process's
//! RSS, for each provider, with and without progress threads.
//!
//! `cargo bench --bench idle` (each configuration in its own process; `-- PROVIDER THREADS`
//! runs one). Not a test: the figures depend on the machine.

mod common;

use common::{cpu_seconds, exchange, rss_kib};
use nccl_net_host::PluginLib;
use std::process::Command;
use std::time::{Duration, Instant};

const IDLE: Duration = Duration::from_secs(10);

fn rss_mib() -> u64 {
    rss_kib() / 1024
}

/// In the child: one pair, a few messages, then idle.
fn measure() {
    let lib = PluginLib::open_version(&PluginLib::default_path(), 11).expect("load");
    lib.init(false).expect("init");
    let until = Instant::now() + Duration::from_secs(60);
    let (send, recv) = lib.connect_pair(0, until).expect("connect");
    let mut a = vec![1u8; 1 << 20];
    let mut b = vec![0u8; 1 << 20];
    for _ in 0..8 {
        exchange(&lib, send, recv, &mut a, &mut b, until);
    }
    // Let the progress threads reach their idle state before measuring.
    std::thread::sleep(Duration::from_secs(2));
    let c0 = cpu_seconds();
    std::thread::sleep(IDLE);
    let cores = (cpu_seconds() - c0) / IDLE.as_secs_f64();
    println!("RESULT cores={cores:.4} rss_mib={}", rss_mib());
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if std::env::var("NFAB_IDLE_CHILD").is_ok() {
        return measure();
    }
    let providers = match args.first() {
        Some(p) => vec![p.clone()],
        None => vec!["tcp;ofi_rxm".to_string(), "shm".to_string()],
    };
    let threads = match args.get(1) {
        Some(t) => vec![t.clone()],
        None => vec!["yes".to_string(), "no".to_string()],
    };
    println!(
        "idle communicator: cores used while idle ({} s) and RSS",
        IDLE.as_secs()
    );
    for p in &providers {
        for t in &threads {
            let out = Command::new(std::env::current_exe().expect("exe"))
                .env("NFAB_IDLE_CHILD", "1")
                .env("NCCL_FABRIC_PROVIDER", p)
                .env("NCCL_FABRIC_PROGRESS_THREAD", t)
                .env("NCCL_FABRIC_DOMAINS", "lo,shm")
                .output()
                .expect("run the child");
            let text = String::from_utf8_lossy(&out.stdout);
            let result = text
                .lines()
                .find_map(|l| l.strip_prefix("RESULT "))
                .unwrap_or("failed");
            println!("{p:<12} progress threads {t:<3}: {result}");
        }
    }
}
