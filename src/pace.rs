//! How finely a send comm cuts its long messages, where the settings leave that to the
//! plugin (`NCCL_FABRIC_PIECE_BYTES` unset).
//!
//! Pieces of the agreed size (256 KiB by default) keep what each piece costs low where every
//! connection moves fast: NCCL's 512 KiB steps then go in two pieces. Where the network caps
//! every TCP connection (clouds cap each 5-tuple), what a comm moves is the number of its
//! connections busy at once, so there each message is better cut into as many pieces as the
//! comm has flows, down to [`FINE_PIECE`]. A comm tells the two apart from its own messages:
//! a message in pieces that took longer than its largest piece needs at the comm's floor
//! rate (the rate each flow was assumed to carry when the flows were counted, `FLOW_MBPS` of
//! the sizing) says the flows are slower than assumed.
//!
//! [`TO_FINE`] such messages in a row make the comm cut finely; [`TO_COARSE`] faster ones in
//! a row make it cut coarsely again. The second run is the longer: small pieces can look
//! fast on a capped connection (a rate limiter lets a burst through after an idle spell,
//! 64 KiB and more on `lo`), while a comm that moves fast and cut finely for a while (the
//! receiver kept it waiting, its connections were being made) loses little.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// The smallest piece a comm cuts into where its flows are slow: NCCL's own Socket
/// transport cuts no finer (its 64 KiB minimum chunk).
pub const FINE_PIECE: usize = 64 << 10;

/// Slow messages in a row that make a comm cut finely.
pub const TO_FINE: u32 = 8;

/// Fast messages in a row that make a comm that cuts finely cut coarsely again.
pub const TO_COARSE: u32 = 64;

/// Microseconds since the first call: the clock paced sends are timed by.
pub fn now_us() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}

/// One send comm's choice of piece size.
#[derive(Debug)]
pub struct Pace {
    /// The piece size the peers agreed on (0: whole messages).
    agreed: usize,
    /// Bytes per second below which a piece counts as slow (0: the comm never adapts).
    floor: u64,
    /// Cutting finely now.
    fine: AtomicBool,
    /// Messages in a row that disagreed with how the comm cuts now.
    against: AtomicU32,
    /// Times it changed how it cuts.
    changes: AtomicU32,
}

impl Pace {
    /// Always pieces of `agreed` bytes at least.
    pub fn fixed(agreed: usize) -> Self {
        Self::new(agreed, 0)
    }

    /// Pieces of `agreed` bytes, or of [`FINE_PIECE`] while the flows move less than
    /// `floor_mbps` each.
    pub fn adaptive(agreed: usize, floor_mbps: u64) -> Self {
        match agreed > FINE_PIECE {
            true => Self::new(agreed, floor_mbps * 1_000_000 / 8),
            false => Self::fixed(agreed),
        }
    }

    fn new(agreed: usize, floor: u64) -> Self {
        Pace {
            agreed,
            floor,
            fine: AtomicBool::new(false),
            against: AtomicU32::new(0),
            changes: AtomicU32::new(0),
        }
    }

    /// The piece size the peers agreed on (0: whole messages).
    pub fn agreed(&self) -> usize {
        self.agreed
    }

    /// Whether it may change how it cuts.
    pub fn adapts(&self) -> bool {
        self.floor > 0
    }

    /// How often it changed how it cuts, and whether it cuts finely now.
    pub fn changes(&self) -> (u32, bool) {
        (
            self.changes.load(Ordering::Relaxed),
            self.fine.load(Ordering::Relaxed),
        )
    }

    /// The smallest piece to cut the next message into (0: whole messages).
    pub fn piece(&self) -> usize {
        match self.fine.load(Ordering::Relaxed) {
            true => FINE_PIECE,
            false => self.agreed,
        }
    }

    /// Learns from a message whose largest piece was `piece` bytes and that took `took`
    /// from its post to its end. `Some(fine)` when the comm changes how it cuts.
    pub fn learn(&self, piece: usize, took: Duration) -> Option<bool> {
        if !self.adapts() {
            return None;
        }
        let micros = took.as_micros().max(1) as u64;
        let slow = (piece as u64).saturating_mul(1_000_000) / micros < self.floor;
        if slow == self.fine.load(Ordering::Relaxed) {
            self.against.store(0, Ordering::Relaxed);
            return None;
        }
        let run = match slow {
            true => TO_FINE,
            false => TO_COARSE,
        };
        if self.against.fetch_add(1, Ordering::Relaxed) + 1 < run {
            return None;
        }
        self.against.store(0, Ordering::Relaxed);
        self.fine.store(slow, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Relaxed);
        Some(slow)
    }
}

#[cfg(test)]
mod tests {
    use super::{Pace, FINE_PIECE, TO_COARSE, TO_FINE};
    use std::time::Duration;

    const AGREED: usize = 256 << 10;

    /// A 256 KiB piece at `mbps`.
    fn at(mbps: u64) -> Duration {
        Duration::from_micros(AGREED as u64 * 8 / mbps)
    }

    /// Sends `n` messages, each taking what `took` says for its piece size: what the comm
    /// said it changed to, in order.
    fn send(pace: &Pace, n: u32, took: impl Fn(usize) -> Duration) -> Vec<bool> {
        (0..n)
            .filter_map(|_| {
                let piece = pace.piece();
                pace.learn(piece, took(piece))
            })
            .collect()
    }

    #[test]
    fn a_run_of_slow_messages_cuts_finer_and_a_longer_run_of_fast_ones_coarser() {
        let pace = Pace::adaptive(AGREED, 500);
        assert_eq!(pace.piece(), AGREED, "coarse until the flows prove slow");
        assert_eq!(send(&pace, TO_FINE - 1, |_| at(250)), []);
        assert_eq!(send(&pace, 1, |_| at(250)), [true]);
        assert_eq!(pace.piece(), FINE_PIECE);
        // Fine pieces at the same cap stay slow, and now and then burst through: nothing
        // changes.
        for _ in 0..10 {
            assert_eq!(
                send(&pace, TO_COARSE / 2, |_| Duration::from_micros(10)),
                []
            );
            assert_eq!(
                send(&pace, 1, |p| at(250) * (p as u32) / (AGREED as u32)),
                []
            );
        }
        assert_eq!(send(&pace, TO_COARSE - 1, |_| at(8000) / 4), []);
        assert_eq!(send(&pace, 1, |_| at(8000) / 4), [false]);
        assert_eq!(pace.piece(), AGREED);
    }

    #[test]
    fn one_message_against_the_run_starts_it_again() {
        let pace = Pace::adaptive(AGREED, 500);
        for _ in 0..10 {
            assert_eq!(send(&pace, TO_FINE - 1, |_| at(100)), []);
            assert_eq!(
                send(&pace, 1, |_| at(5000)),
                [],
                "a fast one among slow ones"
            );
        }
        assert_eq!(pace.piece(), AGREED);
    }

    #[test]
    fn set_sizes_and_small_ones_never_change() {
        for pace in [
            Pace::fixed(AGREED),
            Pace::adaptive(FINE_PIECE, 500),
            Pace::adaptive(0, 500),
        ] {
            let agreed = pace.piece();
            assert_eq!(send(&pace, 2 * TO_FINE, |_| at(1)), []);
            assert_eq!(pace.piece(), agreed);
            assert!(!pace.adapts());
        }
    }
}
