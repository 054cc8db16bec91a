//! How a send comm cuts its long messages, where the settings leave that to the plugin
//! (`NCCL_FABRIC_PIECE_BYTES` unset).
//!
//! Pieces of the agreed size (256 KiB by default) keep what each piece costs low where every
//! connection moves fast: NCCL's 512 KiB steps then go in two pieces. Where the network caps
//! every TCP connection (clouds cap each 5-tuple), what a comm moves is the number of its
//! connections busy at once, so there each message is better cut into as many pieces as the
//! comm has flows, down to [`FINE_PIECE`]. A comm tells the two apart from its own messages:
//! a message that took longer than its largest piece needs at the comm's floor rate (the
//! rate each flow was assumed to carry when the flows were counted, `FLOW_MBPS` of the
//! sizing) says the flows are slower than assumed.
//!
//! Over fast flows, though, pieces cost more than they overlap, and a comm of several flows
//! starts with whole messages on its first flow, cutting them only once those prove slow.
//! Where NCCL's calls drive the flows (no progress threads), each flow's driver runs only
//! when a call comes, so a message in pieces waits on as many turns as it has flows, where a
//! whole message waits on one (both ranks in one process on 2 cores, `benches/transfer.rs`:
//! 512 KiB in pieces over 16 flows moved 0.08-0.2x of raw libfabric, whole 1.3x; with NCCL
//! on the GPU machine, ranks of 2 CPUs, whole messages moved 1.4x the pieces; between two
//! hosts' processes on 2 cores pieces moved 1.1-1.5x, see BENCHMARKS.md). Where progress
//! threads drive them, whole messages moved 1.02-1.14x the pieces in all_reduce at 1 GiB and
//! 1.08-1.14x on average (GPU machine, two calls), at 0.88-0.92x the CPU and 0.6x the RSS
//! (rxm's buffers on one busy endpoint per comm in place of 16), once each channel's first
//! lanes had threads of their own (`lane`). Whole
//! messages queue on that flow one behind the other, so each is timed from when it was
//! posted or the previous one finished, whichever is later, and they are judged
//! [`WHOLE_BATCH`] at a time, by their bytes over the sum of their times: a provider that
//! completes sends once the kernel took them (native `tcp`) completes them in bursts where
//! the connection is capped, one after a long wait and the next at once.
//!
//! [`TO_FINE`] slow messages in a row (pieces), or [`WHOLE_RUN`] slow batches (whole
//! messages), make the comm cut finely; [`TO_COARSE`] fast ones in a row make it cut
//! coarsely again (or send whole messages again; a comm that sent whole messages also tries
//! them again after [`first_probe`] messages cut finely, then after twice as many each time
//! the try proves slow, which one slow batch does, or fewer of its messages where they alone
//! took longer than the batch may). The second run is the
//! longer: small pieces can look fast on a capped connection (a rate limiter lets a burst
//! through after an idle spell, 64 KiB and more on `lo`), while a comm that moves fast and
//! cut finely for a while (the receiver kept it waiting, its connections were being made)
//! loses little.

use parking_lot::Mutex;

/// The smallest piece a comm cuts into where its flows are slow: NCCL's 1 MiB slices (two
/// 512 KiB steps) then go in 32 pieces over the 32 piece flows of the default 33, so that with
/// two slices in flight each flow has the next piece queued when one ends. Over `tcp;ofi_rxm`
/// it lies above the 16 KiB the plugin lets rxm send in segments (`quirks::RXM_DEFAULTS`), so
/// it goes by rendezvous: the receiver reads it once its receive matched, and the send
/// completes when the receiver says so. With rxm's own limit (8 eager buffers, 32 KiB) it went
/// in segments: over 16 connections capped at 100 Mbit/s, NCCL's steps two at a time moved
/// 188-189 MB/s in 32 KiB pieces then (0.94 of the caps), and 144 MB/s in 64 KiB pieces by
/// rendezvous (57 with four steps in flight); over native `tcp` 191 and 192 (each size set as
/// `NCCL_FABRIC_PIECE_BYTES`, BENCHMARKS.md). Where rendezvous loses, see
/// `quirks::RXM_DEFAULTS`.
pub const FINE_PIECE: usize = 32 << 10;

/// Slow messages in a row that make a comm cut finely.
pub const TO_FINE: u32 = 8;

/// Fast messages in a row that make a comm that cuts finely cut coarsely again.
pub const TO_COARSE: u32 = 64;

/// Whole messages judged together, by the bytes they moved over the time they took.
pub const WHOLE_BATCH: u32 = 4;

/// Slow batches of whole messages in a row that make a comm cut finely.
pub const WHOLE_RUN: u32 = 2;

/// Messages a comm that sent whole messages cuts finely before it tries whole ones again,
/// at least; doubled each time the try proves slow, up to [`LAST_PROBE`]. Where NCCL's calls
/// drive the flows, pieces are slow even where the network caps nothing (each waits on its
/// flow's next turn), so a comm that cut finely for a passing reason (its peer was late for
/// a few messages) would never see them fast again; on a network that caps each connection,
/// each try costs one batch ([`WHOLE_BATCH`] messages, fewer where the first ones already
/// took longer than the batch may) at one connection's rate, less often
/// each time. See [`first_probe`].
pub const FIRST_PROBE: u32 = 256;

/// Messages cut finely per flow before the first try of whole messages (see
/// [`first_probe`]).
pub const PROBE_PER_FLOW: u32 = 64;

/// After how many messages cut finely a comm of `flows` flows first tries whole messages
/// again: [`PROBE_PER_FLOW`] per flow, from [`FIRST_PROBE`]. Where the network caps each
/// connection, a try's batch moves at one connection's rate, where its pieces would have
/// moved at all the comm's flows' rates: it costs about `WHOLE_BATCH × flows` messages' time
/// in pieces, so the wait grows with the flows to keep that a small share (4 × 20 of
/// 64 × 20, 6 %). Over 20 flows capped at 100 Mbit/s, a first try after 256 messages took
/// NCCL's steps two at a time from 188-190 MB/s to 146 (`tcp;ofi_rxm`) and 108 (`tcp`) over
/// 256 steps.
pub fn first_probe(flows: usize) -> u32 {
    let flows = u32::try_from(flows).unwrap_or(u32::MAX);
    PROBE_PER_FLOW
        .saturating_mul(flows)
        .clamp(FIRST_PROBE, LAST_PROBE)
}

/// The longest wait between tries of whole messages (see [`FIRST_PROBE`]).
pub const LAST_PROBE: u32 = 1 << 16;

/// Microseconds since the first call: the clock paced sends are timed by.
pub fn now_us() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}

/// How a comm cuts its long messages now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Whole messages on the first flow.
    Whole,
    /// Pieces of the agreed size.
    Coarse,
    /// Pieces of [`FINE_PIECE`], as many as the comm has flows.
    Fine,
}

impl Cut {
    /// For log lines: `whole messages`, `coarsely`, `finely`.
    pub fn text(self) -> &'static str {
        match self {
            Cut::Whole => "whole messages",
            Cut::Coarse => "coarsely",
            Cut::Fine => "finely",
        }
    }
}

/// A send that teaches its comm how fast its flows move: its largest piece, or the whole
/// message, and when it was posted and seen done (`now_us`).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub bytes: usize,
    pub whole: bool,
    pub posted_us: u64,
    pub done_us: u64,
}

/// One send comm's choice of how to cut.
#[derive(Debug)]
pub struct Pace {
    /// The piece size the peers agreed on (0: whole messages).
    agreed: usize,
    /// Bytes per second below which a message counts as slow (0: the comm never adapts).
    floor: u64,
    /// How it cuts while its flows are fast: [`Cut::Whole`] or [`Cut::Coarse`].
    fast: Cut,
    /// The first wait before a try of whole messages ([`first_probe`]).
    first_probe: u32,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    cut: Cut,
    /// Messages in a row that disagreed with how the comm cuts now.
    against: u32,
    /// Times it changed how it cuts.
    changes: u32,
    /// When the last timed whole message was seen done (`now_us`).
    whole_done_us: u64,
    /// The whole messages of the batch so far: how many, their bytes, the microseconds they
    /// took (each from its start: a comm that sat idle between them is not slow).
    batch: (u32, u64, u64),
    /// Messages learned from since it last began to cut finely, and after how many it tries
    /// whole messages again (see [`FIRST_PROBE`]).
    fine_for: u32,
    probe_after: u32,
    /// It sends whole messages again as a try, not yet proved fast.
    probing: bool,
}

impl Pace {
    /// Always pieces of `agreed` bytes at least.
    pub fn fixed(agreed: usize) -> Self {
        Self::new(agreed, 0, Cut::Coarse, 1)
    }

    /// Pieces of `agreed` bytes (or whole messages, with `whole_while_fast`), and pieces of
    /// [`FINE_PIECE`] while the comm's `flows` move less than `floor_mbps` each.
    pub fn adaptive(agreed: usize, floor_mbps: u64, whole_while_fast: bool, flows: usize) -> Self {
        let fast = match whole_while_fast {
            true => Cut::Whole,
            false => Cut::Coarse,
        };
        match agreed > FINE_PIECE {
            true => Self::new(agreed, floor_mbps * 1_000_000 / 8, fast, flows),
            false => Self::fixed(agreed),
        }
    }

    fn new(agreed: usize, floor: u64, fast: Cut, flows: usize) -> Self {
        let first_probe = first_probe(flows);
        Pace {
            agreed,
            floor,
            fast,
            first_probe,
            state: Mutex::new(State {
                cut: fast,
                against: 0,
                changes: 0,
                whole_done_us: 0,
                batch: (0, 0, 0),
                fine_for: 0,
                probe_after: first_probe,
                probing: false,
            }),
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

    /// How it cuts while its flows are fast.
    pub fn when_fast(&self) -> Cut {
        self.fast
    }

    /// How often it changed how it cuts, and how it cuts now.
    pub fn changes(&self) -> (u32, Cut) {
        let s = self.state.lock();
        (s.changes, s.cut)
    }

    /// The smallest piece to cut the next message into (0: whole messages).
    pub fn piece(&self) -> usize {
        match self.state.lock().cut {
            Cut::Whole => 0,
            Cut::Coarse => self.agreed,
            Cut::Fine => FINE_PIECE,
        }
    }

    /// What a send of `len` bytes tells of its flows' speed: `Some((bytes, whole))` to time
    /// it by, its largest piece where it was cut (`largest`), or the whole message where one
    /// that long would have been cut coarsely. Shorter whole messages tell nothing (their time
    /// is latency).
    pub fn times(&self, len: usize, largest: Option<usize>) -> Option<(usize, bool)> {
        match largest {
            _ if !self.adapts() => None,
            Some(size) => Some((size, false)),
            None if len > self.agreed => Some((len, true)),
            None => None,
        }
    }

    /// Learns from a send seen done. `Some(cut)` when the comm changes how it cuts.
    pub fn learn(&self, sample: Sample) -> Option<Cut> {
        if !self.adapts() {
            return None;
        }
        let mut s = self.state.lock();
        let (bytes, micros, run) = match sample.whole {
            true => {
                let start = sample.posted_us.max(s.whole_done_us);
                s.whole_done_us = sample.done_us;
                let (n, bytes, micros) = s.batch;
                let (n, bytes) = (n + 1, bytes + sample.bytes as u64);
                let micros = micros + sample.done_us.saturating_sub(start);
                // A try whose messages so far took longer than the whole batch may at the
                // floor rate ends now: the rest cannot make it fast.
                let hopeless = s.probing
                    && u128::from(micros) * u128::from(self.floor)
                        > u128::from(bytes) * u128::from(WHOLE_BATCH) * 1_000_000 / u128::from(n);
                if n < WHOLE_BATCH && !hopeless {
                    s.batch = (n, bytes, micros);
                    return None;
                }
                s.batch = (0, 0, 0);
                // A try has the comm's slow history behind it: one slow batch ends it.
                (bytes, micros, if s.probing { 1 } else { WHOLE_RUN })
            }
            false => (
                sample.bytes as u64,
                sample.done_us.saturating_sub(sample.posted_us),
                TO_FINE,
            ),
        };
        let slow = bytes.saturating_mul(1_000_000) / micros.max(1) < self.floor;
        if let Some(cut) = self.judge(&mut s, slow, run) {
            if cut == Cut::Fine && s.probing {
                s.probe_after = s.probe_after.saturating_mul(2).min(LAST_PROBE);
            }
            s.probing = false;
            return Some(cut);
        }
        match s.cut {
            Cut::Fine if self.fast == Cut::Whole => {
                s.fine_for += 1;
                if s.fine_for < s.probe_after {
                    return None;
                }
                s.probing = true;
                Some(Self::change(&mut s, Cut::Whole))
            }
            Cut::Whole if sample.whole && !slow => {
                s.probing = false;
                s.probe_after = self.first_probe;
                None
            }
            _ => None,
        }
    }

    /// Counts a message against how it cuts now; `Some(cut)` when a run of `run` slow ones
    /// (or [`TO_COARSE`] fast ones) changes it.
    fn judge(&self, s: &mut State, slow: bool, run: u32) -> Option<Cut> {
        if slow == (s.cut == Cut::Fine) {
            s.against = 0;
            return None;
        }
        let run = match slow {
            true => run,
            false => TO_COARSE,
        };
        s.against += 1;
        if s.against < run {
            return None;
        }
        let cut = match slow {
            true => Cut::Fine,
            false => self.fast,
        };
        Some(Self::change(s, cut))
    }

    fn change(s: &mut State, cut: Cut) -> Cut {
        s.cut = cut;
        s.against = 0;
        s.fine_for = 0;
        s.batch = (0, 0, 0);
        s.changes += 1;
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::{
        first_probe, Cut, Pace, Sample, FINE_PIECE, FIRST_PROBE, LAST_PROBE, PROBE_PER_FLOW,
        TO_COARSE, TO_FINE, WHOLE_BATCH, WHOLE_RUN,
    };
    use std::cell::Cell;
    use std::time::Duration;

    const AGREED: usize = 256 << 10;
    /// The messages sent: 2 MiB, in 8 pieces of the agreed size.
    const MESSAGE: usize = 2 << 20;

    /// `bytes` at `mbps`.
    fn at(bytes: usize, mbps: u64) -> Duration {
        Duration::from_micros(bytes as u64 * 8 / mbps)
    }

    /// A comm and the clock its sends are timed by.
    struct Comm {
        pace: Pace,
        clock: Cell<u64>,
    }

    impl Comm {
        fn new(pace: Pace) -> Self {
            Comm {
                pace,
                clock: Cell::new(1_000),
            }
        }

        /// Sends `n` messages one after another, each taking what `took` says for its
        /// largest piece (the whole message: piece 0): what the comm said it changed to.
        fn send(&self, n: u32, took: impl Fn(usize) -> Duration) -> Vec<Cut> {
            (0..n)
                .filter_map(|_| {
                    let piece = self.pace.piece();
                    let largest = (piece > 0).then_some(piece);
                    let (bytes, whole) = self.pace.times(MESSAGE, largest)?;
                    let posted_us = self.clock.get();
                    let done_us = posted_us + took(piece).as_micros() as u64;
                    self.clock.set(done_us);
                    self.pace.learn(Sample {
                        bytes,
                        whole,
                        posted_us,
                        done_us,
                    })
                })
                .collect()
        }
    }

    /// A piece (or the whole message, piece 0) at `mbps`.
    fn piece_at(mbps: u64) -> impl Fn(usize) -> Duration {
        move |p| match p {
            0 => at(MESSAGE, mbps),
            p => at(p, mbps),
        }
    }

    #[test]
    fn a_run_of_slow_messages_cuts_finer_and_a_longer_run_of_fast_ones_coarser() {
        let comm = Comm::new(Pace::adaptive(AGREED, 500, false, 8));
        let pace = &comm.pace;
        assert_eq!(pace.piece(), AGREED, "coarse until the flows prove slow");
        assert_eq!(comm.send(TO_FINE - 1, piece_at(250)), []);
        assert_eq!(comm.send(1, piece_at(250)), [Cut::Fine]);
        assert_eq!(pace.piece(), FINE_PIECE);
        // Fine pieces at the same cap stay slow, and now and then burst through: nothing
        // changes.
        for _ in 0..10 {
            assert_eq!(comm.send(TO_COARSE / 2, |_| Duration::from_micros(10)), []);
            assert_eq!(comm.send(1, piece_at(250)), []);
        }
        assert_eq!(comm.send(TO_COARSE - 1, piece_at(2000)), []);
        assert_eq!(comm.send(1, piece_at(2000)), [Cut::Coarse]);
        assert_eq!(pace.piece(), AGREED);
        assert_eq!(pace.changes(), (2, Cut::Coarse));
    }

    #[test]
    fn one_message_against_the_run_starts_it_again() {
        let comm = Comm::new(Pace::adaptive(AGREED, 500, false, 8));
        for _ in 0..10 {
            assert_eq!(comm.send(TO_FINE - 1, piece_at(100)), []);
            assert_eq!(
                comm.send(1, piece_at(5000)),
                [],
                "a fast one among slow ones"
            );
        }
        assert_eq!(comm.pace.piece(), AGREED);
    }

    #[test]
    fn whole_while_fast_until_whole_messages_prove_slow_and_again_once_pieces_are_fast() {
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, 8));
        let pace = &comm.pace;
        assert_eq!(pace.piece(), 0, "whole messages while the flows are fast");
        assert_eq!(comm.send(100, piece_at(5000)), []);
        let to_fine = WHOLE_BATCH * WHOLE_RUN;
        assert_eq!(comm.send(to_fine - 1, piece_at(250)), []);
        assert_eq!(comm.send(1, piece_at(250)), [Cut::Fine]);
        assert_eq!(pace.piece(), FINE_PIECE);
        assert_eq!(comm.send(TO_COARSE - 1, piece_at(2000)), []);
        assert_eq!(comm.send(1, piece_at(2000)), [Cut::Whole]);
        assert_eq!(pace.piece(), 0);
        assert_eq!(pace.changes(), (2, Cut::Whole));
    }

    /// Whole messages sent at `times`: (posted, done) in µs, each of [`MESSAGE`] bytes.
    fn whole_at(pace: &Pace, times: impl IntoIterator<Item = (u64, u64)>) -> Vec<Cut> {
        times
            .into_iter()
            .filter_map(|(posted_us, done_us)| {
                pace.learn(Sample {
                    bytes: MESSAGE,
                    whole: true,
                    posted_us,
                    done_us,
                })
            })
            .collect()
    }

    #[test]
    fn whole_messages_queued_together_are_timed_each_from_the_one_before() {
        let pace = Pace::adaptive(AGREED, 500, true, 8);
        // Sixteen messages posted at once on one flow that moves 4 Gbit/s: the last is done
        // sixteen messages' time after its post, but each took one message's time.
        let one = at(MESSAGE, 4000).as_micros() as u64;
        assert_eq!(
            whole_at(&pace, (1..=16).map(|k| (1_000, 1_000 + k * one))),
            []
        );
        assert_eq!(pace.piece(), 0);
    }

    #[test]
    fn whole_messages_are_judged_by_batches() {
        let one = at(MESSAGE, 4000).as_micros() as u64;
        // Completions in bursts (a capped connection under a provider that completes a
        // send once the kernel took it): one after a long wait, the next at once. Each
        // batch is slow, so two batches make it cut finely.
        let pace = Pace::adaptive(AGREED, 500, true, 8);
        let bursts = (0..8u64).map(|k| {
            let t = 1_000 + (k / 2) * 100_000;
            match k % 2 {
                0 => (t, t + 100_000),
                _ => (t + 100, t + 100_000 + 200),
            }
        });
        assert_eq!(whole_at(&pace, bursts), [Cut::Fine]);
        // A fast stream with one stall, and idle spells between its messages: still whole.
        let pace = Pace::adaptive(AGREED, 500, true, 8);
        let stream = (0..64u64).map(|k| {
            let t = 1_000 + k * 1_000_000;
            match k {
                10 => (t, t + 100_000),
                _ => (t, t + one),
            }
        });
        assert_eq!(whole_at(&pace, stream), []);
        assert_eq!(pace.piece(), 0);
    }

    #[test]
    fn a_comm_that_cut_finely_tries_whole_messages_again_less_often_each_time() {
        let flows = 20;
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, flows));
        let pace = &comm.pace;
        let to_fine = WHOLE_BATCH * WHOLE_RUN;
        // Every connection capped at 250 Mbit/s: whole messages and pieces alike are slow.
        let capped = piece_at(250);
        assert_eq!(comm.send(to_fine, &capped), [Cut::Fine]);
        let mut wait = first_probe(flows);
        for _ in 0..4 {
            assert_eq!(comm.send(wait - 1, &capped), []);
            assert_eq!(comm.send(1, &capped), [Cut::Whole], "a try after {wait}");
            assert_eq!(
                comm.send(3, &capped),
                [Cut::Fine],
                "at half the floor, three messages end the try"
            );
            wait *= 2;
        }
        // Uncapped, but pieces slow (NCCL's calls drive the flows), whole messages fast: the
        // next try stays.
        let by_calls = |p: usize| match p {
            0 => at(MESSAGE, 8000),
            p => at(p, 250),
        };
        assert_eq!(comm.send(wait - 1, by_calls), []);
        assert_eq!(comm.send(1, by_calls), [Cut::Whole]);
        assert_eq!(comm.send(1000, by_calls), []);
        assert_eq!(pace.piece(), 0);
        // Pushed to fine pieces again, it tries whole ones after the first wait once more.
        assert_eq!(comm.send(to_fine, &capped), [Cut::Fine]);
        assert_eq!(comm.send(first_probe(flows) - 1, by_calls), []);
        assert_eq!(comm.send(1, by_calls), [Cut::Whole]);
    }

    #[test]
    fn a_try_ends_once_its_first_messages_took_longer_than_a_batch_may() {
        let flows = 4;
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, flows));
        let to_fine = WHOLE_BATCH * WHOLE_RUN;
        assert_eq!(comm.send(to_fine, piece_at(100)), [Cut::Fine]);
        assert_eq!(comm.send(first_probe(flows) - 1, piece_at(100)), []);
        assert_eq!(comm.send(1, piece_at(100)), [Cut::Whole]);
        // At a fifth of the floor, one whole message takes longer than four may.
        assert_eq!(comm.send(1, piece_at(100)), [Cut::Fine], "ended after one");
        // At half the floor, the third message is past four at the floor.
        assert_eq!(comm.send(2 * first_probe(flows) - 1, piece_at(250)), []);
        assert_eq!(comm.send(1, piece_at(250)), [Cut::Whole]);
        assert_eq!(comm.send(2, piece_at(250)), []);
        assert_eq!(
            comm.send(1, piece_at(250)),
            [Cut::Fine],
            "ended after three"
        );
        // The first whole messages, not a try, are judged in whole batches.
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, flows));
        assert_eq!(comm.send(to_fine - 1, piece_at(100)), []);
        assert_eq!(comm.send(1, piece_at(100)), [Cut::Fine]);
    }

    #[test]
    fn the_first_try_waits_longer_the_more_flows_a_comm_has() {
        assert_eq!(first_probe(1), FIRST_PROBE);
        assert_eq!(first_probe(4), FIRST_PROBE);
        assert_eq!(first_probe(20), 20 * PROBE_PER_FLOW);
        assert_eq!(first_probe(32), 32 * PROBE_PER_FLOW);
        assert_eq!(first_probe(usize::MAX), LAST_PROBE);
    }

    #[test]
    fn comms_that_cut_coarsely_while_fast_never_try_whole_messages() {
        let comm = Comm::new(Pace::adaptive(AGREED, 500, false, 8));
        assert_eq!(comm.send(TO_FINE, piece_at(250)), [Cut::Fine]);
        assert_eq!(comm.send(4 * LAST_PROBE, piece_at(250)), []);
        assert_eq!(comm.pace.piece(), FINE_PIECE);
    }

    #[test]
    fn short_messages_and_set_sizes_teach_nothing() {
        for pace in [
            Pace::fixed(AGREED),
            Pace::adaptive(FINE_PIECE, 500, false, 8),
            Pace::adaptive(0, 500, true, 8),
        ] {
            let comm = Comm::new(pace);
            let agreed = comm.pace.piece();
            assert_eq!(comm.send(2 * TO_FINE, |_| Duration::from_secs(1)), []);
            assert_eq!(comm.pace.piece(), agreed);
            assert!(!comm.pace.adapts());
        }
        let pace = Pace::adaptive(AGREED, 500, true, 8);
        assert_eq!(pace.times(AGREED, None), None, "not longer than a piece");
        assert_eq!(pace.times(AGREED + 1, None), Some((AGREED + 1, true)));
        assert_eq!(pace.times(MESSAGE, Some(AGREED)), Some((AGREED, false)));
    }
}
