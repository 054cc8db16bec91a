//! Send and receive comms (NCCL's sendComm / recvComm) and their requests.
//!
//! A comm posts by handing its lane's driver an operation ([`crate::lane::Lane::submit`])
//! and learns the outcome from the operation's atomics; it never reads a completion queue.
//! NCCL calls isend/irecv/test from its progress thread and close from its service thread;
//! every field a call changes is atomic.
//!
//! A message longer than the comm's piece size (agreed at connect, see
//! `handshake::agreed_piece`) goes as up to [`MAX_PIECES`] messages of that size, the last
//! taking the rest, all posted at once: the provider then overlaps one piece's rendezvous
//! and data with the others' instead of moving one long message end to end. The sender
//! alone knows how long its message is, so the receiver posts for the longest one its
//! buffer takes: the first receive over the whole buffer (a whole message fits there) and
//! one for each later piece at its offset. The first piece's tag says how many pieces
//! follow (see `tags`); later pieces the message does not have are cancelled, and pieces of
//! a message longer than the buffer are taken in by empty receives (into the overflow area),
//! so that neither side waits on them. Every piece goes on the comm's one lane: more
//! connections at once come from more comms (NCCL's channels) over more lanes.
//!
//! A request is a slot of the comm, aligned to 64 bytes; the pointer NCCL gets carries the
//! slot's generation (see `opaque::request`), so a request already reported done is refused.
//! While the provider holds a request's operation, the driver holds the comm (an `Arc`), so
//! a comm closed with operations in flight lives on until they are cancelled or complete,
//! and close never waits.

use crate::control::{now_ms, Peer};
use crate::driver::{owner_key, Owner, Post, SinkSpec, Transfer};
use crate::error::{Error, Result};
use crate::handshake::Identity;
use crate::lane::{IdLease, Lane};
use crate::op::{Op, Status};
use crate::opaque::{self, request};
use crate::sys;
use crate::tags::MAX_PIECES;
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

/// One buffer of a send or (grouped) receive, as NCCL passes it.
#[derive(Debug, Clone, Copy)]
pub struct Buffer {
    pub data: *mut c_void,
    pub len: usize,
    /// The registration's descriptor on the comm's lane, or NULL.
    pub desc: *mut c_void,
    /// Host memory (a receive into GPU memory gets no overflow area: providers may take
    /// every piece of a receive to be of the first piece's kind).
    pub host: bool,
    /// NCCL's tag: which send a buffer of a grouped receive takes.
    pub tag: i32,
}

const REQUEST_MAGIC: u64 = 0x4e46_4142_5245_5132; // "NFABREQ2"

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

/// What a comm's messages travel on: its lane, the peer's endpoint there, the comm's id in
/// the lane's data tags.
pub struct Wire {
    lane: Arc<Lane>,
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
}

/// A send or receive comm.
pub struct Comm {
    pub dir: Direction,
    /// The NCCL device it is on.
    pub dev: usize,
    wire: Wire,
    pub peer: PeerInfo,
    me: Identity,
    /// Messages longer than this go in pieces of it (0: whole).
    piece: usize,
    /// Itself, for the operations `test` hands the driver (see `Part::settle`).
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
    /// The lane's count of errors without an operation, as this comm last saw it.
    stray_seen: AtomicU64,
    /// Where its requests' time went (`NCCL_FABRIC_TIMES`).
    times: crate::times::Times,
    /// Since when (ms) the provider has refused this comm's posts, 0 if it took the last one:
    /// a peer that stops taking messages is watched like one that stops answering them.
    refused_since: AtomicU64,
}

impl opaque::Kind for Arc<Comm> {
    const MAGIC: u64 = 0x4e46_4142_434f_4d32; // "NFABCOM2"
    const NAME: &'static str = "comm";
}

/// A request NCCL holds between isend/irecv and the `test` that reports it done: one
/// operation per buffer (a send has one, a grouped receive up to [`MAX_RECVS`]).
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
}

/// One buffer's operations.
struct Part {
    /// The whole message, or its first piece (a receive: over the whole buffer).
    op: Op,
    /// Later pieces (none on a comm that sends whole messages); on a receive also the
    /// drains of a sender's pieces beyond the buffer.
    more: Box<[Op]>,
    /// Operations in use: the first and `used - 1` of `more`.
    used: AtomicUsize,
    /// A receive's unused pieces were handed to the driver to cancel (or drains posted).
    settled: AtomicBool,
    /// Bytes posted (send size or receive buffer size).
    posted: AtomicUsize,
    /// A profiler's event handle for it (see `exports`), NULL if none.
    event: AtomicPtr<c_void>,
}

/// How many pieces a message (or a receive) of `len` bytes has with pieces of `piece`.
fn pieces(len: usize, piece: usize) -> usize {
    match piece {
        0 => 1,
        p if len <= p => 1,
        p => len.div_ceil(p).min(MAX_PIECES),
    }
}

/// Offset and length of piece `i` of `count` of `len` bytes (the last takes the rest).
fn span(len: usize, piece: usize, count: usize, i: usize) -> (usize, usize) {
    if count == 1 {
        return (0, len);
    }
    let off = i * piece;
    (off, if i + 1 == count { len - off } else { piece })
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

/// How a comm carries its requests.
pub struct Terms {
    /// After how long an unfinished request is reported.
    pub stall_warn: Option<Duration>,
    /// Buffers a receive may group (a send comm then has that many times
    /// [`REQUESTS_PER_COMM`] requests, each of one buffer).
    pub max_recvs: usize,
    /// Messages longer than this go in pieces of it (0: whole), as both ends agreed.
    pub piece: usize,
}

impl Comm {
    /// A comm on `wire`.
    pub fn new(dir: Direction, dev: usize, wire: Wire, peer: PeerInfo, terms: Terms) -> Arc<Self> {
        let Terms {
            stall_warn,
            max_recvs,
            piece,
        } = terms;
        let max_recvs = max_recvs.clamp(1, MAX_RECVS);
        let later_pieces = match piece {
            0 => 0,
            _ => MAX_PIECES - 1,
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
                        more: (0..later_pieces).map(|_| Op::default()).collect(),
                        used: AtomicUsize::new(1),
                        settled: AtomicBool::new(false),
                        posted: AtomicUsize::new(0),
                        event: AtomicPtr::new(std::ptr::null_mut()),
                    })
                    .collect(),
                posted_at_ms: AtomicU64::new(0),
                posted_at: AtomicU64::new(0),
                stall_reported: AtomicBool::new(false),
            })
            .collect();
        let stray_seen = AtomicU64::new(wire.lane.health().stray_errors());
        let comm = Arc::new_cyclic(|this| Comm {
            this: this.clone(),
            dir,
            dev,
            wire,
            peer,
            piece,
            me: Identity::current(),
            next_seq: Mutex::new(HashMap::new()),
            requests,
            stall_warn,
            closed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            stray_seen,
            times: Default::default(),
            refused_since: AtomicU64::new(0),
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
        match self.piece {
            0 => "whole messages".into(),
            p => format!("messages over {p} bytes in up to {MAX_PIECES} pieces"),
        }
    }

    /// The lane its messages go on.
    pub fn lane(&self) -> &Arc<Lane> {
        &self.wire.lane
    }

    /// Errors of its lane's endpoint itself.
    fn health_check(&self) -> Result<()> {
        self.lane().health().check()
    }

    /// A driver's turn on its lane (see [`Lane::drive`]).
    fn drive(&self) -> Result<()> {
        self.lane().drive()
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
    /// refused for now; NCCL calls again. Once the first buffer is taken the others are
    /// handed to the driver, which posts them on its next turn.
    ///
    /// # Safety
    /// Each buffer must be valid for its length (readable for a send, writable for a
    /// receive) until `test` reports the request done, and its `desc` NULL or the
    /// descriptor of a registration made on this comm.
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
        // Each buffer's tag, and the last sequence number each NCCL tag would use (no
        // allocation: this runs for every send and receive).
        let mut tags = [0u64; MAX_RECVS];
        let mut taken = [(0u64, 0u64); MAX_RECVS];
        let mut keys = 0;
        for (i, b) in bufs.iter().enumerate() {
            let key = self.lane().tags.nccl_tag(b.tag);
            let seq = match taken[..keys].iter_mut().find(|(k, _)| *k == key) {
                Some((_, s)) => {
                    *s += 1;
                    *s
                }
                None => {
                    let s = seqs.get(&key).copied().unwrap_or(0);
                    taken[keys] = (key, s);
                    keys += 1;
                    s
                }
            };
            tags[i] = self.lane().tags.data(self.wire.id, key, seq);
        }
        // Piece `j` of buffer `i`.
        let post_of = |i: usize, j: usize| {
            let (b, part) = (&bufs[i], &req.parts[i]);
            let count = pieces(b.len, self.piece);
            let (off, len) = span(b.len, self.piece, count, j);
            let tag = self.lane().tags.piece(tags[i], j, count);
            // SAFETY: `off` lies within the buffer (see `span`).
            let at = unsafe { b.data.cast::<u8>().add(off) }.cast::<c_void>();
            let transfer = match self.dir {
                Direction::Send => Transfer::Send {
                    buf: at,
                    len,
                    desc: b.desc,
                    dest: self.wire.addr,
                    tag,
                },
                Direction::Recv => {
                    // The first receive takes the whole buffer (a whole message, or a first
                    // piece whatever the count its tag says); later ones their piece.
                    let (buf, len, ignore) = match (j, self.piece) {
                        (0, 0) => (b.data, b.len, 0),
                        (0, _) => (b.data, b.len, self.lane().tags.first_piece_ignores()),
                        _ => (at, len, 0),
                    };
                    Transfer::Recv {
                        buf,
                        len,
                        desc: b.desc,
                        src: self.wire.source(),
                        tag,
                        ignore,
                        overflow: b.host,
                    }
                }
            };
            Post {
                op: part.op_of(j),
                owner: self.clone() as Owner,
                transfer,
            }
        };
        req.n.store(bufs.len(), Ordering::Relaxed);
        req.posted_at_ms.store(now_ms(), Ordering::Relaxed);
        req.posted_at
            .store(crate::times::stamp(), Ordering::Relaxed);
        req.stall_reported.store(false, Ordering::Relaxed);
        // Every operation is marked queued before the first can complete (claim() looks at
        // all).
        for (b, part) in bufs.iter().zip(req.parts.iter()) {
            let count = pieces(b.len, self.piece);
            part.posted.store(b.len, Ordering::Relaxed);
            part.used.store(count, Ordering::Relaxed);
            part.settled.store(false, Ordering::Relaxed);
            (0..count).for_each(|j| part.op_of(j).mark_queued());
        }
        match self.lane().submit(post_of(0, 0)) {
            Ok(None) => {
                for &(key, last) in &taken[..keys] {
                    seqs.insert(key, last.wrapping_add(1));
                }
                // The request is NCCL's now: an endpoint that failed meanwhile is reported
                // by its `test`, which then gives the slot back.
                for (i, b) in bufs.iter().enumerate() {
                    for j in (i == 0) as usize..pieces(b.len, self.piece) {
                        if let Err(e) = self.lane().enqueue(post_of(i, j)) {
                            tracing::debug!("a piece handed to a failed endpoint: {e}");
                        }
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
                let since = match self.refused_since.load(Ordering::Relaxed) {
                    0 => {
                        self.refused_since.store(now, Ordering::Relaxed);
                        now
                    }
                    t => t,
                };
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

    /// `closeSend`/`closeRecv`: returns at once. The driver cancels what is still in
    /// flight and keeps this comm's memory until the provider lets go of it; a receive comm
    /// also leaves a sink for messages of its peer that nothing will receive now.
    pub fn close(self: Arc<Self>) {
        self.closed.store(true, Ordering::Release);
        if let Some(times) = self.times.text() {
            tracing::info!("{} comm {}: {times}", self.what(), self.peer_text());
        }
        let owner: Owner = self.clone();
        let healthy =
            |c: &Comm| !c.failed.load(Ordering::Acquire) && c.peer.liveness.dead().is_none();
        let wire = &self.wire;
        let sink = (self.dir == Direction::Recv && healthy(&self)).then(|| {
            // The sink must not keep the comm (its requests) alive: a weak reference to see
            // a failure while the comm still exists, then the peer's liveness alone.
            let comm = Arc::downgrade(&self);
            let peer = self.peer.liveness.clone();
            // The id stays taken while the sink may match its messages.
            let lease = wire.lease.clone();
            SinkSpec {
                src: wire.source(),
                tag: wire.lane.tags.data(wire.id, 0, 0),
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

    /// For a request still in the provider's hands: one stall WARN when it waited past
    /// `NCCL_FABRIC_STALL_WARN_MS`, and the peer's liveness.
    fn watch(&self, r: &Request) -> Result<()> {
        let waited =
            Duration::from_millis(now_ms().saturating_sub(r.posted_at_ms.load(Ordering::Relaxed)));
        if let Some(limit) = self.stall_warn {
            if waited >= limit && !r.stall_reported.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a {} of {} bytes {} has not finished after {} ms: the peer is slow or \
                     stopped, or the provider {} is not making progress (known for native \
                     tcp, ofiwg/libfabric#8963)",
                    self.what(),
                    r.bytes_posted(),
                    self.peer_text(),
                    waited.as_millis(),
                    self.lane().endpoint.provider
                );
            }
        }
        self.check_peer(waited)
    }

    /// Whether the peer lives, for something that has waited `waited` on it (probing it
    /// when that is long enough, or at once after an error of the endpoint itself).
    fn check_peer(&self, waited: Duration) -> Result<()> {
        let stray = self.lane().health().stray_errors();
        let urgent = self.stray_seen.swap(stray, Ordering::AcqRel) != stray;
        self.peer
            .liveness
            .watch(waited, urgent)
            .map_err(|why| self.peer_lost(&why))
    }
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

    /// `test`: `Ok(Some(sizes))` when every buffer is done (the slot is then free again),
    /// `Ok(None)` if not; the first failed buffer makes it an error.
    pub fn test(&self) -> Result<Option<Sizes>> {
        let comm = self.comm();
        if !self.finished() {
            comm.drive()?;
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
                        sent: Some(sent),
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
        self.release();
        Ok(Some(sizes))
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

    /// Before a request is given back with an error: the other buffers whose first piece
    /// arrived have their unused pieces cancelled (or drained) now, as their `test` would
    /// have; those still waiting for their message keep their receives until it comes.
    fn settle_all(&self, comm: &Comm) {
        for p in self.parts_in_use() {
            if comm.dir == Direction::Recv
                && !p.more.is_empty()
                && matches!(p.op.status(), Status::Done(_))
            {
                p.settle_once(comm);
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
    /// The sender's message, of this many bytes, is longer than the receive.
    Longer(usize),
    Malformed(String),
}

impl Part {
    /// The operation of piece `j`.
    fn op_of(&self, j: usize) -> &Op {
        match j {
            0 => &self.op,
            j => &self.more[j - 1],
        }
    }

    /// The operations in use.
    fn ops(&self) -> impl Iterator<Item = &Op> {
        let used = self
            .used
            .load(Ordering::Relaxed)
            .clamp(1, self.more.len() + 1);
        std::iter::once(&self.op).chain(&self.more[..used - 1])
    }

    fn all_ops(&self) -> impl Iterator<Item = &Op> {
        std::iter::once(&self.op).chain(self.more.iter())
    }

    fn outcome(&self, comm: &Comm) -> Outcome<'_> {
        let failed = |o: &&Op| o.status() == Status::Failed;
        if comm.dir == Direction::Send || self.more.is_empty() {
            if let Some(op) = self.ops().find(failed) {
                return Outcome::Failed(op);
            }
            if !self.ops().all(|o| o.status().finished()) {
                return Outcome::Busy;
            }
            return Outcome::Done(match (comm.dir, self.op.status()) {
                (Direction::Recv, Status::Done(len)) => len,
                _ => self.posted.load(Ordering::Relaxed),
            });
        }
        // A receive on a comm that splits long messages: the first piece says how many.
        let count = comm.lane().tags.pieces_of(self.op.tag());
        // The receive's own pieces (`used` grows by the drains).
        let posted = self.receive_pieces(comm);
        let first = match self.op.status() {
            Status::Done(len) => len,
            Status::Failed => {
                // A first piece longer than the whole receive: the pieces after it are
                // drained before the truncation is reported, so that none is left behind.
                let truncated = self
                    .op
                    .failure()
                    .filter(|f| f.err.unsigned_abs() == sys::FI_ETRUNC);
                let Some(f) = truncated.filter(|_| count > 1) else {
                    return Outcome::Failed(&self.op);
                };
                self.settle_once(comm);
                if !self.ops().all(|o| o.status().finished()) {
                    return Outcome::Busy;
                }
                let first = self.posted.load(Ordering::Relaxed) + f.olen;
                return Outcome::Longer(first + self.later_bytes(comm, posted));
            }
            _ => return Outcome::Busy,
        };
        if count > 1 && first != comm.piece {
            return Outcome::Malformed(format!(
                "its first piece has {first} bytes, not the {} agreed",
                comm.piece
            ));
        }
        self.settle_once(comm);
        if !self.ops().all(|o| o.status().finished()) {
            return Outcome::Busy;
        }
        if count > posted {
            return Outcome::Longer(first + self.later_bytes(comm, posted));
        }
        // Pieces beyond the message's were cancelled: their outcome does not count (and
        // count <= posted: the message's pieces are all of this receive's).
        let mut bytes = first;
        for op in &self.more[..count - 1] {
            match op.status() {
                Status::Done(len) => bytes += len,
                _ => return Outcome::Failed(op),
            }
        }
        Outcome::Done(bytes)
    }

    /// How many pieces this buffer's receive posted.
    fn receive_pieces(&self, comm: &Comm) -> usize {
        pieces(self.posted.load(Ordering::Relaxed), comm.piece)
    }

    /// The bytes the later pieces of a message longer than the receive carried: what each
    /// received, and what each truncated one (a drain receives nothing) did not.
    fn later_bytes(&self, comm: &Comm, posted: usize) -> usize {
        let len = self.posted.load(Ordering::Relaxed);
        self.ops()
            .enumerate()
            .skip(1)
            .map(|(j, o)| match o.status() {
                Status::Done(got) => got,
                _ => {
                    let room = match j < posted {
                        true => span(len, comm.piece, posted, j).1,
                        false => 0,
                    };
                    room + o.failure().map_or(0, |f| f.olen)
                }
            })
            .sum()
    }

    /// Once the first piece arrived (or failed as longer than the receive): cancels the
    /// receives of pieces the message does not have, or takes the pieces of a message longer
    /// than the buffer into the overflow area; once per request. (An error here is the
    /// endpoint's, which the next `test` reports.)
    fn settle_once(&self, comm: &Comm) {
        if self.settled.swap(true, Ordering::AcqRel) {
            return;
        }
        let count = comm.lane().tags.pieces_of(self.op.tag());
        let posted = self.receive_pieces(comm);
        for j in count..posted {
            let _ = comm.lane().cancel(self.op_of(j));
        }
        // A drain is an empty receive: its piece goes to the overflow area, or, where the
        // endpoint has none, the provider reports it truncated.
        let (true, Some(owner)) = (count > posted, comm.owner()) else {
            return;
        };
        let tag = comm.lane().tags.whole(self.op.tag());
        self.used.store(count, Ordering::Relaxed);
        for j in posted..count {
            let op = self.op_of(j);
            op.mark_queued();
            let _ = comm.lane().enqueue(Post {
                op,
                owner: owner.clone(),
                transfer: Transfer::Recv {
                    buf: std::ptr::null_mut(),
                    len: 0,
                    desc: std::ptr::null_mut(),
                    src: comm.wire.source(),
                    tag: comm.lane().tags.piece(tag, j, count),
                    ignore: 0,
                    overflow: true,
                },
            });
        }
    }

    /// A failed receive gives up its later pieces (no message will fill them now).
    fn let_go(&self, comm: &Comm) {
        if comm.dir == Direction::Recv && !self.settled.swap(true, Ordering::AcqRel) {
            for op in self.ops().skip(1) {
                if !op.status().finished() {
                    let _ = comm.lane().cancel(op);
                }
            }
        }
    }
}
