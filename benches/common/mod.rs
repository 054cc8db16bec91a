//! What several benchmarks share: rendezvous through files between the processes of one run,
//! one message each way through a comm pair, and the process's own memory and CPU time.
#![allow(dead_code)]

use nccl_net_host::{PluginLib, Ptr};
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

/// Receives `inp.len()` bytes on `recv` while sending `out` on `send` (the receive posted
/// first), and waits for both; returns the received size.
pub fn exchange(
    lib: &PluginLib,
    send: Ptr,
    recv: Ptr,
    out: &mut [u8],
    inp: &mut [u8],
    until: Instant,
) -> i32 {
    let null = Ptr(std::ptr::null_mut());
    // SAFETY: both buffers outlive the requests, waited for before returning.
    let (r, s) = unsafe {
        let r = lib
            .irecv_until(recv, inp.as_mut_ptr().cast(), inp.len() as i32, null, until)
            .expect("irecv");
        let s = lib
            .isend_until(send, out.as_mut_ptr().cast(), out.len() as i32, null, until)
            .expect("isend");
        (r, s)
    };
    lib.wait(s, until).expect("send done");
    lib.wait(r, until).expect("recv done")
}

/// CPU seconds (user and system) this process has used so far, all its threads.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}
