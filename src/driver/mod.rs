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
//!
//! What other threads hand a driver is `commands.rs`; posting to the provider `posting.rs`;
//! reading completions `completion.rs`; closed comms' sinks `sinks.rs`; winding down and
//! closing `closing.rs`.

use crate::endpoint::{Endpoint, Event, Queue};
use crate::error::{Error, Result};
use crate::op::Op;
use crate::wake::Sleep;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

mod closing;
mod commands;
mod completion;
mod posting;
mod sinks;

pub use commands::{owner_key, Command, Inbox, Owned, Owner, Post, Transfer};
use sinks::{is_sink, Sink};
pub use sinks::{SinkSpec, SINK_MESSAGES};

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
    /// Operations NCCL's calls handed to the provider themselves (see `post_inline`).
    by_calls: ByCalls,
}

/// Operations NCCL's calls posted themselves on an endpoint a progress thread drives.
#[derive(Default)]
struct ByCalls {
    /// Since the endpoint opened (told when it closes).
    total: u64,
    /// Since the thread's last turn, which counts them as its work (a thread that found
    /// work keeps spinning rather than napping or sleeping).
    unseen: usize,
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
            by_calls: ByCalls::default(),
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
        let mut work = self.take_commands() + std::mem::take(&mut self.by_calls.unseen);
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
        self.tell_in_flight();
        Ok(work)
    }

    /// Tells the lane's users (and its progress thread) how many operations it holds now.
    fn tell_in_flight(&self) {
        self.health
            .in_flight
            .store(self.in_flight(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::sinks::MAX_SINKS;
    use super::*;
    use crate::endpoint::Failure;
    use crate::fabric::{runtime_version, Domain, Fabric, InfoList};
    use crate::provider::Pass;
    use crate::sys;
    use std::ffi::c_void;

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
