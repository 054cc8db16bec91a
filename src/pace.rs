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
//! messages), make the comm cut finely; for a comm that cuts coarsely while fast,
//! [`TO_COARSE`] fast ones in a row make it cut coarsely again. The second run is the
//! longer: small pieces can look fast on a capped connection (a rate limiter lets a burst
//! through after an idle spell, 64 KiB and more on `lo`), while a comm that moves fast and
//! cut finely for a while (the receiver kept it waiting, its connections were being made)
//! loses little.
//!
//! A comm that sends whole messages while fast decides between the two by tries, since the
//! floor alone cannot tell: where the network caps each connection above it (clouds cap each
//! flow at 5-10 Gbit/s), whole messages look fast by the floor and move one connection's
//! worth. After [`FIRST_FINE_PROBE`] whole messages in a row slower than
//! [`TRY_PIECES_BELOW_MBPS`] (a faster batch starts the count again; longer messages count
//! by their bytes, [`FINE_PROBE_BYTES_EACH`]) it tries pieces,
//! meters [`FINE_BATCH`] messages after the first [`FINE_SETTLE`], and keeps them where they
//! moved more than [`WIN`] times those whole batches together (over 20 connections capped
//! at 1 Gbit/s each, 1 MiB messages two in flight moved 461-861 MB/s over `tcp;ofi_rxm` and
//! 769-1029 over `tcp` in four runs, where whole messages had kept it at 387 and 432, 2-core
//! machine).
//! Each try that loses doubles the wait for the next, up to [`LAST_PROBE`]. Pieces that each move
//! the floor rate no longer bring whole messages back by themselves: a try of whole
//! messages after [`first_probe`] messages in pieces does, then after twice as many each
//! time the try loses, which one batch slower than the floor or than the pieces' last
//! batch (by [`WIN`]) does, or fewer of its messages where they alone took longer than the
//! batch may.

use parking_lot::Mutex;

/// The smallest piece a comm cuts into where its flows are slow: NCCL's 1 MiB slices (two
/// 512 KiB steps) then go in 32 pieces over the 32 piece flows of the default 33, so that with
/// two slices in flight each flow has the next piece queued when one ends. Over `tcp;ofi_rxm`
/// it fits one of the eager buffers the plugin gives rxm (`quirks::RXM_DEFAULTS`), so it
/// leaves with its send, with no rendezvous round trip. In 4 KiB segments (rxm's own buffers
/// and limit) over 16 connections capped at 100 Mbit/s, NCCL's steps two at a time moved
/// 188-189 MB/s in 32 KiB pieces (0.94 of the caps), and 144 MB/s in 64 KiB pieces by
/// rendezvous (57 with four steps in flight); over native `tcp` 191 and 192 (each size set as
/// `NCCL_FABRIC_PIECE_BYTES`, BENCHMARKS.md).
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

/// Whole messages a comm of several flows sends before it first tries pieces over all of
/// them (doubled each time the try loses, up to [`LAST_PROBE`]; see [`Pace::learn`]). Where
/// the network caps each connection at more than the floor rate (clouds cap each flow at
/// several Gbit/s), whole messages look fast by the floor, and only such a try shows that
/// pieces over every flow move more.
pub const FIRST_FINE_PROBE: u32 = 32;

/// The bytes each of the whole messages a try of pieces waits for stands for: a run of
/// longer messages leads to a try once it moved as many bytes as that many messages of this
/// size would, in [`WHOLE_RUN`] batches at least. NCCL's messages are slices of 1 MiB at
/// most, so under NCCL the count decides; a stream of 8 MiB messages over connections
/// capped at 1 Gbit/s each waits 8 of them (0.5 s) in place of 32 (2.1 s: in a stream of 64,
/// 2-core machine, the try came so late that the stream moved 235 MB/s where pieces move
/// 1830 over `tcp;ofi_rxm`).
pub const FINE_PROBE_BYTES_EACH: u64 = 2 << 20;

/// Whole messages moving less than this (Mbit/s), in a row, lead to a try of pieces: clouds cap
/// each connection at 5-10 Gbit/s, and one connection the network leaves alone moves more
/// (13-16 Gbit/s over a veth on the 2-core machine, 23-27 over `lo` on the GPU machine).
/// Faster whole messages are left alone: there a message in pieces may finish sooner by
/// itself (several threads copy its pieces at once) while NCCL's transfers as a whole move
/// less (GPU machine, all_reduce 1 MiB-1 GiB: 0.84x on average with tries at any rate; and
/// one batch that stalled, followed by a try that beat it, took 512 MiB from 78 to 142 ms).
pub const TRY_PIECES_BELOW_MBPS: u64 = 10_000;

/// Messages in pieces a try lets pass before it meters any: the first ones make the flows'
/// connections, or were posted whole.
pub const FINE_SETTLE: u32 = 4;

/// Messages in pieces metered together, by the bytes they moved over the time they took (each
/// from when it was posted or the one before it finished, whichever is later).
pub const FINE_BATCH: u32 = 8;

/// How much more pieces must move than whole messages for a comm to keep them: a try of
/// pieces wins at more than `WIN.0 / WIN.1` times the whole messages' rate, and a try of
/// whole messages loses at less than `WIN.1 / WIN.0` times the pieces' (whole messages cost
/// less CPU and memory where both move alike).
pub const WIN: (u64, u64) = (5, 4);

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

/// Why a comm changed how it cuts, or kept it after a try (see [`Pace::learn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Its messages moved less than the floor rate: finely.
    Slow,
    /// Its pieces moved more than the floor rate again: coarsely (comms that cut coarsely
    /// while fast).
    Fast,
    /// A try of the other cut, after a while in this one.
    Try,
    /// A try of whole messages moved less than the floor rate, or than the comm's pieces had
    /// (by [`WIN`]): finely again.
    WholeMovedLess,
    /// A try of pieces moved more than whole messages had (by [`WIN`]): it keeps them (the
    /// cut does not change).
    PiecesMovedMore,
    /// A try of pieces moved no more than whole messages had (by [`WIN`]): whole again.
    PiecesMovedNoMore,
}

/// What [`Pace::learn`] reports: the cut now and why, and for the verdict of a try of
/// pieces, the pieces' and the whole messages' rates (bytes per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub cut: Cut,
    pub why: Why,
    pub rates: Option<(u64, u64)>,
}

/// A send that teaches its comm how fast its flows move: its largest piece, or the whole
/// message (`bytes`), the message's length (`len`), and when it was posted and seen done
/// (`now_us`).
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub bytes: usize,
    pub len: usize,
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
    /// The whole messages of the batch so far.
    batch: Meter,
    /// Messages learned from since it last began to cut finely, and after how many it tries
    /// whole messages again (see [`FIRST_PROBE`]).
    fine_for: u32,
    probe_after: u32,
    /// It sends whole messages again as a try, not yet proved fast.
    probing: bool,
    /// The bytes and microseconds of the batches of whole messages counted towards a try of
    /// pieces (see [`Pace::run_rate`]), and the last rate (bytes per second) of a batch of
    /// pieces (0: none yet).
    whole_run: (u64, u64),
    fine_rate: u64,
    /// The messages in pieces of the batch so far.
    fine_batch: Meter,
    /// Messages in pieces still to pass before the meter counts them ([`FINE_SETTLE`]).
    settle: u32,
    /// Whole messages learned from since it last began to send them, and after how many it
    /// tries pieces (see [`FIRST_FINE_PROBE`]).
    whole_for: u32,
    fine_probe_after: u32,
    /// It cuts finely as a try, not yet proved to move more.
    trying_fine: bool,
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
                batch: Meter::default(),
                fine_for: 0,
                probe_after: first_probe,
                probing: false,
                whole_run: (0, 0),
                fine_rate: 0,
                fine_batch: Meter::default(),
                settle: 0,
                whole_for: 0,
                fine_probe_after: FIRST_FINE_PROBE,
                trying_fine: false,
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

    /// Learns from a send seen done: `Some(change)` when the comm changes how it cuts, or
    /// when a try of pieces proved that they move more (the cut stays).
    ///
    /// Whole messages are judged in batches against the floor rate. A comm that sends them
    /// (one of several flows) also tries pieces over all its flows once it has sent
    /// [`FIRST_FINE_PROBE`] whole in a row slower than [`TRY_PIECES_BELOW_MBPS`] (or their
    /// bytes in longer ones, [`FINE_PROBE_BYTES_EACH`]), then less
    /// often each time the try loses: pieces metered at more than [`WIN`] times those
    /// batches together keep it cutting finely.
    /// One that cuts finely tries whole messages after [`first_probe`] messages in pieces;
    /// they lose where slower than the floor or than its pieces (by [`WIN`]).
    pub fn learn(&self, sample: Sample) -> Option<Change> {
        if !self.adapts() {
            return None;
        }
        let mut s = self.state.lock();
        if !sample.whole && self.fast == Cut::Whole && s.cut == Cut::Fine {
            if let Some(change) = self.meter_fine(&mut s, sample) {
                return Some(change);
            }
        }
        let (bytes, micros, run, n) = match sample.whole {
            true => {
                s.batch
                    .add(sample.bytes as u64, sample.posted_us, sample.done_us);
                // A try whose messages so far took longer than the whole batch may at the
                // rate it must reach ends now: the rest cannot make it fast.
                let bar = self.bar(&s);
                let hopeless = s.probing && s.batch.past(bar, WHOLE_BATCH);
                if s.batch.n < WHOLE_BATCH && !hopeless {
                    return None;
                }
                let (n, bytes, micros) = s.batch.take();
                // A try has the comm's slow history behind it: one slow batch ends it.
                let run = if s.probing { 1 } else { WHOLE_RUN };
                (bytes, micros, run, n)
            }
            false => (
                sample.bytes as u64,
                sample.done_us.saturating_sub(sample.posted_us),
                TO_FINE,
                1,
            ),
        };
        let rate = per_second(bytes, micros);
        let bar = match sample.whole {
            true => self.bar(&s),
            false => self.floor,
        };
        let slow = rate < bar;
        if let Some(cut) = self.judge(&mut s, slow, run) {
            let why = match (cut, s.probing) {
                (Cut::Fine, true) => Why::WholeMovedLess,
                (Cut::Fine, false) => Why::Slow,
                _ => Why::Fast,
            };
            if cut == Cut::Fine && s.probing {
                s.probe_after = s.probe_after.saturating_mul(2).min(LAST_PROBE);
            }
            s.probing = false;
            return Some(Change::to(cut, why));
        }
        match s.cut {
            Cut::Fine if self.fast == Cut::Whole && !s.trying_fine => {
                s.fine_for += 1;
                if s.fine_for < s.probe_after {
                    return None;
                }
                s.probing = true;
                Some(Change::to(Self::change(&mut s, Cut::Whole), Why::Try))
            }
            Cut::Whole if sample.whole && !slow => {
                let fast = rate >= TRY_PIECES_BELOW_MBPS * 1_000_000 / 8;
                if s.probing {
                    // Whole messages move as much as pieces did again: pieces are tried
                    // again after the first wait.
                    s.fine_probe_after = FIRST_FINE_PROBE;
                }
                s.probing = false;
                s.probe_after = self.first_probe;
                // Only a run of such batches leads to a try: one that stalled among fast
                // ones says nothing of a cap.
                match fast {
                    true => (s.whole_for, s.whole_run) = (0, (0, 0)),
                    false => {
                        s.whole_for = s.whole_for.saturating_add(n);
                        s.whole_run.0 = s.whole_run.0.saturating_add(bytes);
                        s.whole_run.1 = s.whole_run.1.saturating_add(micros);
                    }
                }
                if !Self::run_is_long(&s) {
                    return None;
                }
                s.trying_fine = true;
                Some(Change::to(Self::change(&mut s, Cut::Fine), Why::Try))
            }
            _ => None,
        }
    }

    /// The rate below which whole messages are slow: the floor, and for a try of them also
    /// the comm's pieces' last rate (by [`WIN`]).
    fn bar(&self, s: &State) -> u64 {
        match s.probing {
            true => self.floor.max(s.fine_rate.saturating_mul(WIN.1) / WIN.0),
            false => self.floor,
        }
    }

    /// Meters a message sent in pieces by a comm that sends whole messages while they are
    /// fast: `Some(change)` with the verdict of a try of pieces.
    fn meter_fine(&self, s: &mut State, sample: Sample) -> Option<Change> {
        // Shorter messages go whole where the comm sends whole messages: they tell nothing
        // of how the two compare.
        if sample.len <= self.agreed {
            return None;
        }
        if s.settle > 0 {
            s.settle -= 1;
            s.fine_batch.pass(sample.done_us);
            return None;
        }
        s.fine_batch
            .add(sample.len as u64, sample.posted_us, sample.done_us);
        // A try whose messages so far took longer than the batch may at the rate it must
        // beat ends now.
        let whole = Self::run_rate(s);
        let beat = whole.saturating_mul(WIN.0) / WIN.1;
        let hopeless = s.trying_fine && s.fine_batch.past(beat, FINE_BATCH);
        if s.fine_batch.n < FINE_BATCH && !hopeless {
            return None;
        }
        let (_, bytes, micros) = s.fine_batch.take();
        let rate = per_second(bytes, micros);
        s.fine_rate = rate;
        if !std::mem::take(&mut s.trying_fine) {
            return None;
        }
        let rates = Some((rate, whole));
        if rate > beat {
            s.fine_probe_after = FIRST_FINE_PROBE;
            s.probe_after = self.first_probe;
            return Some(Change {
                cut: Cut::Fine,
                why: Why::PiecesMovedMore,
                rates,
            });
        }
        s.fine_probe_after = s.fine_probe_after.saturating_mul(2).min(LAST_PROBE);
        Some(Change {
            cut: Self::change(s, Cut::Whole),
            why: Why::PiecesMovedNoMore,
            rates,
        })
    }

    /// Whether the run of slow whole messages is long enough for a try of pieces: as many
    /// messages as the comm waits for now, or their bytes in [`FINE_PROBE_BYTES_EACH`]
    /// (in [`WHOLE_RUN`] batches at least).
    fn run_is_long(s: &State) -> bool {
        let bytes = u64::from(s.fine_probe_after).saturating_mul(FINE_PROBE_BYTES_EACH);
        s.whole_for >= s.fine_probe_after
            || (s.whole_for >= WHOLE_RUN * WHOLE_BATCH && s.whole_run.0 >= bytes)
    }

    /// The rate (bytes per second) of the run of whole messages a try of pieces must beat:
    /// their bytes over their time, all batches together, so that neither one that stalled
    /// nor one a rate limiter let through in a burst decides.
    fn run_rate(s: &State) -> u64 {
        per_second(s.whole_run.0, s.whole_run.1)
    }

    /// Counts a message against how it cuts now; `Some(cut)` when a run of `run` slow ones
    /// (or [`TO_COARSE`] fast ones) changes it. A comm that sends whole messages while fast
    /// leaves pieces only by a try of whole messages: pieces that each move the floor rate
    /// may still move more together than one flow does whole.
    fn judge(&self, s: &mut State, slow: bool, run: u32) -> Option<Cut> {
        let stays = slow == (s.cut == Cut::Fine) || (!slow && self.fast == Cut::Whole);
        if stays {
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
        s.whole_for = 0;
        if cut == Cut::Whole {
            // A new run of whole messages; a try of pieces keeps the run to beat.
            s.whole_run = (0, 0);
        }
        s.batch.take();
        s.fine_batch.take();
        s.settle = FINE_SETTLE;
        s.changes += 1;
        cut
    }
}

/// Messages timed together, each from when it was posted or the one before it was seen done,
/// whichever is later: a comm that sat idle between them is not slow, and messages queued
/// together each take their own time.
#[derive(Debug, Default)]
struct Meter {
    /// How many, their bytes, the microseconds they took.
    n: u32,
    bytes: u64,
    micros: u64,
    /// When the last one was seen done (`now_us`); kept from one batch to the next.
    done_us: u64,
}

impl Meter {
    /// Adds a message of `bytes` posted and seen done at those times.
    fn add(&mut self, bytes: u64, posted_us: u64, done_us: u64) {
        let start = posted_us.max(self.done_us);
        self.pass(done_us);
        self.n += 1;
        self.bytes += bytes;
        self.micros += done_us.saturating_sub(start);
    }

    /// A message seen done at `done_us` that is not counted: the next one is timed from it.
    fn pass(&mut self, done_us: u64) {
        self.done_us = done_us;
    }

    /// Whether the messages so far took longer than `batch` of them may at `rate` (bytes per
    /// second): the rest cannot bring the batch to that rate.
    fn past(&self, rate: u64, batch: u32) -> bool {
        u128::from(self.micros) * u128::from(rate)
            > u128::from(self.bytes) * u128::from(batch) * 1_000_000 / u128::from(self.n.max(1))
    }

    /// The batch so far (how many, bytes, microseconds), and a new one begun.
    fn take(&mut self) -> (u32, u64, u64) {
        let batch = (self.n, self.bytes, self.micros);
        (self.n, self.bytes, self.micros) = (0, 0, 0);
        batch
    }
}

/// `bytes` over `micros`, in bytes per second.
fn per_second(bytes: u64, micros: u64) -> u64 {
    bytes.saturating_mul(1_000_000) / micros.max(1)
}

impl Change {
    fn to(cut: Cut, why: Why) -> Self {
        Change {
            cut,
            why,
            rates: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        first_probe, Change, Cut, Pace, Sample, Why, FINE_BATCH, FINE_PIECE, FINE_PROBE_BYTES_EACH,
        FINE_SETTLE, FIRST_FINE_PROBE, FIRST_PROBE, LAST_PROBE, PROBE_PER_FLOW, TO_COARSE, TO_FINE,
        TRY_PIECES_BELOW_MBPS, WHOLE_BATCH, WHOLE_RUN,
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
        /// The length of every message it sends ([`MESSAGE`] unless set).
        len: usize,
    }

    impl Comm {
        fn new(pace: Pace) -> Self {
            Self::sending(pace, MESSAGE)
        }

        /// A comm whose messages are each `len` bytes long.
        fn sending(pace: Pace, len: usize) -> Self {
            Comm {
                pace,
                clock: Cell::new(1_000),
                len,
            }
        }

        /// Sends `n` messages one after another, each taking what `took` says for its
        /// largest piece (the whole message: piece 0): what the comm said it changed to.
        fn send(&self, n: u32, took: impl Fn(usize) -> Duration) -> Vec<Cut> {
            self.changes(n, took)
                .into_iter()
                .filter(|c| c.why != Why::PiecesMovedMore)
                .map(|c| c.cut)
                .collect()
        }

        /// As [`Comm::send`], with why each change came, and the verdicts of tries that
        /// kept the cut.
        fn changes(&self, n: u32, took: impl Fn(usize) -> Duration) -> Vec<Change> {
            (0..n)
                .filter_map(|_| {
                    let piece = self.pace.piece();
                    let largest = (piece > 0).then_some(piece);
                    let (bytes, whole) = self.pace.times(self.len, largest)?;
                    let posted_us = self.clock.get();
                    let done_us = posted_us + took(piece).as_micros() as u64;
                    self.clock.set(done_us);
                    self.pace.learn(Sample {
                        bytes,
                        len: self.len,
                        whole,
                        posted_us,
                        done_us,
                    })
                })
                .collect()
        }
    }

    /// A piece (or the whole message, piece 0) at `mbps`: every connection capped at that
    /// rate, the pieces of a message each on their own, all at once.
    fn piece_at(mbps: u64) -> impl Fn(usize) -> Duration {
        piece_of_at(MESSAGE, mbps)
    }

    /// As [`piece_at`], for messages of `len` bytes.
    fn piece_of_at(len: usize, mbps: u64) -> impl Fn(usize) -> Duration {
        move |p| match p {
            0 => at(len, mbps),
            p => at(p, mbps),
        }
    }

    /// Every message at `mbps`, whole or in pieces: what limits is not a connection's cap
    /// (NCCL, the CPU, or the link).
    fn link(mbps: u64) -> impl Fn(usize) -> Duration {
        move |_| at(MESSAGE, mbps)
    }

    /// The messages of a try of pieces that pass before it is judged, and those judged.
    const FINE_TRY: u32 = FINE_SETTLE + FINE_BATCH;

    /// The one change in `changes`: its cut and why, and the rates it gave.
    fn only(changes: &[Change]) -> (Cut, Why, Option<(u64, u64)>) {
        match changes {
            [c] => (c.cut, c.why, c.rates),
            _ => panic!("one change, not {changes:?}"),
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
    fn whole_while_fast_until_whole_messages_prove_slow_and_fast_pieces_alone_change_nothing() {
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, 8));
        let pace = &comm.pace;
        assert_eq!(pace.piece(), 0, "whole messages while the flows are fast");
        assert_eq!(comm.send(FIRST_FINE_PROBE - WHOLE_BATCH, link(5000)), []);
        let to_fine = WHOLE_BATCH * WHOLE_RUN;
        assert_eq!(comm.send(to_fine - 1, piece_at(250)), []);
        assert_eq!(comm.send(1, piece_at(250)), [Cut::Fine]);
        assert_eq!(pace.piece(), FINE_PIECE);
        // Pieces each faster than the floor do not bring whole messages back by themselves.
        assert_eq!(comm.send(2 * TO_COARSE, piece_at(2000)), []);
        assert_eq!(pace.piece(), FINE_PIECE);
        // Where pieces move no more than whole messages (the link limits, not each
        // connection), the try of whole messages after a while keeps them.
        let rest = first_probe(8) - 2 * TO_COARSE;
        assert_eq!(comm.send(rest - 1, link(5000)), []);
        assert_eq!(comm.send(1, link(5000)), [Cut::Whole]);
        assert_eq!(comm.send(WHOLE_BATCH, link(5000)), []);
        assert_eq!(pace.piece(), 0);
        assert_eq!(pace.changes(), (2, Cut::Whole));
    }

    #[test]
    fn a_try_of_pieces_over_connections_capped_above_the_floor_keeps_them() {
        let flows = 20;
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, flows));
        let pace = &comm.pace;
        // Every connection capped at 1 Gbit/s: whole messages are fast by the floor.
        let capped = piece_at(1000);
        assert_eq!(comm.send(FIRST_FINE_PROBE - 1, &capped), []);
        assert_eq!(comm.send(1, &capped), [Cut::Fine], "a try of pieces");
        assert_eq!(comm.send(FINE_TRY - 1, &capped), []);
        let (cut, why, rates) = only(&comm.changes(1, &capped));
        assert_eq!((cut, why), (Cut::Fine, Why::PiecesMovedMore));
        assert!(
            rates.is_some_and(|(pieces, whole)| pieces > 4 * whole),
            "{rates:?}"
        );
        assert_eq!(pace.piece(), FINE_PIECE);
        // Tries of whole messages end after one, slower than the pieces moved.
        let mut wait = first_probe(flows);
        for _ in 0..3 {
            assert_eq!(comm.send(wait - 1, &capped), []);
            assert_eq!(comm.send(1, &capped), [Cut::Whole], "a try after {wait}");
            let (cut, why, _) = only(&comm.changes(1, &capped));
            assert_eq!((cut, why), (Cut::Fine, Why::WholeMovedLess));
            wait *= 2;
        }
        assert_eq!(pace.piece(), FINE_PIECE);
    }

    #[test]
    fn a_run_of_long_messages_counts_by_its_bytes() {
        // 8 MiB messages, every connection capped at 1 Gbit/s: as many bytes as the first
        // wait's 2 MiB messages, in two batches.
        let len = 8 << 20;
        let capped = piece_of_at(len, 1000);
        let comm = Comm::sending(Pace::adaptive(AGREED, 500, true, 20), len);
        let wait = FIRST_FINE_PROBE * (FINE_PROBE_BYTES_EACH as u32) / len as u32;
        assert_eq!(wait, WHOLE_RUN * WHOLE_BATCH);
        assert_eq!(comm.send(wait - 1, &capped), []);
        assert_eq!(comm.send(1, &capped), [Cut::Fine], "a try after {wait}");
        assert_eq!(comm.send(FINE_TRY - 1, &capped), []);
        let (cut, why, _) = only(&comm.changes(1, &capped));
        assert_eq!((cut, why), (Cut::Fine, Why::PiecesMovedMore));
        // Longer ones still wait for two batches.
        let len = 64 << 20;
        let comm = Comm::sending(Pace::adaptive(AGREED, 500, true, 20), len);
        let capped = piece_of_at(len, 1000);
        assert_eq!(comm.send(WHOLE_RUN * WHOLE_BATCH - 1, &capped), []);
        assert_eq!(comm.send(1, &capped), [Cut::Fine]);
        // Shorter ones count: 32 of 1 MiB, not the 64 their bytes would take.
        let len = 1 << 20;
        let comm = Comm::sending(Pace::adaptive(AGREED, 500, true, 20), len);
        let capped = piece_of_at(len, 1000);
        assert_eq!(comm.send(FIRST_FINE_PROBE - 1, &capped), []);
        assert_eq!(comm.send(1, &capped), [Cut::Fine]);
    }

    #[test]
    fn whole_messages_faster_than_clouds_cap_a_connection_are_never_tried_in_pieces() {
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, 8));
        let (fast, less) = (TRY_PIECES_BELOW_MBPS, TRY_PIECES_BELOW_MBPS - 100);
        assert_eq!(comm.send(100 * FIRST_FINE_PROBE, link(fast)), []);
        // Slower batches lead to a try only in a run: one fast batch starts it again.
        for _ in 0..10 {
            assert_eq!(comm.send(FIRST_FINE_PROBE - WHOLE_BATCH, link(less)), []);
            assert_eq!(comm.send(WHOLE_BATCH, link(fast)), []);
        }
        assert_eq!(comm.send(FIRST_FINE_PROBE - 1, link(less)), []);
        assert_eq!(comm.send(1, link(less)), [Cut::Fine]);
    }

    #[test]
    fn a_try_of_pieces_must_beat_the_whole_run_before_it() {
        // Whole messages at 5 Gbit/s, but the last batch before the try stalled to 1: the run
        // moved 3.3 Gbit/s, and pieces at 3 beat the stall, not the run.
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, 8));
        assert_eq!(comm.send(FIRST_FINE_PROBE - WHOLE_BATCH, link(5000)), []);
        assert_eq!(comm.send(WHOLE_BATCH, link(1000)), [Cut::Fine]);
        // Short of the run by WIN, it ends once its first six took longer than eight may.
        assert_eq!(comm.send(FINE_SETTLE + 5, link(3000)), []);
        let (cut, why, rates) = only(&comm.changes(1, link(3000)));
        assert_eq!((cut, why), (Cut::Whole, Why::PiecesMovedNoMore));
        assert!(
            rates.is_some_and(|(pieces, whole)| whole > pieces),
            "{rates:?}"
        );
        // A first batch a rate limiter let through at 8 Gbit/s, the rest at its 1: the run
        // moved 1.1 Gbit/s, and pieces at 4 beat it.
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, 8));
        assert_eq!(comm.send(WHOLE_BATCH, link(8000)), []);
        assert_eq!(
            comm.send(FIRST_FINE_PROBE - WHOLE_BATCH, link(1000)),
            [Cut::Fine]
        );
        assert_eq!(comm.send(FINE_TRY - 1, link(4000)), []);
        let (cut, why, rates) = only(&comm.changes(1, link(4000)));
        assert_eq!((cut, why), (Cut::Fine, Why::PiecesMovedMore));
        assert!(
            rates.is_some_and(|(pieces, whole)| pieces > 3 * whole),
            "{rates:?}"
        );
    }

    #[test]
    fn tries_of_pieces_that_move_no_more_come_less_often_each_time() {
        let comm = Comm::new(Pace::adaptive(AGREED, 500, true, 8));
        let mut wait = FIRST_FINE_PROBE;
        for _ in 0..4 {
            assert_eq!(comm.send(wait - 1, link(5000)), []);
            assert_eq!(comm.send(1, link(5000)), [Cut::Fine], "a try after {wait}");
            // Pieces at the whole messages' rate: short of it by WIN, the try ends once
            // its first seven took longer than eight may.
            assert_eq!(comm.send(FINE_SETTLE + 6, link(5000)), []);
            let (cut, why, rates) = only(&comm.changes(1, link(5000)));
            assert_eq!((cut, why), (Cut::Whole, Why::PiecesMovedNoMore));
            assert!(rates.is_some(), "a verdict gives the rates");
            wait *= 2;
        }
        assert_eq!(comm.pace.piece(), 0);
    }

    /// Whole messages sent at `times`: (posted, done) in µs, each of [`MESSAGE`] bytes.
    fn whole_at(pace: &Pace, times: impl IntoIterator<Item = (u64, u64)>) -> Vec<Cut> {
        times
            .into_iter()
            .filter_map(|(posted_us, done_us)| {
                pace.learn(Sample {
                    bytes: MESSAGE,
                    len: MESSAGE,
                    whole: true,
                    posted_us,
                    done_us,
                })
            })
            .map(|c| c.cut)
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
        // A fast stream with one stall, and idle spells between its messages: still whole
        // (short of the first try of pieces).
        let pace = Pace::adaptive(AGREED, 500, true, 8);
        let stream = (0..u64::from(FIRST_FINE_PROBE) - 1).map(|k| {
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
        // Every connection capped at 250 Mbit/s: whole messages and pieces alike are slow,
        // and each try of whole messages ends after one, slower than the pieces had moved.
        let capped = piece_at(250);
        assert_eq!(comm.send(to_fine, &capped), [Cut::Fine]);
        let mut wait = first_probe(flows);
        for _ in 0..4 {
            assert_eq!(comm.send(wait - 1, &capped), []);
            assert_eq!(comm.send(1, &capped), [Cut::Whole], "a try after {wait}");
            assert_eq!(
                comm.send(1, &capped),
                [Cut::Fine],
                "one message ends the try"
            );
            wait *= 2;
        }
        // Uncapped, but a message in pieces slow (NCCL's calls drive the flows: it waits on
        // every flow's turn), whole messages fast: the next try stays, and the tries of
        // pieces that follow lose, each after a longer wait.
        let by_calls = |p: usize| match p {
            0 => at(MESSAGE, 8000),
            _ => at(MESSAGE, 250),
        };
        assert_eq!(comm.send(wait - 1, by_calls), []);
        assert_eq!(comm.send(1, by_calls), [Cut::Whole]);
        let tries: Vec<(Cut, Why)> = comm
            .changes(1000, by_calls)
            .iter()
            .map(|c| (c.cut, c.why))
            .collect();
        let lost = [(Cut::Fine, Why::Try), (Cut::Whole, Why::PiecesMovedNoMore)];
        assert_eq!(tries, lost.repeat(4), "tries after 32, 64, 128 and 256");
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
        // Pieces no faster than whole messages: a try must reach the floor.
        assert_eq!(comm.send(to_fine, link(100)), [Cut::Fine]);
        assert_eq!(comm.send(first_probe(flows) - 1, link(100)), []);
        assert_eq!(comm.send(1, link(100)), [Cut::Whole]);
        // At a fifth of the floor, one whole message takes longer than four may.
        assert_eq!(comm.send(1, link(100)), [Cut::Fine], "ended after one");
        // At half the floor, the third message is past four at the floor.
        assert_eq!(comm.send(2 * first_probe(flows) - 1, link(250)), []);
        assert_eq!(comm.send(1, link(250)), [Cut::Whole]);
        assert_eq!(comm.send(2, link(250)), []);
        assert_eq!(comm.send(1, link(250)), [Cut::Fine], "ended after three");
        // Pieces that moved more together raise the bar: the next try ends after one.
        assert_eq!(comm.send(4 * first_probe(flows) - 1, piece_at(250)), []);
        assert_eq!(comm.send(1, piece_at(250)), [Cut::Whole]);
        assert_eq!(comm.send(1, piece_at(250)), [Cut::Fine], "ended after one");
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
