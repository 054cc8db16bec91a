//! Connection set-up: N processes, each connecting to every other through the plugin's table
//! the way NCCL's ranks do (one listen comm per peer, handles exchanged out of band, connect
//! and accept called without blocking until every comm is up). Prints, per provider and N,
//! the time from "every handle published" to "every rank connected to all others" (the
//! slowest rank), and how it grows with N.
//!
//! `cargo bench --bench connect` (N = 4, 8, 16 on `tcp;ofi_rxm` and `shm`); `-- PROVIDER N…`.

mod common;

use common::{publish, wait_for};
use nccl_net_host::{handle_from_hex, handle_to_hex, PluginLib, Ptr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One rank.
fn rank(dir: &Path, me: usize, n: usize) {
    let until = Instant::now() + Duration::from_secs(120);
    let lib = PluginLib::open_version(&PluginLib::default_path(), 11).expect("load");
    lib.init(false).expect("init");
    let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    // One listen comm per peer; its handle goes to that peer.
    let mut listens = Vec::new();
    for &p in &peers {
        let (h, l) = lib.listen(0).expect("listen");
        publish(
            &dir.join(format!("h-{me}-{p}")),
            &format!("{}\n", handle_to_hex(&h)),
        );
        listens.push(l);
    }
    publish(&dir.join(format!("ready-{me}")), "1\n");
    for p in 0..n {
        wait_for(&dir.join(format!("ready-{p}")), until);
    }
    let started = Instant::now();
    let mut handles: Vec<[u8; 128]> = peers
        .iter()
        .map(|&p| handle_from_hex(&wait_for(&dir.join(format!("h-{p}-{me}")), until)).unwrap())
        .collect();
    let mut sends: Vec<Option<Ptr>> = vec![None; peers.len()];
    let mut recvs: Vec<Option<Ptr>> = vec![None; peers.len()];
    while sends.iter().chain(&recvs).any(Option::is_none) {
        for i in 0..peers.len() {
            if sends[i].is_none() {
                sends[i] = lib.connect(0, &mut handles[i]).expect("connect");
            }
            if recvs[i].is_none() {
                recvs[i] = lib.accept(listens[i]).expect("accept");
            }
        }
        assert!(Instant::now() < until, "rank {me}: not all connected");
    }
    let took = started.elapsed();
    println!("RESULT ms={}", took.as_millis());
    // Keep the comms until everyone is done, so no peer sees its partner close early.
    publish(&dir.join(format!("done-{me}")), "1\n");
    for p in 0..n {
        wait_for(&dir.join(format!("done-{p}")), until);
    }
    for (s, r) in sends.into_iter().zip(recvs) {
        lib.close_send(s.unwrap()).expect("closeSend");
        lib.close_recv(r.unwrap()).expect("closeRecv");
    }
    for l in listens {
        lib.close_listen(l).expect("closeListen");
    }
}

fn run(provider: &str, n: usize) -> Option<u128> {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("nfab-connect-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let children: Vec<Child> = (0..n)
        .map(|me| {
            Command::new(std::env::current_exe().expect("exe"))
                .env("NFAB_CONNECT_RANK", me.to_string())
                .env("NFAB_CONNECT_N", n.to_string())
                .env("NFAB_CONNECT_DIR", &dir)
                .env("NCCL_FABRIC_PROVIDER", provider)
                .env("NCCL_FABRIC_DOMAINS", "lo,shm")
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut slowest = Some(0);
    for c in children {
        let out = c.wait_with_output().expect("wait");
        let ms = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("RESULT ms=")?.parse::<u128>().ok());
        slowest = match (slowest, ms) {
            (Some(a), Some(b)) if out.status.success() => Some(a.max(b)),
            _ => None,
        };
    }
    let _ = std::fs::remove_dir_all(&dir);
    slowest
}

fn main() {
    if let (Ok(me), Ok(n), Ok(dir)) = (
        std::env::var("NFAB_CONNECT_RANK"),
        std::env::var("NFAB_CONNECT_N"),
        std::env::var("NFAB_CONNECT_DIR"),
    ) {
        return rank(Path::new(&dir), me.parse().unwrap(), n.parse().unwrap());
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let providers = match args.first() {
        Some(p) => vec![p.clone()],
        None => vec!["tcp;ofi_rxm".to_string(), "shm".to_string()],
    };
    let sizes: Vec<usize> = match args.get(1..) {
        Some(rest) if !rest.is_empty() => rest.iter().filter_map(|a| a.parse().ok()).collect(),
        _ => vec![4, 8, 16],
    };
    println!("connection set-up, every rank to every other (slowest rank, ms)");
    for p in &providers {
        let mut line = format!("{p:<12}");
        for &n in &sizes {
            match run(p, n) {
                Some(ms) => line += &format!("  N={n}: {ms} ms ({} comms)", n * (n - 1)),
                None => line += &format!("  N={n}: failed"),
            }
        }
        println!("{line}");
    }
}
