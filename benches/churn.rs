//! Communicator churn: two processes create a communicator, move 1 MiB each way through it,
//! and destroy it, K times in a row (40 by default), through the v11 table the way NCCL 2.28
//! does it (init with a context, listen/connect/accept, isend/irecv, close, finalize). Prints
//! the total and the median round per provider, with shared lanes lingering between
//! communicators (the default) and closing with their last comm (`NCCL_FABRIC_LANE_LINGER_MS=0`).
//!
//! `cargo bench --bench churn` (`tcp;ofi_rxm`, `shm`; K = 40); `-- PROVIDER K`.

mod common;

use common::{exchange, publish, wait_for};
use nccl_net_host::{handle_from_hex, handle_to_hex, PluginLib, Ptr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BYTES: usize = 1 << 20;

/// One communicator between the two ranks: connect both ways, 1 MiB each way, close.
fn round(lib: &PluginLib, dir: &Path, me: usize, r: usize, until: Instant) {
    let peer = 1 - me;
    let ctx = lib.init_v11(r as u64, false).expect("init");
    let (h, listen) = lib.listen(0).expect("listen");
    publish(
        &dir.join(format!("h-{r}-{me}")),
        &format!("{}\n", handle_to_hex(&h)),
    );
    let mut theirs =
        handle_from_hex(&wait_for(&dir.join(format!("h-{r}-{peer}")), until)).expect("handle");
    let (mut send, mut recv): (Option<Ptr>, Option<Ptr>) = (None, None);
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = lib.connect(0, &mut theirs).expect("connect");
        }
        if recv.is_none() {
            recv = lib.accept(listen).expect("accept");
        }
        assert!(Instant::now() < until, "round {r}: not connected");
    }
    let (send, recv) = (send.unwrap(), recv.unwrap());
    let mut out = vec![me as u8; BYTES];
    let mut inp = vec![0u8; BYTES];
    assert_eq!(
        exchange(lib, send, recv, &mut out, &mut inp, until),
        BYTES as i32
    );
    assert!(
        inp.iter().all(|&b| b == peer as u8),
        "round {r}: wrong data"
    );
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    lib.close_listen(listen).expect("closeListen");
    lib.finalize_v11(ctx).expect("finalize");
}

fn rank(dir: &Path, me: usize, rounds: usize) {
    let until = Instant::now() + Duration::from_secs(300);
    let lib = PluginLib::open_version(&PluginLib::default_path(), 11).expect("load");
    let mut took = Vec::with_capacity(rounds);
    let start = Instant::now();
    for r in 0..rounds {
        let t = Instant::now();
        round(&lib, dir, me, r, until);
        took.push(t.elapsed());
    }
    let total = start.elapsed();
    took.sort();
    println!(
        "RESULT total_ms={} median_ms={:.2} first_ms={:.2}",
        total.as_millis(),
        took[rounds / 2].as_secs_f64() * 1e3,
        took[0].as_secs_f64() * 1e3
    );
}

/// Runs the two ranks; rank 0's (total, median) in ms.
fn run(provider: &str, rounds: usize, linger: Option<&str>) -> Option<(u128, f64)> {
    let dir: PathBuf = std::env::temp_dir().join(format!("nfab-churn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let children: Vec<_> = (0..2)
        .map(|me| {
            let mut c = Command::new(std::env::current_exe().expect("exe"));
            c.env("NFAB_CHURN_RANK", me.to_string())
                .env("NFAB_CHURN_ROUNDS", rounds.to_string())
                .env("NFAB_CHURN_DIR", &dir)
                .env("NCCL_FABRIC_PROVIDER", provider)
                .env("NCCL_FABRIC_DOMAINS", "lo,shm")
                .stdout(Stdio::piped());
            if let Some(l) = linger {
                c.env("NCCL_FABRIC_LANE_LINGER_MS", l);
            }
            c.spawn().expect("spawn")
        })
        .collect();
    let mut result = None;
    for (me, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().expect("wait");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text.lines().find_map(|l| l.strip_prefix("RESULT "));
        if me == 0 && out.status.success() {
            result = line.and_then(|l| {
                let field = |k: &str| {
                    l.split_whitespace()
                        .find_map(|f| f.strip_prefix(k)?.parse::<f64>().ok())
                };
                Some((field("total_ms=")? as u128, field("median_ms=")?))
            });
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn main() {
    if let (Ok(me), Ok(rounds), Ok(dir)) = (
        std::env::var("NFAB_CHURN_RANK"),
        std::env::var("NFAB_CHURN_ROUNDS"),
        std::env::var("NFAB_CHURN_DIR"),
    ) {
        return rank(
            Path::new(&dir),
            me.parse().unwrap(),
            rounds.parse().unwrap(),
        );
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let providers = match args.first() {
        Some(p) => vec![p.clone()],
        None => vec!["tcp;ofi_rxm".to_string(), "shm".to_string()],
    };
    let rounds = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(40);
    println!(
        "{rounds} communicators one after another, 2 processes, 1 MiB each way per communicator"
    );
    for p in &providers {
        for (label, linger) in [("lanes linger (default)", None), ("linger 0", Some("0"))] {
            match run(p, rounds, linger) {
                Some((total, median)) => {
                    println!("{p:<12} {label:<24} total {total} ms, median round {median:.2} ms")
                }
                None => println!("{p:<12} {label:<24} failed"),
            }
        }
    }
}
