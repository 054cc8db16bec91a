//! Sends and receives handed to an endpoint's progress thread to post.
//!
//! With `NCCL_FABRIC_POST_FROM=progress`, NCCL's isend/irecv only queue the operation here and
//! the endpoint's progress thread hands it to the provider. Providers that copy data inside
//! the call that posts a receive (shm copies a message that arrived before its receive inside
//! `fi_trecv`) then copy on the endpoint's own thread: NCCL's proxy thread, which serves every
//! channel of a GPU, never waits for a copy or for the provider's endpoint lock.

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::sys;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

/// A send or receive waiting to be posted.
pub struct Pending {
    pub op: *const Op,
    pub kind: PendingKind,
    pub buf: *mut c_void,
    pub len: usize,
    pub desc: *mut c_void,
    pub tag: u64,
}

#[derive(Debug, Clone, Copy)]
pub enum PendingKind {
    Send { dest: sys::fi_addr_t },
    Recv,
}

// SAFETY: the pointers are the caller's buffer, descriptor and op, which the posting rules of
// `Comm::post` keep valid until the operation completes; they are only used to post it.
unsafe impl Send for Pending {}

impl Pending {
    /// Hands the operation to the provider: `Ok(false)` means EAGAIN, try again later.
    ///
    /// # Safety
    /// The op, buffer and descriptor must still be valid (guaranteed while the op is queued
    /// or held by the progress thread: a comm only frees them once its ops are retired).
    pub unsafe fn submit(&self, ep: &Endpoint) -> Result<bool> {
        // SAFETY: see above; `op` is the context the completion will carry.
        let ctx = unsafe { (*self.op).context() };
        // SAFETY: as above.
        unsafe {
            match self.kind {
                PendingKind::Send { dest } => {
                    ep.tsend(self.buf, self.len, self.desc, dest, self.tag, ctx)
                }
                PendingKind::Recv => ep.trecv(self.buf, self.len, self.desc, self.tag, ctx),
            }
        }
    }
}

/// The queue between NCCL's threads and one endpoint's progress thread.
#[derive(Default)]
pub struct Handoff {
    queue: Mutex<VecDeque<Pending>>,
    /// Entries in `queue`, read without the lock by the spinning progress thread.
    len: AtomicUsize,
    /// The progress thread, unparked when work arrives while it naps.
    worker: OnceLock<Thread>,
}

impl Handoff {
    /// Records the thread that drains this queue.
    pub fn set_worker(&self, t: Thread) {
        let _ = self.worker.set(t);
    }

    pub fn push(&self, p: Pending) {
        let mut q = self.queue.lock();
        q.push_back(p);
        self.len.store(q.len(), Ordering::Release);
        drop(q);
        if let Some(t) = self.worker.get() {
            t.unpark();
        }
    }

    /// Posts what is queued, in order, until the queue is empty or the provider says EAGAIN.
    /// An operation the provider refuses is failed with that error. Returns how many left the
    /// queue.
    pub fn drain(&self, ep: &Endpoint) -> usize {
        if self.len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut moved = 0;
        while let Some(p) = self.pop() {
            // SAFETY: a queued or popped op keeps its comm alive (see `Comm::close`).
            match unsafe { p.submit(ep) } {
                Ok(true) => moved += 1,
                Ok(false) => {
                    self.push_front(p);
                    break;
                }
                Err(e) => {
                    // SAFETY: as above.
                    unsafe { &*p.op }.abandon(refused_code(&e), e.to_string());
                    moved += 1;
                }
            }
        }
        moved
    }

    /// Takes the queued operations among `ops` out of the queue and marks them cancelled;
    /// used when their comm closes.
    pub fn withdraw(&self, mut ops: impl FnMut(*const Op) -> bool) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut q = self.queue.lock();
        q.retain(|p| {
            if !ops(p.op) {
                return true;
            }
            // SAFETY: the op is queued, so its comm is alive (it is the one closing).
            unsafe { &*p.op }.abandon(libc::ECANCELED, "cancelled before it was posted".into());
            false
        });
        self.len.store(q.len(), Ordering::Release);
    }

    fn pop(&self) -> Option<Pending> {
        let mut q = self.queue.lock();
        let p = q.pop_front();
        self.len.store(q.len(), Ordering::Release);
        p
    }

    fn push_front(&self, p: Pending) {
        let mut q = self.queue.lock();
        q.push_front(p);
        self.len.store(q.len(), Ordering::Release);
    }
}

/// The errno a refused post is recorded with.
fn refused_code(e: &Error) -> i32 {
    match e {
        Error::Fabric { code, .. } => *code,
        _ => libc::EIO,
    }
}
