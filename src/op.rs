//! One posted libfabric operation: the `fi_context2` the provider sees, and the outcome the
//! completion queue reports for it.
//!
//! An `Op` is handed to the provider as the operation's context; whichever thread reads the
//! completion queue finds it again from the completion's `op_context` and records the result
//! with atomics, so it may belong to another comm or thread than the reader.

use crate::endpoint::{Completion, Failure};
use crate::error::Result;
use crate::sys;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

const IDLE: u32 = 0;
const POSTED: u32 = 1;
const DONE: u32 = 2;
const FAILED: u32 = 3;

/// Outcome of a posted operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Idle,
    Posted,
    /// Completed; bytes moved.
    Done(usize),
    Failed,
}

/// Must stay the first field of anything handed to the provider as a context.
#[repr(C)]
pub struct Op {
    ctx: sys::fi_context2,
    state: AtomicU32,
    /// Set while the provider holds the operation (posted, completion not yet read).
    owned_by_provider: AtomicBool,
    len: AtomicUsize,
    failure: Mutex<Option<Failure>>,
}

// SAFETY: the fi_context2 scratch space is only touched by the provider while the operation
// is posted; every other field is atomic or locked.
unsafe impl Send for Op {}
// SAFETY: as above.
unsafe impl Sync for Op {}

impl Default for Op {
    fn default() -> Self {
        Op {
            ctx: sys::fi_context2::default(),
            state: AtomicU32::new(IDLE),
            owned_by_provider: AtomicBool::new(false),
            len: AtomicUsize::new(0),
            failure: Mutex::new(None),
        }
    }
}

impl Op {
    /// The context pointer to pass to libfabric. Call [`Op::posted`] only once the post succeeded.
    pub fn context(&self) -> *mut c_void {
        (self as *const Op).cast_mut().cast()
    }
    /// Posts the operation with `post(context)`, which returns `Ok(true)` if the provider
    /// took it and `Ok(false)` for "try again".
    ///
    /// The op is marked posted *before* the provider sees it: on a shared completion queue
    /// another thread may read its completion before `post` even returns, and that
    /// completion must not be overwritten. If the provider does not take it, the mark is
    /// undone (no completion can come then).
    pub fn post(&self, post: impl FnOnce(*mut c_void) -> Result<bool>) -> Result<bool> {
        self.mark_posted();
        let taken = post(self.context());
        if !matches!(taken, Ok(true)) {
            self.state.store(IDLE, Ordering::Release);
            self.owned_by_provider.store(false, Ordering::Release);
        }
        taken
    }
    /// Marks the op posted: for [`Op::post`], and for an op queued for the progress thread
    /// to post (it counts as the provider's from then on, so a close waits for it).
    pub fn mark_posted(&self) {
        *self.failure.lock() = None;
        self.owned_by_provider.store(true, Ordering::Release);
        self.state.store(POSTED, Ordering::Release);
    }
    pub fn reset(&self) {
        self.state.store(IDLE, Ordering::Release);
    }
    pub fn status(&self) -> Status {
        match self.state.load(Ordering::Acquire) {
            IDLE => Status::Idle,
            POSTED => Status::Posted,
            DONE => Status::Done(self.len.load(Ordering::Relaxed)),
            _ => Status::Failed,
        }
    }
    /// Whether the provider may still write to this op (and its buffer).
    pub fn in_flight(&self) -> bool {
        self.owned_by_provider.load(Ordering::Acquire)
    }
    /// The failure recorded for a [`Status::Failed`] operation.
    pub fn failure(&self) -> Option<Failure> {
        self.failure.lock().clone()
    }
    /// Marks a posted op failed without a completion (e.g. the peer was found dead); the
    /// provider still owns it until it is cancelled and its completion read.
    pub fn fail_locally(&self, err: i32, text: String) {
        *self.failure.lock() = Some(Failure {
            context: self.context(),
            err,
            prov_errno: 0,
            olen: 0,
            text,
        });
        self.state.store(FAILED, Ordering::Release);
    }

    /// Marks an op that never reached the provider failed (its post was refused, or it was
    /// withdrawn from the progress thread's queue): nobody else will touch it.
    pub fn abandon(&self, err: i32, text: String) {
        self.fail_locally(err, text);
        self.owned_by_provider.store(false, Ordering::Release);
    }

    /// Records a completion read from the queue.
    ///
    /// # Safety
    /// `c.context` must be the context of an `Op` posted by this crate that is still alive.
    pub unsafe fn complete(c: &Completion) {
        // SAFETY: guaranteed by the caller: only this crate posts on its endpoints, always with
        // an `Op` (first field of every context) as context, kept alive until completion.
        let op = unsafe { &*c.context.cast::<Op>() };
        op.len.store(c.len, Ordering::Relaxed);
        op.state.store(DONE, Ordering::Release);
        op.owned_by_provider.store(false, Ordering::Release);
    }

    /// Records a failed completion.
    ///
    /// # Safety
    /// As [`Op::complete`].
    pub unsafe fn fail(f: Failure) {
        // SAFETY: as in complete.
        let op = unsafe { &*f.context.cast::<Op>() };
        *op.failure.lock() = Some(f);
        op.state.store(FAILED, Ordering::Release);
        op.owned_by_provider.store(false, Ordering::Release);
    }
}
