//! Send and receive comms (NCCL's sendComm / recvComm) and their requests.
//!
//! A comm posts by handing its lane's driver an operation ([`crate::lane::Lane::submit`])
//! and learns the outcome from the operation's atomics; it never reads a completion queue.
//! NCCL calls isend/irecv/test from its progress thread and close from its service thread;
//! every field a call changes is atomic.
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
use crate::lane::Lane;
use crate::op::{Op, Status};
use crate::opaque::{self, request};
use crate::sys;
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
    /// The registration's descriptor, or NULL.
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
    /// The peer's data endpoint in this lane's address vector.
    pub addr: sys::fi_addr_t,
    pub who: Identity,
    /// Its process's liveness.
    pub liveness: Arc<Peer>,
}

/// A comm's id in its pair's data tags: chosen by the receiving lane (and held there while
/// anything of the comm may still match), or given by the peer that chose it.
pub enum CommId {
    Leased(Arc<crate::lane::IdLease>),
    Peer(u64),
}

/// A send or receive comm.
pub struct Comm {
    pub dir: Direction,
    /// The NCCL device it is on.
    pub dev: usize,
    pub lane: Arc<Lane>,
    /// The comm id in this pair's data tags (chosen by the receiving lane).
    id: u64,
    /// The receiving lane's hold on `id`.
    lease: Option<Arc<crate::lane::IdLease>>,
    pub peer: PeerInfo,
    me: Identity,
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
    stall_reported: AtomicBool,
}

/// One buffer's operation.
struct Part {
    op: Op,
    /// Bytes posted (send size or receive buffer size).
    posted: AtomicUsize,
    /// A profiler's event handle for it (see `exports`), NULL if none.
    event: AtomicPtr<c_void>,
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

impl Comm {
    /// `max_recvs`: buffers a receive may group (a send comm then has that many times
    /// [`REQUESTS_PER_COMM`] requests, each of one buffer).
    pub fn new(
        dir: Direction,
        dev: usize,
        lane: Arc<Lane>,
        id: CommId,
        peer: PeerInfo,
        stall_warn: Option<Duration>,
        max_recvs: usize,
    ) -> Arc<Self> {
        let max_recvs = max_recvs.clamp(1, MAX_RECVS);
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
                        posted: AtomicUsize::new(0),
                        event: AtomicPtr::new(std::ptr::null_mut()),
                    })
                    .collect(),
                posted_at_ms: AtomicU64::new(0),
                stall_reported: AtomicBool::new(false),
            })
            .collect();
        let stray_seen = AtomicU64::new(lane.health().stray_errors());
        let (id, lease) = match id {
            CommId::Leased(l) => (l.id, Some(l)),
            CommId::Peer(id) => (id, None),
        };
        let comm = Arc::new(Comm {
            dir,
            dev,
            lane,
            id,
            lease,
            peer,
            me: Identity::current(),
            next_seq: Mutex::new(HashMap::new()),
            requests,
            stall_warn,
            closed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            stray_seen,
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

    fn what(&self) -> &'static str {
        match self.dir {
            Direction::Send => "send",
            Direction::Recv => "receive",
        }
    }

    fn claim(&self) -> Option<&Request> {
        self.requests.iter().find(|r| {
            if r.parts.iter().any(|p| p.op.status() != Status::Idle) {
                return false;
            }
            r.held
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Posts a send (one buffer) or a receive (one buffer, or several grouped: each takes
    /// the send with its NCCL tag). `Ok(None)`: all request slots are taken, or the provider
    /// refused for now; NCCL calls again. Once the first buffer is taken the others are
    /// handed to the driver, which posts them on its next turn.
    ///
    /// # Safety
    /// Each buffer must be valid for its length (readable for a send, writable for a
    /// receive) until `test` reports the request done, and its `desc` NULL or a descriptor
    /// of this comm's domain.
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
        self.lane.health().check()?;
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
            let key = self.lane.tags.nccl_tag(b.tag);
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
            tags[i] = self.lane.tags.data(self.id, key, seq);
        }
        let post_of = |i: usize| {
            let (b, part, tag) = (&bufs[i], &req.parts[i], tags[i]);
            let transfer = match self.dir {
                Direction::Send => Transfer::Send {
                    buf: b.data,
                    len: b.len,
                    desc: b.desc,
                    dest: self.peer.addr,
                    tag,
                },
                Direction::Recv => Transfer::Recv {
                    buf: b.data,
                    len: b.len,
                    desc: b.desc,
                    src: self.lane.source(self.peer.addr),
                    tag,
                    ignore: 0,
                    overflow: b.host,
                },
            };
            Post {
                op: &part.op,
                owner: self.clone() as Owner,
                transfer,
            }
        };
        req.n.store(bufs.len(), Ordering::Relaxed);
        req.posted_at_ms.store(now_ms(), Ordering::Relaxed);
        req.stall_reported.store(false, Ordering::Relaxed);
        // Every part is marked queued before the first can complete (claim() looks at all).
        for (b, part) in bufs.iter().zip(req.parts.iter()) {
            part.posted.store(b.len, Ordering::Relaxed);
            part.op.mark_queued();
        }
        match self.lane.submit(post_of(0)) {
            Ok(None) => {
                for &(key, last) in &taken[..keys] {
                    seqs.insert(key, last.wrapping_add(1));
                }
                for i in 1..bufs.len() {
                    self.lane.enqueue(post_of(i))?;
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
                self.lane.drive_neighbours();
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
        let owner: Owner = self.clone();
        let healthy =
            |c: &Comm| !c.failed.load(Ordering::Acquire) && c.peer.liveness.dead().is_none();
        let sink = (self.dir == Direction::Recv && healthy(&self)).then(|| {
            // The sink must not keep the comm (its requests) alive: a weak reference to
            // see a failure while the comm still exists, then the peer's liveness alone.
            let comm = Arc::downgrade(&self);
            let peer = self.peer.liveness.clone();
            // The id stays taken while the sink may match its messages.
            let lease = self.lease.clone();
            SinkSpec {
                src: self.lane.source(self.peer.addr),
                tag: self.lane.tags.data(self.id, 0, 0),
                ignore: self.lane.tags.below_id(),
                alive: Box::new(move || {
                    let _held = &lease;
                    peer.dead().is_none()
                        && comm
                            .upgrade()
                            .map_or(true, |c| !c.failed.load(Ordering::Acquire))
                }),
            }
        });
        self.lane.retire_owner(owner_key(&owner), sink);
        self.lane.release_user();
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
                    self.lane.endpoint.provider
                );
            }
        }
        self.check_peer(waited)
    }

    /// Whether the peer lives, for something that has waited `waited` on it (probing it
    /// when that is long enough, or at once after an error of the endpoint itself).
    fn check_peer(&self, waited: Duration) -> Result<()> {
        let stray = self.lane.health().stray_errors();
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

    /// `test`: `Ok(Some(sizes))` when every buffer is done (the slot is then free again),
    /// `Ok(None)` if not; the first failed buffer makes it an error.
    pub fn test(&self) -> Result<Option<Sizes>> {
        let comm = self.comm();
        let finished = |r: &Request| r.parts_in_use().iter().all(|p| p.op.status().finished());
        if !finished(self) {
            comm.lane.drive()?;
            if !comm.lane.threaded
                && now_ms().saturating_sub(self.posted_at_ms.load(Ordering::Relaxed)) >= 1
            {
                comm.lane.drive_neighbours();
            }
        }
        let parts = self.parts_in_use();
        if let Some(failed) = parts.iter().find(|p| p.op.status() == Status::Failed) {
            return Err(self.failure(comm, failed));
        }
        if !finished(self) {
            comm.watch(self)?;
            return Ok(None);
        }
        let mut sizes = Sizes {
            n: parts.len(),
            bytes: [0; MAX_RECVS],
        };
        for (i, p) in parts.iter().enumerate() {
            sizes.bytes[i] = match (comm.dir, p.op.status()) {
                (Direction::Recv, Status::Done(len)) => len,
                _ => p.posted.load(Ordering::Relaxed),
            };
        }
        self.release();
        Ok(Some(sizes))
    }

    /// The error of a failed buffer. The request is given back; buffers of it still in the
    /// provider's hands keep the slot from being used again until they finish.
    fn failure(&self, comm: &Comm, part: &Part) -> Error {
        let f = part.op.failure();
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
            p.op.reset();
        }
        self.held.store(false, Ordering::Release);
    }

    fn release(&self) {
        for p in self.parts.iter() {
            if matches!(p.op.status(), Status::Done(_) | Status::Failed) {
                p.op.reset();
            }
        }
        self.held.store(false, Ordering::Release);
    }
}
