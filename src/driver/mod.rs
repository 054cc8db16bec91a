//! The driver of one endpoint: the only code that posts to its [`Queue`] and reads its
//! completions.
//!
//! Other threads hand it [`Command`]s through its [`Inbox`]; whoever owns the `Driver` (a
//! lane's progress thread, the NCCL thread holding the lane's lock, or the control thread)
//! runs [`Driver::turn`], which posts what was handed in, reads completions into their
//! [`Op`]s, withdraws what a closed owner had not posted yet, and keeps its sinks posted.
//! Every operation in the provider's hands keeps its owner (an `Arc`) alive until its
//! completion is read or the endpoint is closed, so closing an owner never waits and never
//! frees memory the provider may still use. An endpoint nobody uses any more winds down
//! ([`Driver::wind_down`]) and closes once nothing is posted ([`Driver::finish`]).

use crate::endpoint::{Endpoint, Event, Queue, Retired};
use crate::error::{Error, Result};
use crate::op::Op;
use crate::sys;
use crate::wake::{Sleep, Waker};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

mod completion;
mod sinks;

use sinks::{is_sink, Sink};
pub use sinks::{SinkSpec, SINK_MESSAGES};

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
    /// it, which are then taken in and dropped (see [`SINK_MESSAGES`]).
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
        if let Some(w) = self.waker.get() {
            w.wake();
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
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

/// What a driver reports to the users of its endpoint.
#[derive(Default)]
pub struct Health {
    /// Set when the completion queue itself failed: the endpoint carries nothing any more.
    broken: OnceLock<String>,
    /// Counts errors the provider reported without an operation (an error of the endpoint,
    /// such as a lost connection): users then check their peers at once.
    stray_errors: AtomicU64,
    /// Operations in the provider's hands or waiting for it, as of the driver's last turn.
    in_flight: AtomicUsize,
}

impl Health {
    pub fn broken(&self) -> Option<&str> {
        self.broken.get().map(String::as_str)
    }
    pub fn stray_errors(&self) -> u64 {
        self.stray_errors.load(Ordering::Acquire)
    }
    /// Whether the driver held operations at the end of its last turn.
    pub fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }
    pub fn check(&self) -> Result<()> {
        match self.broken() {
            Some(e) => Err(Error::Remote(format!(
                "the endpoint's completion queue failed ({e}); every comm on it is lost"
            ))),
            None => Ok(()),
        }
    }
}

struct InFlight {
    op: *const Op,
    owner: Owner,
    /// For a receive: the bytes NCCL posted (the rest of the receive is the overflow area).
    posted: Option<usize>,
    /// What was posted, to post again if a stranger's message took it (see `settle`).
    transfer: Transfer,
}

/// The one owner of an endpoint's [`Queue`].
pub struct Driver {
    queue: Queue,
    inbox: Arc<Inbox>,
    health: Arc<Health>,
    /// Taken from the inbox, not yet accepted by the provider (it said EAGAIN).
    waiting: VecDeque<Post>,
    /// One WARN at most per minute about messages from strangers.
    strangers: crate::log::Throttle,
    in_flight: HashMap<usize, InFlight>,
    close_after: Vec<Weak<Endpoint>>,
    sinks: Vec<Sink>,
    /// When a sink was last posted or took in a message.
    sink_activity: Instant,
    events: Vec<Event>,
    /// Where the provider's name and what it drives are told in log lines.
    label: String,
}

// SAFETY: the raw op pointers in `in_flight` and `waiting` point into their owners, which are
// carried along; the driver moves between threads but is used by one at a time.
unsafe impl Send for Driver {}

impl Driver {
    pub fn new(queue: Queue, inbox: Arc<Inbox>, health: Arc<Health>, label: String) -> Self {
        Driver {
            queue,
            inbox,
            health,
            waiting: VecDeque::new(),
            strangers: crate::log::Throttle::new(Duration::from_secs(60)),
            in_flight: HashMap::new(),
            close_after: Vec::new(),
            sinks: Vec::new(),
            sink_activity: Instant::now(),
            events: Vec::with_capacity(crate::endpoint::CQ_BATCH),
            label,
        }
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        self.queue.endpoint()
    }

    /// Nothing left to do but sinks (which take in a closed comm's stragglers as long as the
    /// endpoint stays open).
    pub fn idle(&self) -> bool {
        self.inbox.is_empty()
            && self.waiting.iter().all(|p| is_sink(&p.owner))
            && self.in_flight.values().all(|f| is_sink(&f.owner))
    }

    /// Whether this (sending) endpoint waits for a receiving endpoint of this process that
    /// is still open: it must not be driven once its own users are gone (the receiver may
    /// close at any time, and progress would then touch the receiver's freed memory).
    pub fn waits_for_receiver(&self) -> bool {
        self.close_after.iter().any(|w| w.strong_count() > 0)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.waiting.len()
    }

    /// Whether it may sleep now, after a turn that found nothing (see [`Sleep`]): on the
    /// provider's wait object, where `fi_trywait` says nothing is ready.
    pub fn sleep_check(&mut self) -> Sleep {
        let Some(fd) = self.queue.wait_fd() else {
            return Sleep::Cannot;
        };
        if !self.waiting.is_empty() {
            return Sleep::Cannot;
        }
        match self.queue.may_sleep() {
            true => Sleep::On(fd),
            false => Sleep::Ready,
        }
    }

    /// One round: take commands, post, read completions, renew sinks. Returns how much
    /// happened (0: nothing to do). An error means the queue itself failed; it is also
    /// recorded in [`Health`].
    pub fn turn(&mut self) -> Result<usize> {
        let serial = self.queue.serial();
        let _turn = serial.as_deref().map(Mutex::lock);
        self.health.check()?;
        let mut work = self.take_commands();
        work += self.post_waiting();
        match self.read_completions() {
            Ok(n) => work += n,
            Err(e) => {
                let _ = self.health.broken.set(e.to_string());
                tracing::warn!("{}: completion queue failed: {e}", self.label);
                // Whoever asked sees what every later call on the endpoint sees.
                return self.health.check().map(|()| 0);
            }
        }
        if !self.sinks.is_empty() {
            self.renew_sinks();
        }
        self.health
            .in_flight
            .store(self.in_flight(), Ordering::Release);
        Ok(work)
    }

    fn take_commands(&mut self) -> usize {
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

    /// Posts what waits, oldest first. A destination (or the receive side) that answers
    /// EAGAIN is skipped for the rest of the round, so one full peer does not hold back the
    /// others.
    fn post_waiting(&mut self) -> usize {
        if self.waiting.is_empty() {
            return 0;
        }
        let mut posted = 0;
        let mut blocked_dests: Vec<sys::fi_addr_t> = Vec::new();
        let mut receives_blocked = false;
        let mut kept = VecDeque::new();
        while let Some(p) = self.waiting.pop_front() {
            let blocked = match &p.transfer {
                Transfer::Send { dest, .. } => blocked_dests.contains(dest),
                Transfer::Recv { .. } => receives_blocked,
            };
            if blocked {
                kept.push_back(p);
                continue;
            }
            match self.hand_over(p) {
                Some(p) => {
                    match &p.transfer {
                        Transfer::Send { dest, .. } => blocked_dests.push(*dest),
                        Transfer::Recv { .. } => receives_blocked = true,
                    }
                    kept.push_back(p);
                }
                None => posted += 1,
            }
        }
        self.waiting = kept;
        posted
    }

    /// Posts one operation now, on behalf of an NCCL call (lanes driven by NCCL's calls).
    /// What others handed in goes first (posting order is matching order); with nothing
    /// handed in the post goes straight to the provider and completions wait for the next
    /// turn (NCCL's `test` drives one). If the provider says EAGAIN, a turn of progress and
    /// one more try; then the operation comes back, so NCCL calls again as it does for any
    /// "not now".
    pub fn post_now(&mut self, p: Post) -> Result<Option<Post>> {
        if !self.inbox.is_empty() || !self.waiting.is_empty() {
            self.turn()?;
        } else if let Some(e) = self.health.broken() {
            return Err(Error::Remote(e.to_string()));
        }
        match self.hand_over(p) {
            None => Ok(None),
            Some(p) => {
                self.turn()?;
                Ok(self.hand_over(p))
            }
        }
    }

    /// Hands one operation to the provider. `Some(p)` back: it said EAGAIN. A refused
    /// operation is failed with the provider's error (its owner hears it from `test`).
    fn hand_over(&mut self, p: Post) -> Option<Post> {
        match self.post(&p) {
            Ok(Some(capacity)) => {
                // SAFETY: as in take_commands.
                let op = unsafe { &*p.op };
                op.mark_posted();
                self.in_flight.insert(
                    op.context() as usize,
                    InFlight {
                        op: p.op,
                        owner: p.owner,
                        posted: capacity,
                        transfer: p.transfer,
                    },
                );
                None
            }
            Ok(None) => Some(p),
            Err(e) => {
                let code = match &e {
                    Error::Fabric { code, .. } => *code,
                    _ => libc::EIO,
                };
                // SAFETY: as in take_commands.
                unsafe { &*p.op }.fail_with(code, 0, e.to_string());
                None
            }
        }
    }

    /// Hands one operation to the provider: `Ok(Some(posted))` when taken (`posted`: NCCL's
    /// bytes of a receive), `Ok(None)` for EAGAIN.
    fn post(&mut self, p: &Post) -> Result<Option<Option<usize>>> {
        // SAFETY: the op lives in its owner, held by `p`.
        let ctx = unsafe { &*p.op }.context();
        match p.transfer {
            Transfer::Send {
                buf,
                len,
                desc,
                dest,
                tag,
            } => {
                // SAFETY: the owner keeps buffer, descriptor and op alive until completion
                // (or until the queue is closed, which happens before the owner is dropped).
                let taken = unsafe { self.queue.send(buf, len, desc, dest, tag, ctx)? };
                Ok(taken.then_some(None))
            }
            Transfer::Recv {
                buf,
                len,
                desc,
                src,
                tag,
                ignore,
                overflow,
            } => {
                let ep = self.queue.endpoint();
                let overflow = (ep.overflow.is_some() && overflow)
                    .then(|| crate::overflow::for_receive(len, ep.max_msg_size))
                    .flatten();
                let mut iov = [
                    libc::iovec {
                        iov_base: buf,
                        iov_len: len,
                    },
                    libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    },
                ];
                let area_desc = ep.overflow.unwrap_or(0) as *mut c_void;
                let mut descs = [desc, area_desc];
                let pieces = match overflow {
                    // Nothing of NCCL's (a sink): the area alone, not after an empty piece
                    // (shm 1.17's segmented copies stall on a receive that starts with one).
                    Some((area, room)) if len == 0 => {
                        iov[0] = libc::iovec {
                            iov_base: area.cast(),
                            iov_len: room,
                        };
                        descs[0] = area_desc;
                        1
                    }
                    Some((area, room)) => {
                        iov[1] = libc::iovec {
                            iov_base: area.cast(),
                            iov_len: room,
                        };
                        2
                    }
                    None => 1,
                };
                // SAFETY: as for sends; the overflow area is mapped for the process's life.
                let taken = unsafe {
                    self.queue
                        .recv(&iov[..pieces], &mut descs[..pieces], src, tag, ignore, ctx)?
                };
                Ok(taken.then_some(Some(len)))
            }
        }
    }

    /// Nothing at all in the provider's hands or waiting for it.
    pub fn empty(&self) -> bool {
        self.inbox.is_empty() && self.waiting.is_empty() && self.in_flight.is_empty()
    }

    /// One round for an endpoint nobody uses any more: once only sinks are left and they have
    /// taken nothing in for `quiet`, they are cancelled too. Returns whether the endpoint is
    /// [`Driver::empty`], so it can close (2.1 tcp;ofi_rxm cannot close the domain of an
    /// endpoint closed with operations still posted).
    pub fn wind_down(&mut self, quiet: Duration) -> bool {
        let _ = self.turn();
        if !self.sinks.is_empty() && self.idle() && self.sink_activity.elapsed() >= quiet {
            self.cancel_all(true);
            let _ = self.turn();
        }
        self.empty()
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

    /// Cancels what is still in flight or waiting (its owners are gone): all of it, or all
    /// but the sinks, which go on taking in stragglers, so that a peer's sends to closed
    /// comms finish rather than being dropped with the endpoint (2.1 tcp;ofi_rxm cannot
    /// close a domain whose endpoint closed with unfinished sends).
    pub fn cancel_all(&mut self, sinks_too: bool) {
        if sinks_too {
            self.sinks.clear();
        }
        let contexts: Vec<usize> = self
            .in_flight
            .iter()
            .filter(|(_, f)| sinks_too || !is_sink(&f.owner))
            .map(|(&c, _)| c)
            .collect();
        for c in contexts {
            let _ = self.queue.cancel(c);
        }
        self.waiting.retain(|p| {
            if !sinks_too && is_sink(&p.owner) {
                return true;
            }
            // SAFETY: as in take_commands.
            unsafe { &*p.op }.fail_with(libc::ECANCELED, 0, "endpoint closed".into());
            false
        });
    }

    /// Closes the endpoint (or, for a sender whose receiver in this process is still open,
    /// leaves it to that receiver to close after itself), then lets go of the owners of
    /// whatever was still in flight.
    pub fn finish(mut self) {
        let _ = self.take_commands();
        for p in self.waiting.drain(..) {
            // SAFETY: as in take_commands.
            unsafe { &*p.op }.fail_with(libc::ECANCELED, 0, "endpoint closed".into());
        }
        if !self.in_flight.is_empty() {
            tracing::debug!(
                "{}: closing with {} operation(s) still in the provider's hands",
                self.label,
                self.in_flight.len()
            );
        }
        let keep: Vec<Box<dyn Send + Sync>> = self
            .in_flight
            .drain()
            .map(|(_, f)| Box::new(f.owner) as Box<dyn Send + Sync>)
            .collect();
        let retired = Retired {
            queue: self.queue,
            keep,
        };
        match self.close_after.iter().find_map(Weak::upgrade) {
            Some(receiver) => receiver.close_before(retired),
            None => drop(retired),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sinks::MAX_SINKS;
    use super::*;
    use crate::endpoint::Failure;
    use crate::fabric::{runtime_version, Domain, Fabric, InfoList};
    use crate::provider::Pass;

    /// A driver over a real shm endpoint of this process.
    fn shm_driver() -> (Driver, Arc<Health>) {
        let settings = crate::settings::Settings::from_lookup(|k| {
            (k == crate::settings::PROVIDER).then(|| "shm".to_string())
        })
        .expect("settings");
        let hints = crate::discover::hints(Pass::Host, true, &settings);
        let list = InfoList::get(runtime_version(), &hints).expect("fi_getinfo");
        let info = list.iter().next().expect("an shm entry");
        let fabric = Fabric::open(info).expect("fabric");
        let domain = Domain::open(&fabric, info).expect("domain");
        let (_, queue) = Endpoint::open(&domain, None).expect("endpoint");
        let health = Arc::new(Health::default());
        let driver = Driver::new(queue, Arc::default(), health.clone(), "test".into());
        (driver, health)
    }

    #[test]
    fn errors_without_an_operation_and_unknown_contexts_are_survived() {
        let (mut d, health) = shm_driver();
        // An error of the endpoint itself, as rxm and shm write them (no context).
        d.settle(Event::Failed(Failure {
            context: std::ptr::null_mut(),
            err: libc::ECONNRESET,
            prov_errno: 0,
            olen: 0,
            tag: 0,
            text: String::new(),
        }));
        assert_eq!(
            health.stray_errors(),
            1,
            "counted, so comms check their peers"
        );
        assert!(health.broken().is_none(), "the endpoint itself goes on");
        // A completion for an operation this driver never posted is not dereferenced.
        let bogus = 0x5eed_0000usize as *mut c_void;
        d.settle(Event::Done {
            src: None,
            context: bogus,
            len: 8,
            tag: 0,
        });
        d.settle(Event::Failed(Failure {
            context: bogus,
            err: libc::EIO,
            prov_errno: 0,
            olen: 0,
            tag: 0,
            text: String::new(),
        }));
        assert!(d.turn().is_ok());
        assert!(d.empty());
        d.finish();
    }

    #[test]
    fn a_sink_that_takes_nothing_in_is_cancelled() {
        let (mut d, _) = shm_driver();
        d.inbox.push(Command::Retire {
            owner: 1,
            sink: Some(SinkSpec {
                src: sys::ADDR_UNSPEC,
                tag: 0x7_0000,
                ignore: 0xffff,
                alive: Box::new(|| true),
            }),
        });
        d.turn().expect("turn");
        assert_eq!(d.sinks.len(), 1);
        assert!(!d.empty(), "the sink is posted");
        assert!(d.idle(), "a sink alone does not keep the endpoint busy");
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !d.empty() {
            assert!(
                std::time::Instant::now() < until,
                "the sink was never cancelled"
            );
            d.turn().expect("turn");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(d.sinks.is_empty());
        d.finish();
    }

    #[test]
    fn sinks_beyond_the_limit_push_out_the_oldest() {
        let (mut d, _) = shm_driver();
        let sink = |i: u64| Command::Retire {
            owner: i as usize + 1,
            sink: Some(SinkSpec {
                src: sys::ADDR_UNSPEC,
                tag: i << 16,
                ignore: 0xffff,
                alive: Box::new(|| true),
            }),
        };
        for i in 0..MAX_SINKS as u64 + 8 {
            d.inbox.push(sink(i));
            d.turn().expect("turn");
        }
        // The 8 oldest were told to end; once their cancellations complete, the limit holds.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while d.sinks.len() > MAX_SINKS {
            assert!(std::time::Instant::now() < until, "{} sinks", d.sinks.len());
            d.turn().expect("turn");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(d.sinks.len(), MAX_SINKS);
        assert!(d.sinks.iter().all(|s| !s.expiring), "the newest are kept");
        d.cancel_all(true);
        let _ = d.turn();
        d.finish();
    }
}
