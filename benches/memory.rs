//! What lanes cost in memory: a process with 4 comm pairs on device 0, 16 MiB moved through
//! each in 1 MiB messages, with 1 lane and with 4 lanes per direction (progress threads on);
//! resident memory after `init` and after the transfers (freed memory handed back to the
//! kernel first), and the heap in use. The difference between 4 lanes and 1 is 6 endpoints
//! (3 per direction, each in its own libfabric domain): what one more endpoint costs.
//!
//! `cargo bench --bench memory` (`tcp;ofi_rxm`, `shm`); `-- PROVIDER [VAR=VALUE ...]` runs
//! one provider with extra environment (e.g. `FI_OFI_RXM_BUFFER_SIZE=4096`).

mod common;

use common::{exchange, rss_kib};
use nccl_net_host::{PluginLib, Ptr};
use std::process::Command;
use std::time::{Duration, Instant};

const PAIRS: usize = 4;
const MSG: usize = 1 << 20;

/// Resident KiB once the allocator has handed back what is free.
fn settled_rss() -> u64 {
    // SAFETY: malloc_trim only returns free pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    rss_kib()
}

fn heap_kib() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) / 1024
}

fn measure() {
    let lib = PluginLib::open_version(&PluginLib::default_path(), 11).expect("load");
    lib.init(false).expect("init");
    let (rss0, heap0) = (settled_rss(), heap_kib());
    let until = Instant::now() + Duration::from_secs(120);
    let pairs: Vec<(Ptr, Ptr)> = (0..PAIRS)
        .map(|_| lib.connect_pair(0, until).expect("connect"))
        .collect();
    let mut a = vec![1u8; MSG];
    let mut b = vec![0u8; MSG];
    for &(send, recv) in &pairs {
        for _ in 0..16 {
            exchange(&lib, send, recv, &mut a, &mut b, until);
        }
    }
    println!(
        "RESULT init_mib={} pairs_mib={} heap_init_mib={} heap_pairs_mib={}",
        rss0 / 1024,
        settled_rss() / 1024,
        heap0 / 1024,
        heap_kib() / 1024
    );
}

fn field(text: &str, key: &str) -> Option<f64> {
    text.split_whitespace()
        .find_map(|f| f.strip_prefix(key)?.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if std::env::var("NFAB_MEMORY_CHILD").is_ok() {
        return measure();
    }
    let providers = match args.first() {
        Some(p) => vec![p.clone()],
        None => vec!["tcp;ofi_rxm".to_string(), "shm".to_string()],
    };
    let extra: Vec<(String, String)> = args
        .iter()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(k, v)| (k.into(), v.into())))
        .collect();
    println!("memory of {PAIRS} comm pairs, 16 MiB through each (MiB: RSS after init -> after; heap in use)");
    for p in &providers {
        let mut after = Vec::new();
        for lanes in ["1", "4"] {
            let out = Command::new(std::env::current_exe().expect("exe"))
                .env("NFAB_MEMORY_CHILD", "1")
                .env("NCCL_FABRIC_PROVIDER", p)
                .env("NCCL_FABRIC_LANES", lanes)
                .env("NCCL_FABRIC_PROGRESS_THREAD", "yes")
                .env("NCCL_FABRIC_DOMAINS", "lo,shm")
                .envs(extra.iter().map(|(k, v)| (k, v)))
                .output()
                .expect("run the child");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("RESULT "))
                .unwrap_or("failed")
                .to_string();
            println!("{p:<12} {lanes} lane(s): {line}");
            after.push(field(&line, "pairs_mib="));
        }
        if let [Some(one), Some(four)] = after[..] {
            println!(
                "{p:<12} each endpoint beyond the first per direction: {:.1} MiB",
                (four - one) / 6.0
            );
        }
    }
}
