//! What other threads hand a driver: operations to post, each with the owner that keeps its
//! memory alive, and commands (post, retire an owner, close after another endpoint, cancel),
//! pushed into its [`Inbox`] and carried out at the start of its next turn.

use super::{Driver, SinkSpec};
use crate::endpoint::Endpoint;
use crate::op::Op;
use crate::sys;
use crate::wake::Waker;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// What holds operations: it keeps their memory alive while the provider holds them, and
/// hears of each completion in the driver's thread, once the operation shows it.
pub trait Owned: Send + Sync {
    /// One of its operations completed (or failed). Runs inside a driver's turn: it may
    /// hand the drivers more operations (commands), never wait for one.
    fn completed(&self, _op: &Op) {}
    /// Whether it is a closed comm's sink.
    fn is_sink(&self) -> bool {
        false
    }
}

/// What keeps an operation's memory alive while the provider holds it.
pub type Owner = Arc<dyn Owned>;

/// The identity of an owner, for withdrawing its operations.
pub fn owner_key(owner: &Owner) -> usize {
    Arc::as_ptr(owner).cast::<()>() as usize
}

/// A send or receive to hand to the provider.
#[derive(Clone, Copy)]
pub enum Transfer {
    Send {
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        dest: sys::fi_addr_t,
        tag: u64,
    },
    Recv {
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        /// Only from this source (`sys::ADDR_UNSPEC`: any).
        src: sys::fi_addr_t,
        tag: u64,
        /// Tag bits that need not match.
        ignore: u64,
        /// Whether the overflow area may follow (host memory only).
        overflow: bool,
    },
}

impl Transfer {
    /// NCCL's bytes: what is sent, or the room of a receive.
    pub fn bytes(&self) -> usize {
        match *self {
            Transfer::Send { len, .. } | Transfer::Recv { len, .. } => len,
        }
    }
}

/// An operation for the driver to post.
pub struct Post {
    pub op: *const Op,
    pub owner: Owner,
    pub transfer: Transfer,
}

// SAFETY: the pointers are the owner's buffer, descriptor and op, which the owner (carried
// along) keeps valid until the operation completes; they are only used to post it.
unsafe impl Send for Post {}

/// What other threads ask of a driver.
pub enum Command {
    Post(Post),
    /// Withdraw the queued operations of the owner with this key (a comm that closed), and
    /// cancel its posted receives: NCCL may free their buffers once the comm is closed, and a
    /// message of a peer still sending would land there (a receive the provider is already
    /// filling may still finish; not where `quirks::cancel_at_close` says no). For a
    /// receiving owner, `sink` (tag and ignored bits) names the messages still to come for
    /// it, which are then taken in and dropped (see [`SINK_MESSAGES`](super::SINK_MESSAGES)).
    Retire {
        owner: usize,
        sink: Option<SinkSpec>,
    },
    /// Close this endpoint only after `receiver` has closed (see
    /// `quirks::sender_waits_for_receiver`).
    CloseAfter(Weak<Endpoint>),
    /// Cancel the receive of this operation (its context's address): a piece no message
    /// will fill (see `comm`). Still waiting, it fails at once with `ECANCELED`; posted, the
    /// provider is asked to cancel it; already complete, nothing happens.
    Cancel(usize),
}

/// Commands waiting for a driver. Pushing never blocks on the driver's work.
#[derive(Default)]
pub struct Inbox {
    queue: Mutex<VecDeque<Command>>,
    len: AtomicUsize,
    /// The progress thread that drives, woken when a command arrives (none where NCCL's
    /// calls drive).
    waker: OnceLock<Arc<Waker>>,
}

impl Inbox {
    /// The progress thread that drives from now on.
    pub fn set_waker(&self, w: Arc<Waker>) {
        let _ = self.waker.set(w);
    }
    pub fn push(&self, c: Command) {
        let mut q = self.queue.lock();
        q.push_back(c);
        self.len.store(q.len(), Ordering::Release);
        drop(q);
        self.wake();
    }
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }
    /// Wakes the progress thread that drives, without a command (an NCCL call posted for it).
    pub fn wake(&self) {
        if let Some(w) = self.waker.get() {
            w.wake();
        }
    }
    fn take(&self) -> VecDeque<Command> {
        if self.is_empty() {
            return VecDeque::new();
        }
        let mut q = self.queue.lock();
        self.len.store(0, Ordering::Release);
        std::mem::take(&mut *q)
    }
}

impl Driver {
    pub(super) fn take_commands(&mut self) -> usize {
        let commands = self.inbox.take();
        let n = commands.len();
        for c in commands {
            match c {
                Command::Post(p) => self.waiting.push_back(p),
                Command::Retire { owner: key, sink } => {
                    let usable =
                        |s: &SinkSpec| self.queue.endpoint().overflow.is_some() && (s.alive)();
                    if let Some(spec) = sink.filter(usable) {
                        self.add_sink(spec);
                    }
                    self.waiting.retain(|p| {
                        if owner_key(&p.owner) != key {
                            return true;
                        }
                        // SAFETY: the op lives in its owner, which `p` still holds.
                        unsafe { &*p.op }.fail_with(
                            libc::ECANCELED,
                            0,
                            "cancelled before it was posted".into(),
                        );
                        false
                    });
                    let provider = &self.queue.endpoint().provider;
                    if crate::quirks::cancel_at_close(provider, crate::fabric::runtime_version()) {
                        let posted: Vec<usize> = (self.in_flight.iter())
                            .filter(|(_, f)| f.posted.is_some() && owner_key(&f.owner) == key)
                            .map(|(&c, _)| c)
                            .collect();
                        for c in posted {
                            // A receive the provider is filling already may finish anyway.
                            let _ = self.queue.cancel(c);
                        }
                    }
                }
                Command::CloseAfter(receiver) => self.close_after.push(receiver),
                Command::Cancel(context) => self.cancel(context),
            }
        }
        n
    }

    /// See [`Command::Cancel`].
    fn cancel(&mut self, context: usize) {
        if self.in_flight.contains_key(&context) {
            // An answer other than 0 is normal for a receive that completed meanwhile (its
            // entry not yet read); a provider that cannot cancel leaves the request waiting,
            // which the stall WARN then names (pieces are offered only where cancels work,
            // see `quirks::pieces_pay`).
            let r = self.queue.cancel(context);
            if r != 0 {
                tracing::debug!(
                    "{}: fi_cancel of a piece's receive answered {r}",
                    self.label
                );
            }
            return;
        }
        self.waiting.retain(|p| {
            // SAFETY: as in take_commands.
            let op = unsafe { &*p.op };
            if op.context() as usize != context {
                return true;
            }
            op.fail_with(libc::ECANCELED, 0, "cancelled before it was posted".into());
            false
        });
    }
}
