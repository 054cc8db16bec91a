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
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Outstanding requests per comm (NCCL keeps at most 8 in flight; its limit is 32).
pub const REQUESTS_PER_COMM: usize = crate::nccl::NET_MAX_REQUESTS;

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

/// A send or receive comm.
pub struct Comm {
    pub dir: Direction,
    pub lane: Arc<Lane>,
    /// The comm id in this pair's data tags (chosen by the receiving lane).
    id: u64,
    pub peer: PeerInfo,
    me: Identity,
    /// The next sequence number; held while posting, so numbers are used in order and one
    /// the provider refused is used again.
    next_seq: Mutex<u64>,
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

/// A request NCCL holds between isend/irecv and the `test` that reports it done.
#[repr(C, align(64))]
pub struct Request {
    /// First field: the provider's context points here.
    op: Op,
    magic: u64,
    comm: AtomicPtr<Comm>,
    generation: AtomicU32,
    /// NCCL holds it (posted and not yet reported done).
    held: AtomicBool,
    /// Bytes posted (send size or receive buffer size).
    posted: AtomicUsize,
    posted_at_ms: AtomicU64,
    stall_reported: AtomicBool,
}

// SAFETY: the comm pointer is the comm that owns the slot, alive while NCCL holds a request;
// every field is atomic (the op's too).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    pub fn new(
        dir: Direction,
        lane: Arc<Lane>,
        id: u64,
        peer: PeerInfo,
        stall_warn: Option<Duration>,
    ) -> Arc<Self> {
        let requests = (0..REQUESTS_PER_COMM)
            .map(|_| Request {
                op: Op::default(),
                magic: REQUEST_MAGIC,
                comm: AtomicPtr::new(std::ptr::null_mut()),
                generation: AtomicU32::new(0),
                held: AtomicBool::new(false),
                posted: AtomicUsize::new(0),
                posted_at_ms: AtomicU64::new(0),
                stall_reported: AtomicBool::new(false),
            })
            .collect();
        let stray_seen = AtomicU64::new(lane.health().stray_errors());
        let comm = Arc::new(Comm {
            dir,
            lane,
            id,
            peer,
            me: Identity::current(),
            next_seq: Mutex::new(0),
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
            if r.op.status() != Status::Idle {
                return false;
            }
            r.held
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Posts one send or receive. `Ok(None)`: all request slots are taken; NCCL retries.
    /// `desc` is the memory registration's descriptor (or NULL); `host`: the buffer is host
    /// memory (a receive into GPU memory gets no overflow area: providers may take every
    /// piece of a receive to be of the first piece's kind).
    ///
    /// # Safety
    /// `buf` must be valid for `len` bytes (readable for a send, writable for a receive)
    /// until `test` reports the request done, and `desc` NULL or a descriptor of this domain.
    pub unsafe fn post(
        self: &Arc<Self>,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        host: bool,
    ) -> Result<Option<*mut c_void>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the comm is closed".into()));
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
        let mut seq = self.next_seq.lock();
        let tag = self.lane.tags.data(self.id, *seq);
        req.posted.store(len, Ordering::Relaxed);
        req.posted_at_ms.store(now_ms(), Ordering::Relaxed);
        req.stall_reported.store(false, Ordering::Relaxed);
        req.op.mark_queued();
        let transfer = match self.dir {
            Direction::Send => Transfer::Send {
                buf,
                len,
                desc,
                dest: self.peer.addr,
                tag,
            },
            Direction::Recv => Transfer::Recv {
                buf,
                len,
                desc,
                src: self.lane.source(self.peer.addr),
                tag,
                ignore: 0,
                overflow: host,
            },
        };
        let owner: Owner = self.clone();
        let post = Post {
            op: &req.op,
            owner,
            transfer,
        };
        match self.lane.submit(post) {
            Ok(None) => {
                *seq = seq.wrapping_add(1);
                self.refused_since.store(0, Ordering::Relaxed);
                Ok(Some(request::pack(req, generation)))
            }
            Ok(Some(_not_now)) => {
                // The provider said EAGAIN: NCCL calls again with the same buffer. What the
                // provider waits for may be progress on another lane (shm connects to a peer
                // of this process only once that peer's endpoint progresses), or a peer that
                // died with its queues full.
                req.release();
                drop(seq);
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
                req.release();
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
            let comm = self.clone();
            SinkSpec {
                src: self.lane.source(self.peer.addr),
                tag: self.lane.tags.data(self.id, 0),
                ignore: self.lane.tags.seq_mask(),
                alive: Box::new(move || healthy(&comm)),
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
                    r.posted.load(Ordering::Relaxed),
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

    /// `test`: `Ok(Some(bytes))` when done (the slot is then free again), `Ok(None)` if not.
    pub fn test(&self) -> Result<Option<usize>> {
        let comm = self.comm();
        if !self.op.status().finished() {
            comm.lane.drive()?;
            if !comm.lane.threaded
                && now_ms().saturating_sub(self.posted_at_ms.load(Ordering::Relaxed)) >= 1
            {
                comm.lane.drive_neighbours();
            }
        }
        match self.op.status() {
            Status::Idle | Status::Queued | Status::Posted => {
                comm.watch(self)?;
                Ok(None)
            }
            Status::Done(len) => {
                let n = match comm.dir {
                    Direction::Send => self.posted.load(Ordering::Relaxed),
                    Direction::Recv => len,
                };
                self.release();
                Ok(Some(n))
            }
            Status::Failed => {
                let f = self.op.failure();
                let posted = self.posted.load(Ordering::Relaxed);
                self.release();
                let truncated = f
                    .as_ref()
                    .is_some_and(|f| f.err.unsigned_abs() == sys::FI_ETRUNC);
                if !truncated {
                    comm.failed.store(true, Ordering::Release);
                }
                Err(match f {
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
                })
            }
        }
    }

    fn release(&self) {
        self.op.reset();
        self.held.store(false, Ordering::Release);
    }
}
