//! Send and receive comms (NCCL's sendComm / recvComm) and their requests.
//!
//! A comm posts by handing its lanes' drivers operations ([`crate::lane::Lane::submit`]) and
//! learns the outcome from the operations' atomics; it never reads a completion queue. NCCL
//! calls isend/irecv/test from its progress thread and close from its service thread; every
//! field a call changes is atomic.
//!
//! **Flows.** A comm has one or more flows ([`Wire`]s), each a lane of its device with its
//! own connection to the peer: more flows move more where a network caps each TCP flow, and
//! spread the provider's work over endpoints. Whole messages go on the first flow.
//!
//! **Pieces.** A message longer than the comm's smallest piece (agreed at connect, see
//! `handshake::agreed_piece`) is cut into up to one piece per flow ([`cut`]: at most
//! [`PIECES_ON_ONE_FLOW`] on a comm of one flow), all of one power-of-two size but the last,
//! which takes the rest. The sender alone knows how long its message is, so it first sends a
//! header: an empty message on the first flow whose tag names the cut (see `tags`). The
//! receiver posts one receive over its whole buffer, which takes a whole message or a header
//! alike; a header makes it post a receive for each piece at its offset, on the flow the piece
//! travels on (piece `j` on flow `first + j mod flows`, each message's `first` after the
//! previous one's pieces, see [`Comm::first_flow`]), while the pieces, sent at once behind the
//! header, wait for them in the provider (rxm holds a long message's rendezvous until its
//! receive is posted). Pieces beyond the receive's buffer are taken in by empty receives (into
//! the overflow area), so a truncation is reported with both sizes and neither side waits.
//!
//! A request is a slot of the comm, aligned to 64 bytes; the pointer NCCL gets carries the
//! slot's generation (see `opaque::request`), so a request already reported done is refused.
//! While the provider holds a request's operation, the driver holds the comm (an `Arc`), so
//! a comm closed with operations in flight lives on until they are cancelled or complete,
//! and close never waits.

use crate::control::{now_ms, Peer};
use crate::driver::{owner_key, Owned, Owner, Post, SinkSpec, Transfer};
use crate::error::{Error, Result};
use crate::handshake::Identity;
use crate::lane::{IdLease, Lane};
use crate::op::{Op, Status};
use crate::opaque::{self, request};
use crate::pace::Pace;
use crate::sys;
use crate::tags::{Layout, MAX_PIECE, MAX_PIECES, PIECE_UNIT};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Outstanding requests per comm (NCCL keeps at most 8 in flight; its limit is 32); a send
/// comm has as many per buffer a grouped receive may take.
pub const REQUESTS_PER_COMM: usize = crate::nccl::NET_MAX_REQUESTS;
/// Most buffers one receive may group (`maxRecvs`; NCCL's IB transport offers 8).
pub const MAX_RECVS: usize = 8;
/// Most flows a comm has: one per piece at most.
pub const MAX_FLOWS: usize = MAX_PIECES;
/// Most pieces a message is cut into on a comm of one flow: there pieces only overlap one
/// piece's rendezvous with the others' data.
pub const PIECES_ON_ONE_FLOW: usize = 4;

/// A registration's descriptor per flow of its comm (see [`Wire`]).
pub type Descs = [*mut c_void; MAX_FLOWS];

/// No registration.
pub const NO_DESCS: Descs = [std::ptr::null_mut(); MAX_FLOWS];

/// One buffer of a send or (grouped) receive, as NCCL passes it.
#[derive(Debug, Clone, Copy)]
pub struct Buffer {
    pub data: *mut c_void,
    pub len: usize,
    /// The registration's descriptor on each of the comm's flows, or NULLs.
    pub descs: Descs,
    /// For a send on a comm whose domains claim `FI_MR_LOCAL`: its registration (see
    /// [`Registered`]), read only while the send is posted.
    pub starts: Option<*const dyn Registered>,
    /// Host memory (a receive into GPU memory gets no overflow area: providers may take
    /// every piece of a receive to be of the first piece's kind).
    pub host: bool,
    /// NCCL's tag: which send a buffer of a grouped receive takes.
    pub tag: i32,
}

/// A registration as a comm on domains that claim `FI_MR_LOCAL` uses it (see
/// `quirks::claim_local_mr`). rxm over tcp, trusted with the plugin's descriptors, tells the
/// peer to read a long message from offset 0 of the registration its descriptor names (tcp's
/// registrations take offsets, not addresses), so a send that does not begin where its
/// registration begins needs one that does; and the peer may still read a send after NCCL
/// closed the comm and deregistered the buffer, so the comm keeps what its sends used until
/// the provider has let go of them.
pub trait Registered: Send + Sync {
    /// The descriptor on each of the comm's flows.
    fn descs(&self) -> Descs;
    /// The descriptor, on flow `flow`, of a registration that begins at `addr` (inside this
    /// one) and reaches to its end.
    fn desc_at(&self, flow: usize, addr: *mut c_void) -> Result<*mut c_void>;
    /// What keeps its registrations open (not its lanes: that ends with deregistration).
    fn keep(&self) -> Keep;
}

const REQUEST_MAGIC: u64 = 0x4e46_4142_5245_5133; // "NFABREQ3"

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

/// How a message of `len` bytes is cut on a comm whose smallest piece is `piece` (0: whole
/// messages) and that cuts into `most` pieces at most: `None` for a whole message. Every
/// piece but the last is of one power-of-two size, at least `piece` and large enough that
/// `most` pieces hold the message; the last takes the rest.
pub fn cut(len: usize, piece: usize, most: usize) -> Option<Layout> {
    if piece == 0 || most < 2 || len <= piece {
        return None;
    }
    let size = piece
        .max(len.div_ceil(most))
        .max(PIECE_UNIT)
        .checked_next_power_of_two()?
        .min(MAX_PIECE);
    let count = len.div_ceil(size);
    (2..=MAX_PIECES.min(most))
        .contains(&count)
        .then_some(Layout { count, size })
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
    /// Pieces are this long at least (0: whole messages), as both ends agreed.
    piece: usize,
    /// How finely a send comm cuts now (see `pace`).
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

/// A registration a comm made itself: address, length, the registration.
type Adhoc = (usize, usize, Arc<dyn Registered>);

/// Something a comm keeps while it lives (a registration of a layer above).
pub type Keep = Arc<dyn std::any::Any + Send + Sync>;

/// Most buffers a comm registers itself for posts without an mhandle.
pub const MAX_ADHOC: usize = 1024;

impl opaque::Kind for Arc<Comm> {
    const MAGIC: u64 = 0x4e46_4142_434f_4d33; // "NFABCOM3"
    const NAME: &'static str = "comm";
}

/// A request NCCL holds between isend/irecv and the `test` that reports it done: one
/// operation per buffer (a send has one, a grouped receive up to [`MAX_RECVS`]), and its
/// pieces'.
#[repr(C, align(64))]
pub struct Request {
    magic: u64,
    comm: AtomicPtr<Comm>,
    generation: AtomicU32,
    /// NCCL holds it (posted and not yet reported done).
    held: AtomicBool,
    /// Buffers in use.
    n: AtomicUsize,
    parts: Box<[Part]>,
    posted_at_ms: AtomicU64,
    /// When NCCL posted it (`times::stamp`, 0 unless timing is on).
    posted_at: AtomicU64,
    stall_reported: AtomicBool,
    /// Since when (ms) `test` has seen some of its pieces finished and others not (0: not).
    straggling_since: AtomicU64,
    /// A send in pieces whose comm learns its pace from it: its largest piece (0: none).
    paced: AtomicUsize,
    /// When it was posted (`pace::now_us`), if it is paced.
    posted_at_us: AtomicU64,
}

/// One buffer's operations.
struct Part {
    /// The whole message or the header (a receive: over the whole buffer).
    op: Op,
    /// The pieces, piece `j` in `pieces[j]` (none on a comm that sends whole messages).
    pieces: Box<[Op]>,
    /// Pieces in use (0: a whole message).
    used: AtomicUsize,
    /// The flow its first piece travels on (see [`Comm::first_flow`]).
    first: AtomicUsize,
    /// A receive's pieces were handed to the drivers (after its header arrived), or never
    /// will be (sealed: the request failed or its comm closed first).
    settled: AtomicBool,
    /// Held while settling or sealing: the driver that completed the header and NCCL's
    /// thread may both try (see [`Part::settle_once`]).
    settle_lock: Mutex<()>,
    /// Bytes posted (send size or receive buffer size).
    posted: AtomicUsize,
    /// Where a receive's pieces go: its buffer, descriptors and kind.
    buf: AtomicPtr<c_void>,
    descs: [AtomicPtr<c_void>; MAX_FLOWS],
    host: AtomicBool,
    /// A profiler's event handle for it (see `exports`), NULL if none.
    event: AtomicPtr<c_void>,
}

/// Offset and length of piece `j` of a message of `len` bytes cut as `layout`.
fn span(len: usize, layout: Layout, j: usize) -> (usize, usize) {
    let off = j * layout.size;
    (off, layout.size.min(len.saturating_sub(off)))
}

/// What `test` reports of a finished request: bytes per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub n: usize,
    pub bytes: [usize; MAX_RECVS],
}

// SAFETY: the comm pointer is the comm that owns the slot, alive while NCCL holds a request;
// every field is atomic (the op's too).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Owned for Comm {
    /// A receive's header arrived: its pieces go to their flows' drivers now, from the
    /// driver's thread, rather than at NCCL's next `test` (a receiver that makes no call
    /// meanwhile would hold the sender's pieces back).
    fn completed(&self, op: &Op) {
        if self.dir != Direction::Recv || self.piece == 0 || op.status() != Status::Done(0) {
            return;
        }
        let Some(layout) = self.lane().tags.layout_of(op.tag()) else {
            return;
        };
        let part = self
            .requests
            .iter()
            .flat_map(|r| r.parts.iter())
            .find(|p| std::ptr::eq(&p.op, op));
        if let Some(part) = part.filter(|p| layout.count <= p.pieces.len()) {
            part.settle_once(self, layout, false);
        }
    }
}

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
        let most = match wires.len() {
            1 => PIECES_ON_ONE_FLOW,
            n => n,
        };
        // A receive takes whatever cut its peer chose; a send makes its own.
        let pieces = match (piece, dir) {
            (0, _) => 0,
            (_, Direction::Recv) => MAX_PIECES,
            (_, Direction::Send) => most,
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
                        descs: Default::default(),
                        host: AtomicBool::new(true),
                        event: AtomicPtr::new(std::ptr::null_mut()),
                    })
                    .collect(),
                posted_at_ms: AtomicU64::new(0),
                posted_at: AtomicU64::new(0),
                stall_reported: AtomicBool::new(false),
                straggling_since: AtomicU64::new(0),
                paced: AtomicUsize::new(0),
                posted_at_us: AtomicU64::new(0),
            })
            .collect();
        let wires: Box<[Wire]> = wires.into();
        let needs_descs = wires
            .iter()
            .any(|w| w.lane.endpoint.domain.claimed_local_mr());
        let stray_seen = AtomicU64::new(stray_errors(&wires));
        let comm = Arc::new_cyclic(|this| Comm {
            this: this.clone(),
            dir,
            dev,
            wires,
            peer,
            piece,
            pace: match (dir, adapt) {
                (Direction::Send, true) => Pace::adaptive(piece, crate::sizing::FLOW_MBPS),
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
        let finer = match self.pace.adapts() {
            true => format!(
                ", of {} bytes while its flows move under {} Mbit/s each",
                crate::pace::FINE_PIECE,
                crate::sizing::FLOW_MBPS
            ),
            false => String::new(),
        };
        match (self.piece, self.wires.len()) {
            (0, _) => "whole messages".into(),
            (p, 1) => format!(
                "messages over {p} bytes in up to {} pieces{finer}",
                self.most
            ),
            (p, n) => format!(
                "messages over {p} bytes in up to {} pieces over {n} flows{finer}",
                self.most
            ),
        }
    }

    /// Its pace changed: `fine`, it now cuts messages into as many pieces as it has flows.
    /// The first change each way in a process is logged at INFO, the rest at DEBUG.
    fn paced(&self, fine: bool) {
        static SAID: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
        let what = match fine {
            true => format!(
                "its flows move less than {} Mbit/s each (the network caps each connection): \
                 messages over {} bytes now go in up to {} pieces of {} bytes at least",
                crate::sizing::FLOW_MBPS,
                crate::pace::FINE_PIECE,
                self.most,
                crate::pace::FINE_PIECE
            ),
            false => format!(
                "its flows move faster than {} Mbit/s each again: pieces of {} bytes at least",
                crate::sizing::FLOW_MBPS,
                self.piece
            ),
        };
        match !SAID[fine as usize].swap(true, Ordering::Relaxed) {
            true => tracing::info!("send comm {}: {what}", self.peer_text()),
            false => tracing::debug!("send comm {}: {what}", self.peer_text()),
        }
    }

    /// Its own lane: whole messages and headers go there.
    pub fn lane(&self) -> &Arc<Lane> {
        &self.wires[0].lane
    }

    /// Its lanes, one per flow, its own first.
    pub fn lanes(&self) -> impl Iterator<Item = &Arc<Lane>> {
        self.wires.iter().map(|w| &w.lane)
    }

    /// Whether its buffers need descriptors the caller may not have given: its domains
    /// claim `FI_MR_LOCAL` (see `quirks::claim_local_mr`).
    pub fn needs_descs(&self) -> bool {
        self.needs_descs
    }

    /// The registration this comm made itself of `len` bytes at `data`, made now by
    /// `register` if there is none (at most [`MAX_ADHOC`]).
    pub fn adhoc(
        &self,
        data: usize,
        len: usize,
        register: impl FnOnce() -> Result<Arc<dyn Registered>>,
    ) -> Result<Arc<dyn Registered>> {
        let mut adhoc = self.adhoc.lock();
        if let Some((_, _, r)) = adhoc.iter().find(|(d, l, _)| (*d, *l) == (data, len)) {
            return Ok(r.clone());
        }
        if adhoc.len() >= MAX_ADHOC {
            return Err(Error::InvalidArgument(format!(
                "{MAX_ADHOC} buffers posted without an mhandle on this comm: register buffers \
                 with regMr and pass their mhandles"
            )));
        }
        let r = register()?;
        adhoc.push((data, len, r.clone()));
        Ok(r)
    }

    /// Keeps a registration a send used while this comm lives (once each).
    fn keep(&self, r: Keep) {
        let mut kept = self.kept.lock();
        let same = |k: &Keep| std::ptr::addr_eq(Arc::as_ptr(k), Arc::as_ptr(&r));
        if !kept.iter().any(same) {
            kept.push(r);
        }
    }

    /// How many flows it has.
    pub fn flows(&self) -> usize {
        self.wires.len()
    }

    /// The flow the first piece of the `seq`-th message (per NCCL tag) in `count` pieces
    /// travels on: messages take the flows in turn, so that NCCL's steps of 2 to 4 pieces
    /// each, several in flight, spread over all of a comm's flows rather than its first few.
    /// (`seq` as its tag carries it, which both ends know).
    fn first_flow(&self, seq: u64, count: usize) -> usize {
        let seq = self.lane().tags.seq_of(seq) as usize;
        (seq * count) % self.wires.len()
    }

    /// The flow piece `j` of a message whose first piece travels on flow `first` takes.
    fn wire_of(&self, first: usize, j: usize) -> usize {
        (first + j) % self.wires.len()
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

    /// A free request slot: not held by NCCL, and none of its operations in the
    /// provider's hands (those of a failed request finish after it was reported).
    fn claim(&self) -> Option<&Request> {
        let r = self.requests.iter().find(|r| {
            let busy = |o: &Op| matches!(o.status(), Status::Queued | Status::Posted);
            if r.parts.iter().any(|p| p.all_ops().any(busy)) {
                return false;
            }
            r.held
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        for p in r.parts.iter() {
            p.all_ops().for_each(Op::reset);
        }
        Some(r)
    }

    /// Posts a send (one buffer) or a receive (one buffer, or several grouped: each takes
    /// the send with its NCCL tag). `Ok(None)`: all request slots are taken, or the provider
    /// refused for now; NCCL calls again. Once the first operation is taken the others (a
    /// send's pieces, a grouped receive's further buffers) are handed to the drivers, which
    /// post them on their next turn.
    ///
    /// # Safety
    /// Each buffer must be valid for its length (readable for a send, writable for a
    /// receive) until `test` reports the request done, and its `descs` NULLs or the
    /// descriptors of a registration made on this comm (one per flow).
    pub unsafe fn post(self: &Arc<Self>, bufs: &[Buffer]) -> Result<Option<*mut c_void>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the comm is closed".into()));
        }
        let most = self.requests[0].parts.len();
        if bufs.is_empty() || bufs.len() > most {
            return Err(Error::InvalidArgument(format!(
                "a {} of {} buffers; this comm takes 1 to {most} (maxRecvs)",
                self.what(),
                bufs.len()
            )));
        }
        if let Some(why) = self.peer.liveness.dead() {
            return Err(self.peer_lost(why));
        }
        self.health_check()?;
        let Some(req) = self.claim() else {
            return Ok(None);
        };
        let generation = req
            .generation
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1);
        let mut seqs = self.next_seq.lock();
        // Each buffer's NCCL tag and sequence number, and the last sequence number each NCCL
        // tag would use (no allocation: this runs for every send and receive).
        let mut keys = [(0u64, 0u64); MAX_RECVS];
        let mut taken = [(0u64, 0u64); MAX_RECVS];
        let mut distinct = 0;
        for (i, b) in bufs.iter().enumerate() {
            let key = self.lane().tags.nccl_tag(b.tag);
            let seq = match taken[..distinct].iter_mut().find(|(k, _)| *k == key) {
                Some((_, s)) => {
                    *s += 1;
                    *s
                }
                None => {
                    let s = seqs.get(&key).copied().unwrap_or(0);
                    taken[distinct] = (key, s);
                    distinct += 1;
                    s
                }
            };
            keys[i] = (key, seq);
        }
        let owner = self.clone() as Owner;
        let first = self.wires.first().expect("a comm has a flow");
        // How this send is cut, read once: the header and the pieces must agree.
        let piece = match self.dir {
            Direction::Send => self.pace.piece(),
            Direction::Recv => self.piece,
        };
        // The first operation of buffer `i`: a whole message or header for a send, the
        // receive over the whole buffer for a receive.
        let first_of = |i: usize, whole_desc: &dyn Fn(&Buffer) -> *mut c_void| {
            let (b, part) = (&bufs[i], &req.parts[i]);
            let (key, seq) = keys[i];
            let tag = first.tag(key, seq);
            let transfer = match self.dir {
                Direction::Send => match cut(b.len, piece, self.most) {
                    None => Transfer::Send {
                        buf: b.data,
                        len: b.len,
                        desc: whole_desc(b),
                        dest: first.addr,
                        tag,
                    },
                    Some(layout) => Transfer::Send {
                        buf: b.data,
                        len: 0,
                        desc: b.descs[0],
                        dest: first.addr,
                        tag: first.lane.tags.header(tag, layout),
                    },
                },
                Direction::Recv => Transfer::Recv {
                    buf: b.data,
                    len: b.len,
                    desc: b.descs[0],
                    src: first.source(),
                    tag,
                    ignore: match self.piece {
                        0 => 0,
                        _ => first.lane.tags.first_ignores(),
                    },
                    overflow: b.host,
                },
            };
            Post {
                op: &part.op,
                owner: owner.clone(),
                transfer,
            }
        };
        req.n.store(bufs.len(), Ordering::Relaxed);
        req.posted_at_ms.store(now_ms(), Ordering::Relaxed);
        req.posted_at
            .store(crate::times::stamp(), Ordering::Relaxed);
        req.stall_reported.store(false, Ordering::Relaxed);
        req.straggling_since.store(0, Ordering::Relaxed);
        // Every operation is marked queued before the first can complete (claim() looks at
        // all).
        let mut layouts = [None; MAX_RECVS];
        for (i, (b, part)) in bufs.iter().zip(req.parts.iter()).enumerate() {
            part.posted.store(b.len, Ordering::Relaxed);
            part.settled.store(false, Ordering::Relaxed);
            part.buf.store(b.data, Ordering::Relaxed);
            for (d, &desc) in part.descs.iter().zip(&b.descs) {
                d.store(desc, Ordering::Relaxed);
            }
            part.host.store(b.host, Ordering::Relaxed);
            part.op.mark_queued();
            let layout = match self.dir {
                Direction::Send => cut(b.len, piece, self.most),
                Direction::Recv => None,
            };
            let count = layout.map_or(0, |l| l.count);
            part.used.store(count, Ordering::Relaxed);
            part.first
                .store(self.first_flow(keys[i].1, count), Ordering::Relaxed);
            part.pieces[..count].iter().for_each(Op::mark_queued);
            layouts[i] = layout;
        }
        let paced = match layouts[0] {
            Some(layout) if self.pace.adapts() => layout.size,
            _ => 0,
        };
        req.paced.store(paced, Ordering::Relaxed);
        if paced > 0 {
            req.posted_at_us
                .store(crate::pace::now_us(), Ordering::Relaxed);
        }
        // A send's descriptors: of registrations beginning where the message and each of
        // its pieces begin, where the comm's domains need that (see `Starts`).
        let mut send_descs = [std::ptr::null_mut(); MAX_PIECES + 1];
        if let (Direction::Send, Some(starts)) = (self.dir, bufs[0].starts) {
            let (b, part) = (&bufs[0], &req.parts[0]);
            let start = part.first.load(Ordering::Relaxed);
            // SAFETY: per the caller, `starts` is the buffer's registration, alive while it
            // is posted.
            let starts = unsafe { &*starts };
            self.keep(starts.keep());
            let found = match layouts[0] {
                None => starts.desc_at(0, b.data).map(|d| send_descs[0] = d),
                Some(layout) => (0..layout.count).try_for_each(|j| {
                    let (off, _) = span(b.len, layout, j);
                    // SAFETY: `off` lies within the buffer (see `span`).
                    let at = unsafe { b.data.cast::<u8>().add(off) }.cast();
                    send_descs[j + 1] = starts.desc_at(self.wire_of(start, j), at)?;
                    Ok(())
                }),
            };
            if let Err(e) = found {
                req.withdraw();
                return Err(e);
            }
        }
        let whole_desc = |b: &Buffer| match b.starts {
            Some(_) => send_descs[0],
            None => b.descs[0],
        };
        match self.lane().submit(first_of(0, &whole_desc)) {
            Ok(None) => {
                for &(key, last) in &taken[..distinct] {
                    seqs.insert(key, last.wrapping_add(1));
                }
                // The request is NCCL's now: an endpoint that failed meanwhile is reported
                // by its `test`, which then gives the slot back.
                let hand = |lane: &Lane, post: Post| {
                    if let Err(e) = lane.enqueue(post) {
                        tracing::debug!("an operation handed to a failed endpoint: {e}");
                    }
                };
                for i in 1..bufs.len() {
                    hand(self.lane(), first_of(i, &whole_desc));
                }
                if let (Some(layout), Direction::Send) = (layouts[0], self.dir) {
                    let (b, part) = (&bufs[0], &req.parts[0]);
                    let (key, seq) = keys[0];
                    let start = part.first.load(Ordering::Relaxed);
                    for j in 0..layout.count {
                        let k = self.wire_of(start, j);
                        let wire = &self.wires[k];
                        let (off, len) = span(b.len, layout, j);
                        hand(
                            &wire.lane,
                            Post {
                                op: &part.pieces[j],
                                owner: owner.clone(),
                                transfer: Transfer::Send {
                                    // SAFETY: `off` lies within the buffer (see `span`).
                                    buf: unsafe { b.data.cast::<u8>().add(off) }.cast(),
                                    len,
                                    desc: match b.starts {
                                        Some(_) => send_descs[j + 1],
                                        None => b.descs[k],
                                    },
                                    dest: wire.addr,
                                    tag: wire.lane.tags.piece(wire.tag(key, seq), j),
                                },
                            },
                        );
                    }
                }
                self.refused_since.store(0, Ordering::Relaxed);
                Ok(Some(request::pack(req, generation)))
            }
            Ok(Some(_not_now)) => {
                // The provider said EAGAIN: NCCL calls again with the same buffers. What
                // the provider waits for may be progress on another lane (shm connects to a
                // peer of this process only once that peer's endpoint progresses), or a peer
                // that died with its queues full.
                req.withdraw();
                drop(seqs);
                self.lane().drive_neighbours();
                let now = now_ms();
                let since = first_seen(&self.refused_since, now);
                self.check_peer(Duration::from_millis(now - since))?;
                Ok(None)
            }
            Err(e) => {
                req.withdraw();
                Err(e)
            }
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
            let (changes, fine) = self.pace.changes();
            let pace = match self.pace.adapts() {
                true => format!(
                    "; changed how it cuts {changes} time(s), {} at the end",
                    if fine { "finely" } else { "coarsely" }
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

    /// For a request still in the provider's hands: one stall WARN when it waited past
    /// `NCCL_FABRIC_STALL_WARN_MS`, and the peer's liveness.
    fn watch(&self, r: &Request) -> Result<()> {
        let waited =
            Duration::from_millis(now_ms().saturating_sub(r.posted_at_ms.load(Ordering::Relaxed)));
        if let Some(limit) = self.stall_warn {
            if waited >= limit && !r.stall_reported.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a {} of {} bytes {} has not finished after {} ms{}: the peer is slow or \
                     stopped, or the provider {} is not making progress (known for native \
                     tcp, ofiwg/libfabric#8963)",
                    self.what(),
                    r.bytes_posted(),
                    self.peer_text(),
                    waited.as_millis(),
                    r.parts_in_use()
                        .iter()
                        .filter_map(Part::progress)
                        .collect::<String>(),
                    self.lane().endpoint.provider
                );
            }
        }
        // A dead peer first: its pieces stop too, and the peer's death is what to report.
        self.check_peer(waited)?;
        self.check_stragglers(r)
    }

    /// For a request in pieces: a piece that has not finished long after its siblings did
    /// is on a flow whose connection carries nothing (a path that drops it) while the
    /// others move, which the peer's liveness cannot show. "Long" is 1.5 peer timeouts, or
    /// twice the time the first sibling took, whichever is longer (pieces sharing a slow
    /// flow with other comms' finish later than their siblings, but not that much later).
    fn check_stragglers(&self, r: &Request) -> Result<()> {
        let Some((part, j)) = r
            .parts_in_use()
            .iter()
            .find_map(|p| p.straggler().map(|j| (p, j)))
        else {
            r.straggling_since.store(0, Ordering::Relaxed);
            return Ok(());
        };
        let now = now_ms();
        let since = first_seen(&r.straggling_since, now);
        let took = since.saturating_sub(r.posted_at_ms.load(Ordering::Relaxed));
        // Half a peer timeout past the peer timeout: a peer that died is reported as such
        // first (its liveness fails at the timeout).
        let timeout = self.peer.liveness.timeout().as_millis() as u64;
        let limit = timeout.saturating_add(timeout / 2).max(2 * took);
        let lag = now.saturating_sub(since);
        if lag < limit {
            return Ok(());
        }
        self.failed.store(true, Ordering::Release);
        let k = self.wire_of(part.first.load(Ordering::Relaxed), j);
        Err(Error::Remote(format!(
            "piece {j} of a {} of {} bytes {} has not moved for {lag} ms while the other pieces \
             finished: flow {k} of {} (endpoint {}) carries nothing, its connection cut on the \
             way (a path or middlebox that drops it) while the others work; the comm cannot \
             continue",
            self.what(),
            part.posted.load(Ordering::Relaxed),
            self.peer_text(),
            self.wires.len(),
            crate::fabric::address_text(&self.wires[k].lane.endpoint.name),
        )))
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

impl Request {
    /// The request behind a pointer NCCL handed back.
    ///
    /// # Safety
    /// `p` must be NULL or a pointer whose 64-byte aligned base is readable for a
    /// `Request` (ours, or foreign memory at least that large).
    pub unsafe fn from_handle<'a>(p: *mut c_void) -> Result<&'a Request> {
        let (slot, generation) = request::unpack::<Request>(p);
        if slot.is_null() {
            return Err(Error::InvalidArgument("NULL request".into()));
        }
        // SAFETY: readable per the caller; the magic tells ours from anything else.
        let r = unsafe { &*slot };
        if r.magic != REQUEST_MAGIC {
            return Err(Error::InvalidArgument(format!(
                "request pointer {p:p} is not one this plugin gave out"
            )));
        }
        if !r.held.load(Ordering::Acquire)
            || !request::matches(r.generation.load(Ordering::Acquire), generation)
        {
            return Err(Error::InvalidArgument(format!(
                "request pointer {p:p} is stale: its request was already reported done"
            )));
        }
        Ok(r)
    }

    fn comm(&self) -> &Comm {
        // SAFETY: set at creation to the comm that owns this slot; a held request's comm is
        // alive (NCCL tests requests only before it closes the comm).
        unsafe { &*self.comm.load(Ordering::Acquire) }
    }

    fn parts_in_use(&self) -> &[Part] {
        let n = self.n.load(Ordering::Relaxed).clamp(1, self.parts.len());
        &self.parts[..n]
    }

    fn bytes_posted(&self) -> usize {
        self.parts_in_use()
            .iter()
            .map(|p| p.posted.load(Ordering::Relaxed))
            .sum()
    }

    /// The profiler event slot of each buffer in use.
    pub fn events(&self) -> impl Iterator<Item = &AtomicPtr<c_void>> {
        self.parts_in_use().iter().map(|p| &p.event)
    }

    /// Whether every operation in use has its outcome.
    fn finished(&self) -> bool {
        self.parts_in_use()
            .iter()
            .all(|p| p.ops().all(|o| o.status().finished()))
    }

    /// The flows it travels on, a bit each: the first (whole messages, headers) and those
    /// of its pieces (on a receive, known once its header arrived).
    fn flows_in_use(&self, comm: &Comm) -> u64 {
        self.parts_in_use().iter().fold(1, |mask, p| {
            let first = p.first.load(Ordering::Relaxed);
            (0..p.used.load(Ordering::Relaxed).min(comm.wires.len()))
                .fold(mask, |m, j| m | 1 << comm.wire_of(first, j))
        })
    }

    /// `test`: `Ok(Some(sizes))` when every buffer is done (the slot is then free again),
    /// `Ok(None)` if not; the first failed buffer makes it an error.
    pub fn test(&self) -> Result<Option<Sizes>> {
        let comm = self.comm();
        if !self.finished() {
            comm.drive(self.flows_in_use(comm))?;
            if !comm.lane().threaded
                && now_ms().saturating_sub(self.posted_at_ms.load(Ordering::Relaxed)) >= 1
            {
                comm.lane().drive_neighbours();
            }
        }
        let parts = self.parts_in_use();
        let mut sizes = Sizes {
            n: parts.len(),
            bytes: [0; MAX_RECVS],
        };
        let mut busy = false;
        for (i, p) in parts.iter().enumerate() {
            match p.outcome(comm) {
                Outcome::Busy => busy = true,
                Outcome::Done(bytes) => sizes.bytes[i] = bytes,
                Outcome::Failed(op) => {
                    p.let_go(comm);
                    self.settle_all(comm);
                    return Err(self.failure(comm, p, op));
                }
                Outcome::Longer(sent) => {
                    self.settle_all(comm);
                    self.release();
                    return Err(Error::Truncated {
                        posted: p.posted.load(Ordering::Relaxed),
                        sent,
                        peer: comm.peer_text(),
                    });
                }
                Outcome::Malformed(why) => {
                    p.let_go(comm);
                    self.settle_all(comm);
                    self.release();
                    comm.failed.store(true, Ordering::Release);
                    return Err(Error::Remote(format!(
                        "a message {} arrived malformed: {why}; the peer is not this plugin \
                         or not in step with it",
                        comm.peer_text()
                    )));
                }
            }
        }
        if busy {
            comm.watch(self)?;
            return Ok(None);
        }
        if crate::times::on() {
            self.time(comm, &sizes);
        }
        self.pace(comm);
        self.release();
        Ok(Some(sizes))
    }

    /// A paced send seen done now teaches its comm how fast its flows move (see `pace`).
    fn pace(&self, comm: &Comm) {
        let piece = self.paced.load(Ordering::Relaxed);
        if piece == 0 {
            return;
        }
        let took = crate::pace::now_us().saturating_sub(self.posted_at_us.load(Ordering::Relaxed));
        if let Some(fine) = comm.pace.learn(piece, Duration::from_micros(took)) {
            comm.paced(fine);
        }
    }

    /// Adds a request seen done now to its comm's times: the last of its operations the
    /// provider took, and the last it completed.
    fn time(&self, comm: &Comm, sizes: &Sizes) {
        let (mut taken, mut completed) = (0, 0);
        for op in self.parts_in_use().iter().flat_map(Part::ops) {
            let (t, c) = op.stamps();
            taken = taken.max(t);
            completed = completed.max(c);
        }
        comm.times.add(
            sizes.bytes[..sizes.n].iter().sum(),
            self.posted_at.load(Ordering::Relaxed),
            taken,
            completed,
            crate::times::stamp(),
        );
    }

    /// Before a request is given back with an error: the other buffers whose header arrived
    /// have their pieces taken in by empty receives, so that none is left in the provider;
    /// those still waiting for their message keep their receives until it comes.
    fn settle_all(&self, comm: &Comm) {
        for p in self.parts_in_use() {
            if comm.dir == Direction::Recv {
                match (p.op.status(), p.layout(comm)) {
                    (Status::Done(_), Some(layout)) => p.settle_once(comm, layout, true),
                    _ => p.seal(),
                }
            }
        }
    }

    /// The error of a failed operation of a buffer. The request is given back; operations
    /// of it still in the provider's hands keep the slot from being used again until they
    /// finish.
    fn failure(&self, comm: &Comm, part: &Part, op: &Op) -> Error {
        let f = op.failure();
        let posted = part.posted.load(Ordering::Relaxed);
        self.release();
        let truncated = f
            .as_ref()
            .is_some_and(|f| f.err.unsigned_abs() == sys::FI_ETRUNC);
        if !truncated {
            comm.failed.store(true, Ordering::Release);
        }
        match f {
            // Providers differ in the sign of `err` (shm reports -FI_ETRUNC).
            Some(f) if f.err.unsigned_abs() == sys::FI_ETRUNC => Error::Truncated {
                posted,
                sent: (f.olen > 0).then_some(posted + f.olen),
                peer: comm.peer_text(),
            },
            Some(f) => Error::Completion {
                op: comm.what(),
                len: posted,
                peer: comm.peer_text(),
                code: f.err,
                prov_errno: f.prov_errno,
                text: if f.text.is_empty() {
                    crate::error::fi_strerror(f.err.abs())
                } else {
                    f.text
                },
            },
            None => Error::Remote(format!("{} {} failed", comm.what(), comm.peer_text())),
        }
    }

    /// Gives back a request none of whose buffers reached the provider.
    fn withdraw(&self) {
        for p in self.parts.iter() {
            p.all_ops().for_each(Op::reset);
        }
        self.held.store(false, Ordering::Release);
    }

    fn release(&self) {
        for p in self.parts.iter() {
            p.all_ops()
                .filter(|o| o.status().finished())
                .for_each(Op::reset);
        }
        self.held.store(false, Ordering::Release);
    }
}

/// Where one buffer of a request stands.
enum Outcome<'a> {
    Busy,
    /// Bytes it holds.
    Done(usize),
    /// This operation failed.
    Failed(&'a Op),
    /// The sender's message, of this many bytes (where known), is longer than the receive.
    Longer(Option<usize>),
    Malformed(String),
}

impl Part {
    /// The operations in use: the first, and the pieces.
    fn ops(&self) -> impl Iterator<Item = &Op> {
        let used = self.used.load(Ordering::Relaxed).min(self.pieces.len());
        std::iter::once(&self.op).chain(&self.pieces[..used])
    }

    fn all_ops(&self) -> impl Iterator<Item = &Op> {
        std::iter::once(&self.op).chain(self.pieces.iter())
    }

    /// Where a message in pieces stands, for a stall WARN (`None`: not in pieces).
    fn progress(&self) -> Option<String> {
        let used = self.used.load(Ordering::Relaxed).min(self.pieces.len());
        if used == 0 {
            return None;
        }
        let state = |o: &Op| match o.status() {
            Status::Idle => 'i',
            Status::Queued => 'q',
            Status::Posted => 'p',
            Status::Done(_) => 'd',
            Status::Failed => 'f',
        };
        let pieces: String = self.pieces[..used].iter().map(state).collect();
        Some(format!(
            " (header {}, pieces {pieces}: d done, p with the provider, q queued)",
            state(&self.op)
        ))
    }

    /// The first piece of it not finished while another is, if any.
    fn straggler(&self) -> Option<usize> {
        let used = self.used.load(Ordering::Relaxed).min(self.pieces.len());
        let pieces = &self.pieces[..used];
        let finished = |o: &Op| o.status().finished();
        match pieces.iter().any(finished) {
            true => pieces.iter().position(|o| !finished(o)),
            false => None,
        }
    }

    /// How a received message is cut, from the tag its first part arrived with (`None`: a
    /// whole message, or a comm that takes whole messages only).
    fn layout(&self, comm: &Comm) -> Option<Layout> {
        match (comm.piece, comm.dir) {
            (0, _) | (_, Direction::Send) => None,
            _ => comm.lane().tags.layout_of(self.op.tag()),
        }
    }

    fn outcome(&self, comm: &Comm) -> Outcome<'_> {
        let failed = |o: &&Op| o.status() == Status::Failed;
        if comm.dir == Direction::Send {
            if let Some(op) = self.ops().find(failed) {
                return Outcome::Failed(op);
            }
            if !self.ops().all(|o| o.status().finished()) {
                return Outcome::Busy;
            }
            return Outcome::Done(self.posted.load(Ordering::Relaxed));
        }
        let header = match self.op.status() {
            Status::Done(len) => len,
            Status::Failed => return Outcome::Failed(&self.op),
            _ => return Outcome::Busy,
        };
        let Some(layout) = self.layout(comm) else {
            return Outcome::Done(header);
        };
        if header != 0 {
            return Outcome::Malformed(format!("its header carries {header} bytes"));
        }
        if layout.count > self.pieces.len() {
            return Outcome::Malformed(format!(
                "its header names {} pieces; this comm takes {} at most",
                layout.count,
                self.pieces.len()
            ));
        }
        self.settle_once(comm, layout, false);
        if !self.ops().all(|o| o.status().finished()) {
            return Outcome::Busy;
        }
        let posted = self.posted.load(Ordering::Relaxed);
        // What arrived, what was sent (`None` once a piece's size is unknown: a last piece
        // past the buffer's end that the provider reported without its length), and whether
        // the message was longer than the buffer.
        let (mut got, mut sent, mut longer) = (0, Some(0), false);
        for (j, op) in self.pieces[..layout.count].iter().enumerate() {
            let room = span(posted, layout, j).1;
            let last = j + 1 == layout.count;
            // Every piece but the last is of the layout's size.
            let nominal = (!last).then_some(layout.size);
            match op.status() {
                Status::Done(len)
                    if (!last && len == layout.size)
                        || (last && len >= 1 && len <= layout.size) =>
                {
                    got += len;
                    sent = sent.map(|s| s + len);
                }
                // Cut short at the buffer's end, where the provider reports a receive that
                // overflowed complete with its buffer's length (quirks: truncation unseen).
                Status::Done(len) if len == room && nominal.map_or(true, |n| room < n) => {
                    longer = true;
                    sent = sent.zip(nominal).map(|(s, n)| s + n);
                }
                Status::Done(len) => {
                    return Outcome::Malformed(format!(
                        "piece {j} of {} has {len} bytes, not the {} its header named",
                        layout.count, layout.size
                    ));
                }
                _ => match op.failure() {
                    Some(f) if f.err.unsigned_abs() == sys::FI_ETRUNC => {
                        longer = true;
                        sent = sent.map(|s| s + room + f.olen);
                    }
                    _ => return Outcome::Failed(op),
                },
            }
        }
        match longer {
            true => Outcome::Longer(sent),
            false => Outcome::Done(got),
        }
    }

    /// Once its header arrived: hands each piece's receive to the driver of the flow it
    /// travels on, at its offset in the buffer, or (`drain`, or past the buffer's end) as an
    /// empty receive into the overflow area; once per request. (An error here is the
    /// endpoint's, which the next `test` reports.)
    ///
    /// The driver whose endpoint completed the header calls it at once (see `Owned for
    /// Comm`), so the pieces move whether or not NCCL calls `test` meanwhile; `test` calls it
    /// too, and the first one settles.
    fn settle_once(&self, comm: &Comm, layout: Layout, drain: bool) {
        let _settling = self.settle_lock.lock();
        if self.settled.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(owner) = comm.owner() else {
            return;
        };
        let posted = self.posted.load(Ordering::Relaxed);
        let base = comm.lane().tags.whole(self.op.tag());
        let data = self.buf.load(Ordering::Relaxed);
        let host = self.host.load(Ordering::Relaxed);
        let first = comm.first_flow(comm.lane().tags.seq_of(self.op.tag()), layout.count);
        self.first.store(first, Ordering::Relaxed);
        self.used.store(layout.count, Ordering::Relaxed);
        for (j, op) in self.pieces[..layout.count].iter().enumerate() {
            let k = comm.wire_of(first, j);
            let wire = &comm.wires[k];
            let (off, room) = span(posted, layout, j);
            let (buf, len, desc, overflow) = match drain || room == 0 {
                true => (std::ptr::null_mut(), 0, std::ptr::null_mut(), true),
                // SAFETY: `off` lies within the buffer (room > 0).
                false => (
                    unsafe { data.cast::<u8>().add(off) }.cast(),
                    room,
                    self.descs[k].load(Ordering::Relaxed),
                    host,
                ),
            };
            op.mark_queued();
            let _ = wire.lane.enqueue(Post {
                op,
                owner: owner.clone(),
                transfer: Transfer::Recv {
                    buf,
                    len,
                    desc,
                    src: wire.source(),
                    tag: wire
                        .lane
                        .tags
                        .piece(wire.lane.tags.with_id(base, wire.id), j),
                    ignore: 0,
                    overflow,
                },
            });
        }
    }

    /// No piece of it is handed to the drivers from now on (its request failed, or its comm
    /// closed): a header that arrives later leaves its pieces to the sinks.
    fn seal(&self) {
        let _settling = self.settle_lock.lock();
        self.settled.store(true, Ordering::Release);
    }

    /// A failed receive gives up its pieces (no message will fill them now).
    fn let_go(&self, comm: &Comm) {
        if comm.dir == Direction::Recv {
            for (j, op) in self.ops().skip(1).enumerate() {
                if !op.status().finished() {
                    let k = comm.wire_of(self.first.load(Ordering::Relaxed), j);
                    let _ = comm.wires[k].lane.cancel(op);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_into_a_piece_per_flow_of_a_power_of_two() {
        let k = 1 << 10;
        // Whole: no pieces agreed, one piece's worth, or too short.
        assert_eq!(cut(8 << 20, 0, 16), None);
        assert_eq!(cut(256 * k, 256 * k, 16), None);
        assert_eq!(cut(8 << 20, 256 * k, 1), None);
        // 8 MiB over 16 flows: 16 pieces of 512 KiB.
        assert_eq!(
            cut(8 << 20, 256 * k, 16),
            Some(Layout {
                count: 16,
                size: 512 * k
            })
        );
        // 1 MiB: never below the smallest piece.
        assert_eq!(
            cut(1 << 20, 256 * k, 16),
            Some(Layout {
                count: 4,
                size: 256 * k
            })
        );
        // 5 MiB: 10 pieces of 512 KiB (a power of two holding a sixteenth).
        assert_eq!(
            cut(5 << 20, 256 * k, 16),
            Some(Layout {
                count: 10,
                size: 512 * k
            })
        );
        // One byte over the smallest piece: two pieces.
        assert_eq!(
            cut(256 * k + 1, 256 * k, 16),
            Some(Layout {
                count: 2,
                size: 256 * k
            })
        );
        // A smallest piece that is no power of two rounds up.
        assert_eq!(
            cut(1 << 20, 300 * k, 4),
            Some(Layout {
                count: 2,
                size: 512 * k
            })
        );
        // Past what 32 of the largest pieces hold: whole.
        assert_eq!(cut(3 << 40, 256 * k, 32), None);
        assert_eq!(
            cut(4 << 30, 256 * k, 32),
            Some(Layout {
                count: 32,
                size: MAX_PIECE
            })
        );
        for len in [4097, 65_537, 1 << 20, (1 << 30) + 3, 3 << 32] {
            for most in [2, 4, 7, 16, 32] {
                for piece in [4096, 65_536, 1 << 20] {
                    let Some(l) = cut(len, piece, most) else {
                        assert!(
                            len <= piece || len > MAX_PIECE * most,
                            "{len} {piece} {most}"
                        );
                        continue;
                    };
                    assert!(l.size.is_power_of_two() && l.size >= piece);
                    assert!((2..=most).contains(&l.count), "{l:?}");
                    assert!(l.size * (l.count - 1) < len && len <= l.size * l.count);
                }
            }
        }
    }

    #[test]
    fn pieces_span_the_message_and_stop_at_the_buffer_end() {
        let l = Layout {
            count: 3,
            size: 4096,
        };
        assert_eq!(span(10_000, l, 0), (0, 4096));
        assert_eq!(span(10_000, l, 2), (8192, 10_000 - 8192));
        // A buffer shorter than the message: the piece past its end has no room.
        assert_eq!(span(5000, l, 1), (4096, 904));
        assert_eq!(span(5000, l, 2), (8192, 0));
    }
}
