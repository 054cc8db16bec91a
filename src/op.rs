//! One libfabric operation: the `fi_context2` the provider sees, and the outcome its driver
//! records for it.
//!
//! Only an endpoint's driver posts operations and reads their completions; other threads
//! (NCCL's `test`) read the outcome through atomics.

use crate::endpoint::Failure;
use crate::sys;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

const IDLE: u32 = 0;
const QUEUED: u32 = 1;
const POSTED: u32 = 2;
const DONE: u32 = 3;
const FAILED: u32 = 4;

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Idle,
    /// Handed to the driver, not yet taken by the provider.
    Queued,
    /// The provider holds it.
    Posted,
    /// Completed; bytes moved.
    Done(usize),
    Failed,
}

impl Status {
    /// Whether the operation has its outcome.
    pub fn finished(self) -> bool {
        matches!(self, Status::Done(_) | Status::Failed)
    }
}

/// Must stay the first field of anything handed to the provider as a context.
#[repr(C)]
pub struct Op {
    ctx: sys::fi_context2,
    state: AtomicU32,
    len: AtomicUsize,
    /// The tag a receive's message came with.
    tag: AtomicU64,
    /// When the provider took it and when it completed (`times`; 0 unless timing is on).
    taken_at: AtomicU64,
    completed_at: AtomicU64,
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
            len: AtomicUsize::new(0),
            tag: AtomicU64::new(0),
            taken_at: AtomicU64::new(0),
            completed_at: AtomicU64::new(0),
            failure: Mutex::new(None),
        }
    }
}

impl Op {
    /// The context pointer to pass to libfabric.
    pub fn context(&self) -> *mut c_void {
        (self as *const Op).cast_mut().cast()
    }
    pub fn status(&self) -> Status {
        match self.state.load(Ordering::Acquire) {
            IDLE => Status::Idle,
            QUEUED => Status::Queued,
            POSTED => Status::Posted,
            DONE => Status::Done(self.len.load(Ordering::Relaxed)),
            _ => Status::Failed,
        }
    }
    /// Handed to a driver.
    pub fn mark_queued(&self) {
        *self.failure.lock() = None;
        self.tag.store(0, Ordering::Relaxed);
        self.taken_at.store(0, Ordering::Relaxed);
        self.completed_at.store(0, Ordering::Relaxed);
        self.state.store(QUEUED, Ordering::Release);
    }
    /// Taken by the provider (the driver's call).
    pub fn mark_posted(&self) {
        self.taken_at
            .store(crate::times::stamp(), Ordering::Relaxed);
        self.state.store(POSTED, Ordering::Release);
    }
    /// Back to idle once its outcome was reported.
    pub fn reset(&self) {
        self.state.store(IDLE, Ordering::Release);
    }
    /// The failure recorded for a [`Status::Failed`] operation.
    pub fn failure(&self) -> Option<Failure> {
        self.failure.lock().clone()
    }
    /// Records a completion: bytes moved, and the tag of what it carried.
    pub fn complete(&self, len: usize, tag: u64) {
        self.len.store(len, Ordering::Relaxed);
        self.tag.store(tag, Ordering::Relaxed);
        self.completed_at
            .store(crate::times::stamp(), Ordering::Relaxed);
        self.state.store(DONE, Ordering::Release);
    }
    /// When the provider took it and when it completed (`times::stamp`, 0 if not read).
    pub fn stamps(&self) -> (u64, u64) {
        (
            self.taken_at.load(Ordering::Relaxed),
            self.completed_at.load(Ordering::Relaxed),
        )
    }
    /// The tag of a finished operation's message, as the provider reported it (0 for a
    /// failure that did not say).
    pub fn tag(&self) -> u64 {
        self.tag.load(Ordering::Relaxed)
    }
    /// Records a failure.
    pub fn fail(&self, f: Failure) {
        self.tag.store(f.tag, Ordering::Relaxed);
        *self.failure.lock() = Some(f);
        self.state.store(FAILED, Ordering::Release);
    }
    /// Records a failure the plugin itself found (no completion entry behind it).
    pub fn fail_with(&self, err: i32, olen: usize, text: String) {
        self.fail_tagged(err, olen, 0, text);
    }
    /// As [`Op::fail_with`], for a message whose tag is known.
    pub fn fail_tagged(&self, err: i32, olen: usize, tag: u64, text: String) {
        self.fail(Failure {
            context: self.context(),
            err,
            prov_errno: 0,
            olen,
            tag,
            text,
        });
    }
}
