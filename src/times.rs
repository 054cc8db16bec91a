//! Where requests spend their time inside the plugin (`NCCL_FABRIC_TIMES=yes`): from NCCL's
//! isend/irecv until the driver has handed the last of its pieces to the provider, from there
//! until the provider completed the last of them, and from there until NCCL's `test` saw the
//! request done. Each comm sums those over its requests and says so when it closes. Off by
//! default: the clock is read only when it is on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);

/// Turns the clock readings on or off (at init).
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether requests are timed.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Nanoseconds since the first reading in this process (never 0), when timing is on; 0 when
/// it is off.
pub fn stamp() -> u64 {
    if !on() {
        return 0;
    }
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// One comm's sums.
#[derive(Default)]
pub struct Times {
    requests: AtomicU64,
    bytes: AtomicU64,
    to_provider: AtomicU64,
    in_provider: AtomicU64,
    to_nccl: AtomicU64,
}

impl Times {
    /// A request of `bytes` done: posted by NCCL at `posted`, its last piece taken by the
    /// provider at `taken` and completed at `completed`, seen done by NCCL at `seen` (stamps;
    /// one that is 0 was not read, and the request is not counted).
    pub fn add(&self, bytes: usize, posted: u64, taken: u64, completed: u64, seen: u64) {
        if posted == 0 || taken < posted || completed < taken || seen < completed {
            return;
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.to_provider
            .fetch_add(taken - posted, Ordering::Relaxed);
        self.in_provider
            .fetch_add(completed - taken, Ordering::Relaxed);
        self.to_nccl.fetch_add(seen - completed, Ordering::Relaxed);
    }

    /// What the sums say, if any request was timed.
    pub fn text(&self) -> Option<String> {
        let n = self.requests.load(Ordering::Relaxed);
        if n == 0 {
            return None;
        }
        let phases = [
            self.to_provider.load(Ordering::Relaxed),
            self.in_provider.load(Ordering::Relaxed),
            self.to_nccl.load(Ordering::Relaxed),
        ];
        let total = phases.iter().sum::<u64>().max(1);
        let [a, b, c] =
            phases.map(|p| (p as f64 / n as f64 / 1e3, 100.0 * p as f64 / total as f64));
        Some(format!(
            "{n} requests, {:.1} MiB on average; of their time from NCCL's call to its test \
             seeing them done, {:.1} µs ({:.0} %) until the provider had every piece, {:.1} µs \
             ({:.0} %) in the provider, {:.1} µs ({:.0} %) until NCCL's test",
            self.bytes.load(Ordering::Relaxed) as f64 / n as f64 / (1 << 20) as f64,
            a.0,
            a.1,
            b.0,
            b.1,
            c.0,
            c.1
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_split_a_request_into_its_three_phases() {
        let t = Times::default();
        assert!(t.text().is_none());
        t.add(1 << 20, 1_000, 3_000, 10_000, 11_000);
        t.add(1 << 20, 0, 3_000, 10_000, 11_000);
        t.add(1 << 20, 5_000, 3_000, 10_000, 11_000);
        let text = t.text().unwrap();
        assert!(text.starts_with("1 requests, 1.0 MiB"), "{text}");
        assert!(
            text.contains("2.0 µs (20 %)")
                && text.contains("7.0 µs (70 %)")
                && text.contains("1.0 µs (10 %)"),
            "{text}"
        );
    }
}
