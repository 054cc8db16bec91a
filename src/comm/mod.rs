//! Send and receive comms (NCCL's sendComm / recvComm) and their requests.
//!
//! A comm posts by handing its lanes' drivers operations ([`crate::lane::Lane::submit`]) and
//! learns the outcome from the operations' atomics; it never reads a completion queue. NCCL
//! calls isend/irecv/test from its progress thread and close from its service thread; every
//! field a call changes is atomic.
//!
//! **Flows.** A comm has one or more flows ([`Wire`]s), each a lane of its device with its
//! own connection to the peer: more flows move more where a network caps each TCP flow, and
//! spread the provider's work over endpoints. Whole messages and headers go on the first
//! flow; pieces go on the others where a comm has three flows or more ([`piece_flows`]), so
//! that a header never waits behind pieces where a network caps each connection.
//!
//! **Pieces.** A message longer than the comm's smallest piece (agreed at connect, see
//! `handshake::agreed_piece`) is cut into up to one piece per flow that pieces take, their
//! number rounded up to a power of two ([`cut`]: at most [`PIECES_ON_ONE_FLOW`] on a comm of
//! one flow), all of one power-of-two size but the last, which takes the rest. The sender alone
//! knows how long its message is, so it first sends a header: an empty message on the first
//! flow whose tag names the cut (see `tags`). The receiver posts one receive over its whole
//! buffer, which takes a whole message or a header alike; a header makes it post a receive for
//! each piece at its offset, on the flow the piece travels on (piece `j` on the
//! `first + j mod n`-th of the `n` flows pieces take, each message's `first` after the previous
//! one's pieces, see `Comm::first_flow`), while the pieces, sent at once behind the header,
//! wait for them in the provider (rxm holds a long message's rendezvous until its receive is
//! posted). Pieces beyond the receive's buffer are taken in by empty receives (into the
//! overflow area), so a truncation is reported with both sizes and neither side waits.
//!
//! While the provider holds a request's operation, the driver holds the comm (an `Arc`), so
//! a comm closed with operations in flight lives on until they are cancelled or complete,
//! and close never waits.
//!
//! Posting (the cut, descriptors, the registrations a comm makes or keeps) is in `posting`;
//! a request slot and `test` in `request`; one buffer's operations, where they stand and how
//! a receive's pieces go out once its header arrived, in `part`.

use crate::control::Peer;
use crate::driver::{owner_key, Owner, SinkSpec};
use crate::error::{Error, Result};
use crate::handshake::Identity;
use crate::lane::{IdLease, Lane};
use crate::op::Op;
use crate::opaque;
use crate::pace::{Change, Cut, Pace, Why};
use crate::sys;
use crate::tags::MAX_PIECES;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod part;
mod posting;
mod request;

use part::Part;
use posting::Adhoc;
pub use posting::{cut, Buffer, Descs, Keep, Registered, MAX_ADHOC, NO_DESCS};
use request::REQUEST_MAGIC;
pub use request::{Request, Sizes};

/// Outstanding requests per comm (NCCL keeps at most 8 in flight; its limit is 32); a send
/// comm has as many per buffer a grouped receive may take.
pub const REQUESTS_PER_COMM: usize = crate::nccl::NET_MAX_REQUESTS;
/// Most buffers one receive may group (`maxRecvs`; NCCL's IB transport offers 8).
pub const MAX_RECVS: usize = 8;
pub use crate::tags::MAX_FLOWS;
const _: () = assert!(
    crate::sizing::MAX_AUTO_FLOWS <= MAX_FLOWS,
    "auto gives no more flows than a comm may have"
);

/// Most pieces a message is cut into on a comm of one flow: there pieces only overlap one
/// piece's rendezvous with the others' data.
pub const PIECES_ON_ONE_FLOW: usize = 4;

/// The flows pieces travel on, of a comm's `flows`: the first of them and how many. A comm
/// of three flows or more keeps its first for whole messages and headers, as NCCL's Socket
/// transport keeps a control socket beside its data sockets: where a network caps each
/// connection, a header sent behind pieces waits until they have gone through the cap, and
/// the receiver posts the message's pieces only once it has the header. (GPU machine, every
/// connection capped at 250 Mbit/s, all_reduce 64-256 MiB over NCCL's 2 channels: 16 flows
/// each carrying pieces moved 0.68x Socket 2x8 on average, 17 with the first kept for
/// headers 0.77x, in one call; with 32 KiB fine pieces 0.79x, 2.1x the 32 flows before, in
/// another; BENCHMARKS.md.)
pub fn piece_flows(flows: usize) -> (usize, usize) {
    match flows {
        0..=2 => (0, flows.max(1)),
        n => (1, n - 1),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Send,
    Recv,
}

/// The other end of a comm.
pub struct PeerInfo {
    pub who: Identity,
    /// Its process's liveness.
    pub liveness: Arc<Peer>,
}

/// A comm's id in its pair's data tags: chosen by the receiving lane (and held there while
/// anything of the comm may still match), or given by the peer that chose it.
pub enum CommId {
    Leased(Arc<IdLease>),
    Peer(u64),
}

/// One flow of a comm: its lane, the peer's endpoint there, the comm's id in that lane's
/// data tags.
pub struct Wire {
    pub lane: Arc<Lane>,
    /// The peer's endpoint, in the lane's address vector.
    addr: sys::fi_addr_t,
    /// The comm's id in the data tags (chosen by the receiving lane).
    id: u64,
    /// The receiving lane's hold on `id`.
    lease: Option<Arc<IdLease>>,
}

impl Wire {
    pub fn new(lane: Arc<Lane>, addr: sys::fi_addr_t, id: CommId) -> Wire {
        let (id, lease) = match id {
            CommId::Leased(l) => (l.id, Some(l)),
            CommId::Peer(id) => (id, None),
        };
        Wire {
            lane,
            addr,
            id,
            lease,
        }
    }

    /// Where a receive takes messages from.
    fn source(&self) -> sys::fi_addr_t {
        self.lane.source(self.addr)
    }

    /// The data tag of a message of this comm on this flow (see `tags`).
    fn tag(&self, nccl_tag: u64, seq: u64) -> u64 {
        self.lane.tags.data(self.id, nccl_tag, seq)
    }
}

/// A send or receive comm.
pub struct Comm {
    pub dir: Direction,
    /// The NCCL device it is on.
    pub dev: usize,
    /// Its flows: whole messages and headers go on the first (at least one).
    wires: Box<[Wire]>,
    pub peer: PeerInfo,
    me: Identity,
    /// How finely it cuts (see `pace`): a receive comm, and a send comm whose piece size
    /// was set, at the size both ends agreed.
    pace: Pace,
    /// Most pieces it cuts a message into.
    most: usize,
    /// Itself, for the operations `test` hands the drivers (see `Part::settle`).
    this: std::sync::Weak<Comm>,
    /// The next sequence number per NCCL tag (see `tags`); held while posting, so numbers
    /// are used in order and one the provider refused is used again.
    next_seq: Mutex<HashMap<u64, u64>>,
    requests: Box<[Request]>,
    /// After how long an unfinished request is reported (`NCCL_FABRIC_STALL_WARN_MS`).
    stall_warn: Option<Duration>,
    closed: AtomicBool,
    /// A request of it failed for a reason of the peer or the connection.
    failed: AtomicBool,
    /// Its lanes' count of errors without an operation, as this comm last saw it.
    stray_seen: AtomicU64,
    /// Where its requests' time went (`NCCL_FABRIC_TIMES`).
    times: crate::times::Times,
    /// Since when (ms) the provider has refused this comm's posts, 0 if it took the last one:
    /// a peer that stops taking messages is watched like one that stops answering them.
    refused_since: AtomicU64,
    /// Registrations the plugin made itself for buffers posted without an mhandle, where the
    /// domains need a descriptor with every buffer (see [`Comm::adhoc`]): by address and
    /// length, until the comm closes.
    adhoc: Mutex<Vec<Adhoc>>,
    /// The registrations its sends used (see [`Registered`]), kept while it lives.
    kept: Mutex<Vec<Keep>>,
    /// Its domains claim `FI_MR_LOCAL` (decided when it is made; see [`Comm::needs_descs`]).
    needs_descs: bool,
}

impl opaque::Kind for Arc<Comm> {
    const MAGIC: u64 = 0x4e46_4142_434f_4d33; // "NFABCOM3"
    const NAME: &'static str = "comm";
}

// SAFETY: the comm pointer is the comm that owns the slot, alive while NCCL holds a request;
// every field is atomic (the op's too).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// How a comm carries its requests.
pub struct Terms {
    /// After how long an unfinished request is reported.
    pub stall_warn: Option<Duration>,
    /// Buffers a receive may group (a send comm then has that many times
    /// [`REQUESTS_PER_COMM`] requests, each of one buffer).
    pub max_recvs: usize,
    /// Pieces are this long at least (0: whole messages), as both ends agreed.
    pub piece: usize,
    /// A send comm may cut finer where its flows prove slow (see `pace`): the piece size
    /// was left to the plugin.
    pub adapt: bool,
}

impl Comm {
    /// A comm on `wires` (at least one, at most [`MAX_FLOWS`]; the first is its own lane).
    pub fn new(
        dir: Direction,
        dev: usize,
        wires: Vec<Wire>,
        peer: PeerInfo,
        terms: Terms,
    ) -> Arc<Self> {
        assert!(
            !wires.is_empty() && wires.len() <= MAX_FLOWS,
            "1 to {MAX_FLOWS} flows"
        );
        let Terms {
            stall_warn,
            max_recvs,
            piece,
            adapt,
        } = terms;
        let max_recvs = max_recvs.clamp(1, MAX_RECVS);
        // Up to as many pieces as flows take them, rounded up to a power of two: NCCL's
        // messages are powers of two (its 1 MiB slices of two 512 KiB steps), so a finely cut
        // one goes in pieces of `pace::FINE_PIECE`, one per flow on a comm of 33 (32 take
        // pieces). Where the flows number fewer than the pieces, some take two (see
        // `wire_of`), and every piece of the message waits for them: with 31 piece flows a
        // 1 MiB slice in 32 pieces left 30 flows idle half the time it took. Cut in 31 at
        // most, it went in 16 pieces of 64 KiB over 16 of the 31 flows: all_reduce on the GPU
        // machine, every connection capped at 100 Mbit/s, moved 0.63 of its 31 flows' caps.
        let most = match wires.len() {
            1 => PIECES_ON_ONE_FLOW,
            n => piece_flows(n).1.next_power_of_two().min(MAX_PIECES),
        };
        // A send cuts into `most` pieces at most, and its peer's comm has as many flows as
        // this one, so a receive takes as many (a header naming more is malformed). Every
        // request of a comm holds that many operations per buffer, which `claim` and
        // `release` look through: 32 pieces for each of 8 grouped buffers cost the comms of
        // the 2-core machine a tenth of their rate at 64 KiB.
        let pieces = match piece {
            0 => 0,
            _ => most,
        };
        let (count, parts) = match dir {
            Direction::Send => (REQUESTS_PER_COMM * max_recvs, 1),
            Direction::Recv => (REQUESTS_PER_COMM, max_recvs),
        };
        let requests = (0..count)
            .map(|_| Request {
                magic: REQUEST_MAGIC,
                comm: AtomicPtr::new(std::ptr::null_mut()),
                generation: AtomicU32::new(0),
                held: AtomicBool::new(false),
                n: AtomicUsize::new(0),
                parts: (0..parts)
                    .map(|_| Part {
                        op: Op::default(),
                        pieces: (0..pieces).map(|_| Op::default()).collect(),
                        used: AtomicUsize::new(0),
                        first: AtomicUsize::new(0),
                        settled: AtomicBool::new(false),
                        settle_lock: Mutex::new(()),
                        posted: AtomicUsize::new(0),
                        buf: AtomicPtr::new(std::ptr::null_mut()),
                        descs: std::array::from_fn(|_| AtomicPtr::default()),
                        host: AtomicBool::new(true),
                        event: AtomicPtr::new(std::ptr::null_mut()),
                    })
                    .collect(),
                posted_at_ms: AtomicU64::new(0),
                posted_at: AtomicU64::new(0),
                stall_reported: AtomicBool::new(false),
                straggling_since: AtomicU64::new(0),
                paced: AtomicUsize::new(0),
                paced_whole: AtomicBool::new(false),
                paced_len: AtomicUsize::new(0),
                posted_at_us: AtomicU64::new(0),
            })
            .collect();
        let wires: Box<[Wire]> = wires.into();
        let needs_descs = wires
            .iter()
            .any(|w| w.lane.endpoint.domain.claimed_local_mr());
        // A comm of several flows sends whole messages while they are fast (see `pace`).
        let flows = wires.len();
        let whole_while_fast = flows > 1;
        let stray_seen = AtomicU64::new(stray_errors(&wires));
        let comm = Arc::new_cyclic(|this| Comm {
            this: this.clone(),
            dir,
            dev,
            wires,
            peer,
            pace: match (dir, adapt) {
                (Direction::Send, true) => {
                    Pace::adaptive(piece, crate::sizing::FLOW_MBPS, whole_while_fast, flows)
                }
                _ => Pace::fixed(piece),
            },
            most,
            me: Identity::current(),
            next_seq: Mutex::new(HashMap::new()),
            requests,
            stall_warn,
            closed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            stray_seen,
            times: Default::default(),
            refused_since: AtomicU64::new(0),
            adhoc: Mutex::new(Vec::new()),
            kept: Mutex::new(Vec::new()),
            needs_descs,
        });
        let me = Arc::as_ptr(&comm).cast_mut();
        for r in comm.requests.iter() {
            r.comm.store(me, Ordering::Release);
        }
        comm
    }

    /// `to pid N on another host`, `from pid N on this host`.
    pub fn peer_text(&self) -> String {
        let side = match self.dir {
            Direction::Send => "to",
            Direction::Recv => "from",
        };
        format!("{side} {}", self.me.describe(&self.peer.who))
    }

    /// How it sends long messages, for log lines.
    pub fn pieces_text(&self) -> String {
        let (p, n) = (self.piece(), self.wires.len());
        let over = match n {
            1 => String::new(),
            n => match piece_flows(n) {
                (0, _) => format!(" over {n} flows"),
                (_, k) => format!(" over {k} of its {n} flows (the first for headers)"),
            },
        };
        let finer = format!(
            "of {} bytes while its flows move under {} Mbit/s each",
            crate::pace::FINE_PIECE,
            crate::sizing::FLOW_MBPS
        );
        match (p, self.pace.adapts(), self.pace.when_fast()) {
            (0, ..) => "whole messages".into(),
            (_, true, Cut::Whole) => format!(
                "messages over {p} bytes sent whole on its first flow while its flows move {} \
                 Mbit/s each or more (NCCL's calls drive them), else in up to {} pieces{over} \
                 {finer}",
                crate::sizing::FLOW_MBPS,
                self.most
            ),
            (_, true, _) => format!(
                "messages over {p} bytes in up to {} pieces{over}, {finer}",
                self.most
            ),
            (_, false, _) => format!(
                "messages over {p} bytes in up to {} pieces{over}",
                self.most
            ),
        }
    }

    /// Its pace changed, or a try kept it (see `Pace::learn`). The first of each reason in a
    /// process is logged at INFO, the rest at DEBUG.
    fn paced(&self, change: Change) {
        static SAID: [AtomicBool; 6] = [const { AtomicBool::new(false) }; 6];
        let mbps = crate::sizing::FLOW_MBPS;
        let fine = crate::pace::FINE_PIECE;
        let (most, flows) = (self.most, self.wires.len());
        let times = |(pieces, whole): (u64, u64)| {
            format!(
                "{:.0} against {:.0} MB/s",
                pieces as f64 / 1e6,
                whole as f64 / 1e6
            )
        };
        let what = match (change.why, change.cut) {
            (Why::Slow, _) => format!(
                "its flows move less than {mbps} Mbit/s each (as where a network caps each \
                 connection): messages over {fine} bytes now go in up to {most} pieces of \
                 {fine} bytes at least"
            ),
            (Why::Fast, _) => format!(
                "its flows move faster than {mbps} Mbit/s each again: pieces of {} bytes at least",
                self.piece()
            ),
            (Why::Try, Cut::Fine) => format!(
                "tries messages in up to {most} pieces of {fine} bytes over its {flows} flows, \
                 to learn whether they move more than whole ones on its first flow (they do \
                 where a network caps each connection, also above {mbps} Mbit/s)"
            ),
            (Why::Try, _) => {
                "whole messages on its first flow again, as a try after a while in pieces".into()
            }
            (Why::WholeMovedLess, _) => format!(
                "whole messages moved less than {mbps} Mbit/s or than its pieces had: pieces \
                 again, trying whole messages later than before"
            ),
            (Why::PiecesMovedMore, _) => format!(
                "its pieces over {flows} flows moved more than whole messages on its first \
                 flow ({}: the network seems to cap each connection): it keeps cutting them",
                change.rates.map_or_else(String::new, times)
            ),
            (Why::PiecesMovedNoMore, _) => format!(
                "whole messages on its first flow again: its pieces over {flows} flows moved \
                 no more ({}); it tries them again later than before",
                change.rates.map_or_else(String::new, times)
            ),
        };
        match !SAID[change.why as usize].swap(true, Ordering::Relaxed) {
            true => tracing::info!("send comm {}: {what}", self.peer_text()),
            false => tracing::debug!("send comm {}: {what}", self.peer_text()),
        }
    }

    /// The piece size both ends agreed (0: whole messages).
    pub(super) fn piece(&self) -> usize {
        self.pace.agreed()
    }

    /// Its own lane, its first flow's: whole messages and headers go there.
    pub fn lane(&self) -> &Arc<Lane> {
        &self.wires[0].lane
    }

    /// Its lanes, one per flow, its own first.
    pub fn lanes(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.wires.iter().map(|w| &w.lane)
    }

    /// How many flows it has.
    pub fn flows(&self) -> usize {
        self.wires.len()
    }

    /// Which of the flows pieces take (see [`piece_flows`]) the first piece of the `seq`-th
    /// message (per NCCL tag) in `count` pieces travels on: messages take the flows in turn,
    /// so that NCCL's steps of 2 to 4 pieces each, several in flight, spread over all of a
    /// comm's flows rather than its first few.
    /// (`seq` as its tag carries it, which both ends know).
    fn first_flow(&self, seq: u64, count: usize) -> usize {
        let seq = self.lane().tags.seq_of(seq) as usize;
        (seq * count) % piece_flows(self.wires.len()).1
    }

    /// The flow piece `j` of a message whose first piece is the `first`-th of the flows
    /// pieces travel on (see [`piece_flows`]) takes.
    fn wire_of(&self, first: usize, j: usize) -> usize {
        let (from, n) = piece_flows(self.wires.len());
        from + (first + j) % n
    }

    /// Errors of its lanes' endpoints themselves.
    fn health_check(&self) -> Result<()> {
        self.lanes().try_for_each(|l| l.health().check())
    }

    /// A driver's turn on the lanes of the flows in `flows` (a bit per flow; see
    /// [`Lane::drive`]): those a request travels on. With NCCL's calls driving, a 1 MiB
    /// message in 4 pieces on a comm of 16 flows costs 5 turns per `test`, not 16.
    fn drive(&self, flows: u64) -> Result<()> {
        self.lanes()
            .enumerate()
            .filter(|(k, _)| flows & (1 << k) != 0)
            .try_for_each(|(_, l)| l.drive())
    }

    /// This comm as the owner of an operation (it lives while NCCL holds a request of it).
    fn owner(&self) -> Option<Owner> {
        self.this.upgrade().map(|c| c as Owner)
    }

    fn what(&self) -> &'static str {
        match self.dir {
            Direction::Send => "send",
            Direction::Recv => "receive",
        }
    }

    fn peer_lost(&self, why: &str) -> Error {
        self.failed.store(true, Ordering::Release);
        Error::Remote(format!(
            "the peer {} is gone: {why}; the job cannot continue on this comm",
            self.me.describe(&self.peer.who)
        ))
    }

    /// `closeSend`/`closeRecv`: returns at once. The drivers cancel what is still in
    /// flight and keep this comm's memory until the provider lets go of it; a receive comm
    /// also leaves a sink on each flow for messages of its peer that nothing will receive
    /// now.
    pub fn close(self: Arc<Self>) {
        self.closed.store(true, Ordering::Release);
        if let Some(times) = self.times.text() {
            let (changes, cut) = self.pace.changes();
            let pace = match self.pace.adapts() {
                true => format!(
                    "; changed how it cuts {changes} time(s), {} at the end",
                    cut.text()
                ),
                false => String::new(),
            };
            tracing::info!("{} comm {}: {times}{pace}", self.what(), self.peer_text());
        }
        if self.dir == Direction::Recv {
            // Headers that arrive from now on leave their pieces to the sinks: nothing is
            // handed to the drivers after the comm's operations are withdrawn.
            for p in self.requests.iter().flat_map(|r| r.parts.iter()) {
                p.seal();
            }
        }
        let owner: Owner = self.clone();
        let healthy =
            |c: &Comm| !c.failed.load(Ordering::Acquire) && c.peer.liveness.dead().is_none();
        let sinks = self.dir == Direction::Recv && healthy(&self);
        for wire in self.wires.iter() {
            let sink = sinks.then(|| {
                // The sink must not keep the comm (its requests) alive: a weak reference to
                // see a failure while the comm still exists, then the peer's liveness alone.
                let comm = Arc::downgrade(&self);
                let peer = self.peer.liveness.clone();
                // The id stays taken while the sink may match its messages.
                let lease = wire.lease.clone();
                SinkSpec {
                    src: wire.source(),
                    tag: wire.tag(0, 0),
                    ignore: wire.lane.tags.below_id(),
                    alive: Box::new(move || {
                        let _held = &lease;
                        peer.dead().is_none()
                            && comm
                                .upgrade()
                                .map_or(true, |c| !c.failed.load(Ordering::Acquire))
                    }),
                }
            });
            wire.lane.retire_owner(owner_key(&owner), sink);
            wire.lane.release_user();
        }
        // Its own registrations are deregistered now, as NCCL's are after it closes a comm:
        // they must not keep the lanes in use while the comm lives on for operations that
        // only the lanes' closing may end. What its sends used stays registered (kept) until
        // the comm goes: a peer may still be reading a send.
        let adhoc = std::mem::take(&mut *self.adhoc.lock());
        for (_, _, r) in adhoc {
            self.keep(r.keep());
        }
    }

    /// Whether the peer lives, for something that has waited `waited` on it (probing it
    /// when that is long enough, or at once after an error of an endpoint itself).
    fn check_peer(&self, waited: Duration) -> Result<()> {
        let stray = stray_errors(&self.wires);
        let urgent = self.stray_seen.swap(stray, Ordering::AcqRel) != stray;
        self.peer
            .liveness
            .watch(waited, urgent)
            .map_err(|why| self.peer_lost(&why))
    }
}

/// When something was first seen (ms): `at` if set, else `now`, stored there (0: not seen).
fn first_seen(at: &AtomicU64, now: u64) -> u64 {
    match at.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => now,
        Err(t) => t,
    }
}

/// Errors without an operation that the flows' endpoints have seen.
fn stray_errors(wires: &[Wire]) -> u64 {
    wires.iter().map(|w| w.lane.health().stray_errors()).sum()
}
