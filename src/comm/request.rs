//! A comm's request slots and `test`, which reports where a request stands and watches one
//! that waits (stalls, stragglers, the peer's liveness).
//!
//! A request is a slot of the comm, aligned to 64 bytes; the pointer NCCL gets carries the
//! slot's generation (see `opaque::request`), so a request already reported done is refused.

use super::part::{Outcome, Part};
use super::{first_seen, Comm, Direction, MAX_RECVS};
use crate::control::now_ms;
use crate::error::{Error, Result};
use crate::op::{Op, Status};
use crate::opaque::request;
use crate::sys;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub(super) const REQUEST_MAGIC: u64 = 0x4e46_4142_5245_5133; // "NFABREQ3"

/// A request NCCL holds between isend/irecv and the `test` that reports it done: one
/// operation per buffer (a send has one, a grouped receive up to [`MAX_RECVS`]), and its
/// pieces'.
#[repr(C, align(64))]
pub struct Request {
    pub(super) magic: u64,
    pub(super) comm: AtomicPtr<Comm>,
    pub(super) generation: AtomicU32,
    /// NCCL holds it (posted and not yet reported done).
    pub(super) held: AtomicBool,
    /// Buffers in use.
    pub(super) n: AtomicUsize,
    pub(super) parts: Box<[Part]>,
    pub(super) posted_at_ms: AtomicU64,
    /// When NCCL posted it (`times::stamp`, 0 unless timing is on).
    pub(super) posted_at: AtomicU64,
    pub(super) stall_reported: AtomicBool,
    /// Since when (ms) `test` has seen some of its pieces finished and others not (0: not).
    pub(super) straggling_since: AtomicU64,
    /// A send whose comm learns its pace from it (see `Pace::times`): the bytes it is timed
    /// by (0: none).
    pub(super) paced: AtomicUsize,
    /// Those bytes are the whole message, sent on the first flow.
    pub(super) paced_whole: AtomicBool,
    /// The message's length, if it is paced.
    pub(super) paced_len: AtomicUsize,
    /// When it was posted (`pace::now_us`), if it is paced.
    pub(super) posted_at_us: AtomicU64,
}

/// What `test` reports of a finished request: bytes per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub n: usize,
    pub bytes: [usize; MAX_RECVS],
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

    /// The parts its last post used. Those past them are idle: a post marks only the parts
    /// of its buffers, after `claim` found the last post's idle and reset them.
    pub(super) fn parts_in_use(&self) -> &[Part] {
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
        let sample = crate::pace::Sample {
            bytes: piece,
            len: self.paced_len.load(Ordering::Relaxed),
            whole: self.paced_whole.load(Ordering::Relaxed),
            posted_us: self.posted_at_us.load(Ordering::Relaxed),
            done_us: crate::pace::now_us(),
        };
        if let Some(change) = comm.pace.learn(sample) {
            comm.paced(change);
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
    pub(super) fn withdraw(&self) {
        for p in self.parts.iter() {
            p.all_ops().for_each(Op::reset);
        }
        self.held.store(false, Ordering::Release);
    }

    fn release(&self) {
        for p in self.parts_in_use() {
            p.all_ops()
                .filter(|o| o.status().finished())
                .for_each(Op::reset);
        }
        self.held.store(false, Ordering::Release);
    }
}

impl Comm {
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
}
