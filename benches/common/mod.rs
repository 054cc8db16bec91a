//! What several benchmarks share: rendezvous through files between the processes of one run,
//! and the process's own memory.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

/// Waits for `path` to hold a whole line (see [`publish`]); fails past `until`. Looks often
/// at first (a peer's answer in a round trip), then every 2 ms (many processes waiting on
/// few cores).
pub fn wait_for(path: &Path, until: Instant) -> String {
    let start = Instant::now();
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            if t.ends_with('\n') {
                return t;
            }
        }
        assert!(Instant::now() < until, "no {}", path.display());
        let nap = match start.elapsed() < Duration::from_millis(10) {
            true => Duration::from_micros(200),
            false => Duration::from_millis(2),
        };
        std::thread::sleep(nap);
    }
}

/// Writes `text` so that readers see it whole (write, then rename).
pub fn publish(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Resident set size of this process, in KiB.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
