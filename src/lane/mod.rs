//! Lanes: the data endpoints of a device, and the pool that hands them to comms.
//!
//! A lane is one endpoint (on a libfabric domain of its own: libfabric 2.x tcp drives all
//! sockets of a domain under one lock) with its driver. Its driver is fixed when it opens:
//! its own progress thread ([`crate::progress`]), or NCCL's calls, which take turns under
//! the lane's lock. Either way, NCCL's isend/irecv only hand operations to the driver
//! ([`Lane::submit`]); nothing else posts.
//!
//! How a device's lanes are shared, kept and closed is in `pool`; which lanes a comm's flows
//! take, in `placement`.

use crate::driver::{Command, Driver, Health, Inbox, Post};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::progress::{Crew, Driven, Worker};
use crate::sys;
use crate::tags::Tags;
use crate::wake::Sleep;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

mod placement;
mod pool;

pub use placement::{first_lane, flow_lane, flow_slots, lane_thread, most_flows};
pub use pool::{Adopt, LaneConfig, LanePool, Opening, Schedule};

/// Which side of a comm pair a lane serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Receive comms (made by accept).
    Receiving = 0,
    /// Send comms (made by connect).
    Sending = 1,
}

/// One data endpoint and its driver.
pub struct Lane {
    pub endpoint: Arc<Endpoint>,
    pub role: Role,
    pub tags: Tags,
    /// Whether a progress thread drives it (else NCCL's calls do).
    pub threaded: bool,
    /// A progress thread drives it, and NCCL's calls take turns too when the thread is not
    /// in one (`NCCL_FABRIC_PROGRESS_THREAD=both`).
    calls_help: bool,
    /// A progress thread drives it, and NCCL's calls post sends and receives of at most
    /// this many bytes themselves when the lane is free (`NCCL_FABRIC_INLINE_POST_BYTES`;
    /// 0: none).
    inline_post: usize,
    inbox: Arc<Inbox>,
    health: Arc<Health>,
    /// Its driver (`None` once retired): whoever holds this lock takes the driver's turn, its
    /// progress thread or an NCCL call.
    link: Mutex<Option<Box<Driver>>>,
    /// The progress thread that drives it, and the crew that thread belongs to (kept while
    /// the lane lives).
    worker: OnceLock<(Arc<Worker>, Arc<Crew>)>,
    /// Ids of the comms on this lane (drawn at random, see `tags`).
    ids: Mutex<std::collections::HashSet<u64>>,
    /// Peers already in the address vector: each address is inserted once.
    peers: Mutex<HashMap<Vec<u8>, sys::fi_addr_t>>,
    /// Comms and registrations using the lane (changed under the pool's lock).
    users: AtomicUsize,
    /// When the last user left (a shared lane lingering in its slot).
    idle_since: Mutex<Option<std::time::Instant>>,
    /// When an NCCL call last drove the lane (`control::now_ms`).
    last_call: AtomicU64,
    /// When a turn last found work (`control::now_ms`): the provider may still owe the peer
    /// messages of its own then (a rendezvous' acknowledgement), which only turns send.
    last_work: AtomicU64,
    /// When the control thread last gave it a turn with nothing owed (see `Lane::nudge`).
    last_idle_turn: AtomicU64,
    pool: Weak<LanePool>,
    /// Its place in the pool (`None`: a lane of one comm).
    slot: Option<usize>,
}

impl Lane {
    /// Hands an operation to the driver. Where a progress thread drives, it takes everything
    /// (it retries what the provider refuses for now), but a short operation the call posts
    /// itself when nobody is in the lane and nothing waits before it (see
    /// [`Driver::post_inline`]). With NCCL's calls driving, the call posts it at
    /// once and gives it back (`Some`) when the provider says "not now", for NCCL to call
    /// again; if another call is driving the lane right now, the operation is left in the
    /// inbox for that call's next turn (or this comm's next `test`) rather than waiting for
    /// the lane: a call that sleeps on a lock may wait a whole scheduler time slice to run
    /// again on a busy machine (8 B ping-pong with one busy core: 3 ms instead of 20 µs).
    pub fn submit(&self, post: Post) -> Result<Option<Post>> {
        if self.threaded {
            // A failed endpoint refuses the post while the request can still be withdrawn.
            // Once handed over the post is the driver's, and the request must stay: an error
            // of this turn, or a failure from now on, reaches it through the lane's health
            // when it is tested.
            self.health.check()?;
            // A short message goes to the provider from this call when the lane is free:
            // the thread would pick it up within a sweep of its endpoints, and on a small
            // message's one-way trip that is time the peer waits.
            if self.inline_post > 0 && post.transfer.bytes() <= self.inline_post {
                if let Some(mut link) = self.link.try_lock() {
                    if let Some(d) = &mut *link {
                        d.post_inline(post)?;
                        drop(link);
                        // Its completion is the thread's to read, even where it dozes.
                        self.inbox.wake();
                        return Ok(None);
                    }
                }
            }
            // Else through the inbox: posting order is matching order, and the thread
            // retries what the provider refuses for now.
            self.inbox.push(Command::Post(post));
            let _ = self.drive();
            return Ok(None);
        }
        self.last_call
            .store(crate::control::now_ms(), Ordering::Relaxed);
        let back = match self.link.try_lock() {
            Some(mut link) => match &mut *link {
                Some(d) => d.post_now(post)?,
                None => {
                    return Err(crate::error::Error::InvalidArgument(
                        "the endpoint is closed".into(),
                    ))
                }
            },
            None => {
                self.inbox.push(Command::Post(post));
                None
            }
        };
        self.health.check()?;
        Ok(back)
    }

    /// Progress for lanes of the same device that NCCL's calls drive, when a request has
    /// waited a while: NCCL's calls are their one driver, and a rank waiting on a receive
    /// may be what a send of its own lane needs to move. A lane busy in another call, or
    /// with nothing in flight and nothing waiting, is skipped (the pool's nudge still turns
    /// those now and then). Once per millisecond per device at most: NCCL's proxy thread
    /// calls `test` without pause, and listing the lanes of a device of 16 flows on every
    /// call cost the comms of the 2-core machine 10-15 % of their rate at 64 KiB.
    pub fn drive_neighbours(&self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        if !pool.neighbours_due(crate::control::now_ms()) {
            return;
        }
        for lane in pool.driven_by_calls() {
            if std::ptr::eq(&*lane, self) || !Driven::busy(&*lane) {
                continue;
            }
            if let Some(mut link) = lane.link.try_lock() {
                if let Some(d) = &mut *link {
                    let _ = d.turn();
                }
            }
        }
    }

    /// Withdraws what the owner with this key (a closing comm) handed in but the provider
    /// does not have yet; `sink` as in [`Command::Retire`].
    pub fn retire_owner(&self, key: usize, sink: Option<crate::driver::SinkSpec>) {
        self.inbox.push(Command::Retire { owner: key, sink });
        if let Err(e) = self.drive() {
            tracing::debug!("while cancelling a closed comm's operations: {e}");
        }
    }

    /// Asks the driver to cancel a receive no message will fill (see [`Command::Cancel`]);
    /// its outcome then shows in the operation.
    pub fn cancel(&self, op: &crate::op::Op) -> Result<()> {
        self.inbox.push(Command::Cancel(op.context() as usize));
        self.drive()
    }

    /// Keeps this (sending) lane's endpoint open until `receiver` has closed.
    pub fn close_after(&self, receiver: Weak<Endpoint>) {
        self.inbox.push(Command::CloseAfter(receiver));
    }

    /// Progress on behalf of an NCCL call: one turn of the driver, unless a progress thread
    /// drives (and calls do not help it), or another NCCL call or the thread is driving the
    /// lane at this moment (then that turn is this one's too: nobody waits for the lane).
    /// Errors of the endpoint itself are returned.
    pub fn drive(&self) -> Result<()> {
        if !self.threaded || self.calls_help {
            let now = crate::control::now_ms();
            self.last_call.store(now, Ordering::Relaxed);
            if let Some(mut link) = self.link.try_lock() {
                if let Some(d) = &mut *link {
                    if d.turn()? > 0 {
                        self.last_work.store(now, Ordering::Relaxed);
                    }
                }
            }
        }
        self.health.check()
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The control thread's turn for a lane NCCL's calls drive: taken only when no call drove
    /// it for [`NUDGE`] and the provider holds operations of it, commands wait for it (a
    /// receive's pieces, handed over when its header arrived), or it found work less than
    /// [`NUDGE_TAIL`] ago (a receiver whose last receive completed still owes its sender the
    /// rendezvous' acknowledgement, which the sender's request waits for), and never waited
    /// for (a call driving it now is the turn). A lane with none of that still gets a turn
    /// every [`IDLE_NUDGE`]: a peer's first messages to it need one (rxm accepts a
    /// connection, and tcp reads what arrived, only inside a turn), and a receiver may post
    /// nothing until its peer's sends are in.
    fn nudge(&self) {
        let now = crate::control::now_ms();
        let since = now.saturating_sub(self.last_call.load(Ordering::Relaxed));
        if since < NUDGE.as_millis() as u64 {
            return;
        }
        let worked = now.saturating_sub(self.last_work.load(Ordering::Relaxed));
        let idle_for = now.saturating_sub(self.last_idle_turn.load(Ordering::Relaxed));
        if let Some(mut link) = self.link.try_lock() {
            if let Some(d) = &mut *link {
                let owed = worked < NUDGE_TAIL.as_millis() as u64 || !self.inbox.is_empty();
                let due = d.in_flight() > 0 || owed || idle_for >= IDLE_NUDGE.as_millis() as u64;
                if !due {
                    return;
                }
                if !owed {
                    self.last_idle_turn.store(now, Ordering::Relaxed);
                }
                if d.turn().is_ok_and(|n| n > 0) {
                    self.last_work.store(now, Ordering::Relaxed);
                }
            }
        }
    }

    /// A random comm id, unique on this lane until it is forgotten (see [`Lane::lease_id`]).
    fn next_id(&self) -> u64 {
        let mut ids = self.ids.lock();
        loop {
            let id = crate::random::u64() & self.tags.id_mask();
            if ids.insert(id) {
                return id;
            }
        }
    }

    /// A comm id of this lane, held until the lease's last holder (the comm, and the sink
    /// its close leaves for the peer's stragglers) lets go: a lane that serves communicator
    /// after communicator does not collect the ids of closed ones.
    pub fn lease_id(self: &Arc<Self>) -> Arc<IdLease> {
        Arc::new(IdLease {
            id: self.next_id(),
            lane: Arc::downgrade(self),
        })
    }

    /// The comm with this id is gone (and so are its messages).
    fn forget_id(&self, id: u64) {
        self.ids.lock().remove(&id);
    }

    /// Hands an operation to the driver for its next turn, never refused here: for the
    /// further buffers of a grouped receive, once the first was taken.
    pub fn enqueue(&self, post: Post) -> Result<()> {
        self.inbox.push(Command::Post(post));
        self.health.check()
    }

    /// What a receive from `peer` names as its source: the peer itself where the provider
    /// binds receives to their source (`FI_DIRECTED_RECV`), anyone otherwise.
    pub fn source(&self, peer: sys::fi_addr_t) -> sys::fi_addr_t {
        match self.endpoint.directed {
            true => peer,
            false => sys::ADDR_UNSPEC,
        }
    }

    /// The fi_addr of a peer address, inserting it into the address vector the first time.
    /// An address naming an endpoint of this process must be one that is open (see quirks).
    pub fn peer(&self, addr: &[u8]) -> Result<sys::fi_addr_t> {
        let mut peers = self.peers.lock();
        if let Some(&a) = peers.get(addr) {
            return Ok(a);
        }
        let a = self.endpoint.insert(addr)?;
        peers.insert(addr.to_vec(), a);
        Ok(a)
    }

    /// One more user (a registration) of a lane that already has one (its comm).
    pub fn add_user(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// One user fewer; the last one retires the lane.
    pub fn release_user(self: &Arc<Self>) {
        match self.pool.upgrade() {
            Some(pool) => pool.release(self),
            None => {
                if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
                    self.retire(None);
                }
            }
        }
    }

    /// Takes the driver back from whoever drives, and closes the endpoint, or hands the
    /// driver to `adopt` when the provider still holds operations.
    fn retire(&self, adopt: Option<&Adopt>) {
        if let Some((worker, _)) = self.worker.get() {
            worker.remove((self as *const Lane).cast());
        }
        // A progress thread's turn in progress ends before the lock is had.
        let Some(mut driver) = self.link.lock().take().map(|d| *d) else {
            return;
        };
        // Nobody uses the endpoint any more: what is still posted is cancelled (but sinks,
        // which let the peer's last sends finish), and cancellations may complete now.
        let _ = driver.turn();
        driver.cancel_all(false);
        let _ = driver.turn();
        match adopt {
            Some(adopt) if !driver.empty() && !driver.waits_for_receiver() => adopt(driver),
            _ => driver.finish(),
        }
    }
}

/// A comm id taken on a lane (see [`Lane::lease_id`]).
pub struct IdLease {
    pub id: u64,
    lane: Weak<Lane>,
}

impl Drop for IdLease {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.upgrade() {
            lane.forget_id(self.id);
        }
    }
}

impl Driven for Lane {
    fn turn(&self) -> Option<Result<usize>> {
        let mut link = self.link.try_lock()?;
        Some(link.as_mut()?.turn())
    }
    fn busy(&self) -> bool {
        self.health.broken().is_none() && (!self.inbox.is_empty() || self.health.in_flight())
    }
    fn idle(&self) -> bool {
        match self.link.try_lock() {
            Some(link) => link.as_ref().map_or(true, |d| d.idle()),
            None => false,
        }
    }
    fn sleep_check(&self) -> Sleep {
        match self.link.try_lock() {
            Some(mut link) => match link.as_mut() {
                Some(d) if self.health.broken().is_none() => d.sleep_check(),
                // Nothing to wait for on a retired or failed endpoint (poll(2) passes over a
                // negative fd).
                _ => Sleep::On(-1),
            },
            // Someone else takes its turn right now: look again soon.
            None => Sleep::Ready,
        }
    }
    fn has_commands(&self) -> bool {
        !self.inbox.is_empty()
    }
}

/// How long a lane that NCCL's calls drive may go without a turn while the provider holds
/// its operations before the control thread gives it one: a provider that moves data only
/// inside calls (manual progress: rxm, rxd, ucx) keeps moving it while NCCL makes none.
pub const NUDGE: Duration = Duration::from_millis(20);
/// How long after a lane's last work the control thread keeps nudging it (see `Lane::nudge`).
const NUDGE_TAIL: Duration = Duration::from_secs(1);
/// How often the control thread gives a lane NCCL's calls drive a turn when nothing is owed
/// (see `Lane::nudge`): a few turns a second per idle lane, each a completion read.
const IDLE_NUDGE: Duration = Duration::from_millis(250);
