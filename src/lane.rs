//! Lanes: the data endpoints of a device, and the pool that hands them to comms.
//!
//! A lane is one endpoint (on a libfabric domain of its own: libfabric 2.x tcp drives all
//! sockets of a domain under one lock) with its driver. Its driver is fixed when it opens:
//! its own progress thread ([`crate::progress`]), or NCCL's calls, which take turns under
//! the lane's lock. Either way, NCCL's isend/irecv only hand operations to the driver
//! ([`Lane::submit`]); nothing else posts.
//!
//! Comms of a device share `NCCL_FABRIC_LANES` receiving and as many sending lanes, handed
//! out in turn (receiving and sending apart, so two ranks of one process never send to their
//! own endpoint, which some providers cannot), or get a lane each
//! (`NCCL_FABRIC_ENDPOINTS=comm`); a comm moves all its messages on its one lane. A lane
//! counts its users (comms and registrations). When the last user of a shared lane goes,
//! the lane stays in its slot for `NCCL_FABRIC_LANE_LINGER_MS`, so that the next
//! communicator (NCCL makes and destroys them one after another) finds it open and
//! connected; a lane of one comm waits as long among the pool's spares for the next comm. A
//! lane idle that long leaves the pool, and its driver closes the endpoint, or, if the
//! provider still holds operations, is handed to the control thread to finish the job.

use crate::driver::{Command, Driver, Health, Inbox, Post};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::fabric::Domain;
use crate::progress::{Crew, Driven, Worker};
use crate::sys;
use crate::tags::Tags;
use crate::wake::Sleep;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Which side of a comm pair a lane serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pool: Weak<LanePool>,
    /// Its place in the pool (`None`: a lane of one comm).
    slot: Option<usize>,
}

impl Lane {
    /// Hands an operation to the driver. A progress thread takes everything (it retries
    /// what the provider refuses for now). With NCCL's calls driving, the call posts it at
    /// once and gives it back (`Some`) when the provider says "not now", for NCCL to call
    /// again; if another call is driving the lane right now, the operation is left in the
    /// inbox for that call's next turn (or this comm's next `test`) rather than waiting for
    /// the lane: a call that sleeps on a lock may wait a whole scheduler time slice to run
    /// again on a busy machine (8 B ping-pong with one busy core: 3 ms instead of 20 µs).
    pub fn submit(&self, post: Post) -> Result<Option<Post>> {
        if self.threaded {
            return self.enqueue(post).map(|_| None);
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
    /// may be what a send of its own lane needs to move. A lane busy in another call is
    /// skipped.
    pub fn drive_neighbours(&self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        for lane in pool.driven_by_calls() {
            if std::ptr::eq(&*lane, self) {
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
    /// drives, or another NCCL call is driving the lane at this moment (then that call's
    /// turn is this one's too: nobody waits for the lane). Errors of the endpoint itself are
    /// returned.
    pub fn drive(&self) -> Result<()> {
        if !self.threaded {
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
    /// for (a call driving it now is the turn).
    fn nudge(&self) {
        let now = crate::control::now_ms();
        let since = now.saturating_sub(self.last_call.load(Ordering::Relaxed));
        if since < NUDGE.as_millis() as u64 {
            return;
        }
        let worked = now.saturating_sub(self.last_work.load(Ordering::Relaxed));
        if let Some(mut link) = self.link.try_lock() {
            if let Some(d) = &mut *link {
                let owed = worked < NUDGE_TAIL.as_millis() as u64 || !self.inbox.is_empty();
                if (d.in_flight() > 0 || owed) && d.turn().is_ok_and(|n| n > 0) {
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

/// Where a retired lane's driver goes when the provider still holds operations.
pub type Adopt = Box<dyn Fn(Driver) + Send + Sync>;

/// Runs a job once a delay has passed, on another thread (the control thread).
pub type Schedule = Box<dyn Fn(Duration, Box<dyn FnOnce() + Send>) + Send + Sync>;

/// What every lane of a device is opened with.
pub struct LaneConfig {
    /// The device's domain; each lane opens a sibling of it (of its rail's, see `rails`).
    pub domain: Arc<Domain>,
    /// A device over several NICs (`NCCL_FABRIC_MERGE`): the domain of each NIC, in the
    /// repeating order its lanes take them (`nic::rail_pattern`: a faster NIC comes up more
    /// often). Empty, or one, for a device of one NIC. The lanes per role are then a
    /// multiple of its length and every comm starts on a lane of the first rail, so that
    /// flow `j` of a comm travels on rail `j mod len` at both ends.
    pub rails: Vec<Arc<Domain>>,
    /// With GPU buffers allowed, every endpoint must answer setopt as the probe did.
    pub expected_answer: Option<i32>,
    /// Progress threads that drive the device's lanes (0: NCCL's calls drive them).
    pub threads: usize,
    /// Lanes per role: each comm's flows are that many of them at most.
    pub lanes: usize,
    /// Flows per comm (see [`first_lane`]).
    pub flows: usize,
    pub per_comm: bool,
    /// The device's name, for log lines.
    pub label: String,
    pub adopt: Adopt,
    /// How long a shared lane stays open once its last user has gone (zero: closes at once).
    pub linger: Duration,
    pub schedule: Schedule,
    /// Whether the control thread gives lanes that NCCL's calls drive a turn when no call
    /// came for [`NUDGE`] (off where only NCCL's threads may drive the provider: see
    /// `quirks::progress_needs_cuda_context`).
    pub nudge: bool,
    /// How long progress threads spin before they sleep on the providers' wait objects
    /// (`None`: never, or no progress threads, or a provider whose wait object would not
    /// wake them; see `progress`).
    pub spin: Option<Duration>,
    /// Whether each lane's domain opens on a fabric of its own (`quirks::
    /// domain_open_races_progress`), decided once for the device.
    pub own_fabric: bool,
}

/// How long a lane that NCCL's calls drive may go without a turn while the provider holds
/// its operations before the control thread gives it one: a provider that moves data only
/// inside calls (manual progress: rxm, rxd, ucx) keeps moving it while NCCL makes none.
pub const NUDGE: Duration = Duration::from_millis(20);
/// How long after a lane's last work the control thread keeps nudging it (see `Lane::nudge`).
const NUDGE_TAIL: Duration = Duration::from_secs(1);

/// Whether a provider's refusal of a wait object was told (once per process).
static REFUSED_WAIT_TOLD: AtomicBool = AtomicBool::new(false);

/// One role's shared lanes, and which one the next comm gets.
type RoleSlots = (Vec<Option<Arc<Lane>>>, usize);

/// A device's lanes.
pub struct LanePool {
    config: LaneConfig,
    /// Per role, the shared lanes and which one the next comm gets.
    slots: Mutex<[RoleSlots; 2]>,
    /// Every lane of the pool, shared or not (for [`Lane::drive_neighbours`]).
    members: Mutex<Vec<Weak<Lane>>>,
    /// With a lane per comm: per role, lanes whose comm closed, for the next comms.
    spare: Mutex<[Vec<Arc<Lane>>; 2]>,
    /// Whether the control thread's turns ([`LanePool::keep_nudging`]) were started.
    nudging: AtomicBool,
    /// The progress threads, started with the first lane; its lanes hold it, so the
    /// threads end with the last lane (after finalize, or a quiet spell past the linger time).
    crew: Mutex<Weak<Crew>>,
    /// Whether no progress thread could start: NCCL's calls drive from then on.
    crewless: AtomicBool,
}

impl Drop for LanePool {
    /// Lanes nobody uses close with the pool (shared lanes in use keep a weak link only).
    fn drop(&mut self) {
        let mut idle: Vec<Arc<Lane>> = Vec::new();
        for pool in self.spare.get_mut().iter_mut() {
            idle.append(pool);
        }
        for (lanes, _) in self.slots.get_mut().iter_mut() {
            idle.extend(lanes.iter_mut().filter_map(Option::take));
        }
        for lane in idle {
            if lane.users.load(Ordering::Acquire) == 0 {
                lane.retire(Some(&self.config.adopt));
            }
        }
    }
}

/// Lanes of closed comms a pool keeps for the next ones, per role (`NCCL_FABRIC_ENDPOINTS=comm`).
const MAX_SPARE: usize = 16;

impl LanePool {
    pub fn new(config: LaneConfig) -> Arc<Self> {
        let n = config.lanes.max(1);
        Arc::new(LanePool {
            config,
            slots: Mutex::new([(vec![None; n], 0), (vec![None; n], 0)]),
            members: Mutex::new(Vec::new()),
            spare: Mutex::new([Vec::new(), Vec::new()]),
            nudging: AtomicBool::new(false),
            crew: Mutex::new(Weak::new()),
            crewless: AtomicBool::new(false),
        })
    }

    /// How many flows a comm gets at most: lanes after its own, in the pool's order (a lane
    /// per comm gets no more).
    pub fn most_flows(&self) -> usize {
        match self.config.per_comm {
            true => 1,
            false => most_flows(self.config.lanes, self.config.rails.len()),
        }
    }

    /// The progress threads, started when a lane opens and none runs (`None` where NCCL's
    /// calls drive, or no thread could start).
    fn crew(&self) -> Option<Arc<Crew>> {
        if self.config.threads == 0 || self.crewless.load(Ordering::Relaxed) {
            return None;
        }
        let mut crew = self.crew.lock();
        if let Some(running) = crew.upgrade() {
            return Some(running);
        }
        match Crew::start(self.config.threads, self.config.spin) {
            Some(started) => {
                let started = Arc::new(started);
                *crew = Arc::downgrade(&started);
                Some(started)
            }
            None => {
                self.crewless.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// Up to `n` lanes for a new comm, one per flow: the one whose turn it is, then those
    /// after it in the pool (see [`flow_lane`] where the flows outnumber the lanes). Only the
    /// first must open; the comm goes without the others when they fail.
    pub fn acquire_flows(self: &Arc<Self>, role: Role, n: usize) -> Result<Vec<Arc<Lane>>> {
        let first = self.acquire(role)?;
        let (Some(slot), n) = (first.slot, n.min(self.most_flows())) else {
            return Ok(vec![first]);
        };
        let lanes_per_role = self.config.lanes.max(1);
        let mut lanes = vec![first];
        for k in 1..n {
            let index = (slot + flow_lane(role, k, n, lanes_per_role)) % lanes_per_role;
            match self.acquire_slot(role, index) {
                Ok(lane) => lanes.push(lane),
                Err(e) => {
                    tracing::debug!("a further flow for a comm could not open: {e}");
                    break;
                }
            }
        }
        Ok(lanes)
    }

    /// A lane for a new comm, opened if its turn has none yet. The pool's lock is not held
    /// while the endpoint opens.
    pub fn acquire(self: &Arc<Self>, role: Role) -> Result<Arc<Lane>> {
        if self.config.per_comm {
            let (reused, broken) = {
                let mut spare = self.spare.lock();
                let pool = &mut spare[role as usize];
                let (broken, fine): (Vec<_>, Vec<_>) =
                    pool.drain(..).partition(|l| l.health.broken().is_some());
                *pool = fine;
                (pool.pop(), broken)
            };
            for lane in broken {
                lane.retire(Some(&self.config.adopt));
            }
            if let Some(lane) = reused {
                lane.users.fetch_add(1, Ordering::AcqRel);
                *lane.idle_since.lock() = None;
                return Ok(lane);
            }
            return self.open(role, None);
        }
        let index = {
            let mut slots = self.slots.lock();
            let (lanes, next) = &mut slots[role as usize];
            let c = &self.config;
            let index = first_lane(role, *next, lanes.len(), c.flows, c.rails.len());
            *next = next.wrapping_add(1);
            index
        };
        self.acquire_slot(role, index)
    }

    /// The shared lane in slot `index`, opened if the slot has none (or a failed one).
    fn acquire_slot(self: &Arc<Self>, role: Role, index: usize) -> Result<Arc<Lane>> {
        let mut retired = None;
        {
            let mut slots = self.slots.lock();
            let lanes = &mut slots[role as usize].0;
            if let Some(lane) = &lanes[index] {
                if lane.health.broken().is_none() {
                    lane.users.fetch_add(1, Ordering::AcqRel);
                    *lane.idle_since.lock() = None;
                    return Ok(lane.clone());
                }
                // A failed endpoint is not handed to new comms: its users keep it, and it
                // closes with the last of them (or now, if it was lingering).
                let lane = lanes[index].take().expect("checked");
                if lane.users.load(Ordering::Acquire) == 0 {
                    retired = Some(lane);
                }
            }
        }
        if let Some(lane) = retired {
            lane.retire(Some(&self.config.adopt));
        }
        let fresh = self.open(role, Some(index))?;
        let mut slots = self.slots.lock();
        let slot = &mut slots[role as usize].0[index];
        match slot {
            Some(existing) if existing.health.broken().is_none() => {
                // Another comm opened this lane meanwhile: use that one.
                existing.users.fetch_add(1, Ordering::AcqRel);
                *existing.idle_since.lock() = None;
                let existing = existing.clone();
                drop(slots);
                fresh.retire(None);
                Ok(existing)
            }
            Some(_) => {
                // That one failed meanwhile: this one takes its place.
                let broken = slot.replace(fresh.clone()).expect("checked");
                drop(slots);
                if broken.users.load(Ordering::Acquire) == 0 {
                    broken.retire(Some(&self.config.adopt));
                }
                Ok(fresh)
            }
            None => {
                *slot = Some(fresh.clone());
                Ok(fresh)
            }
        }
    }

    fn release(self: &Arc<Self>, lane: &Arc<Lane>) {
        let linger = self.config.linger;
        let retire = {
            let mut slots = self.slots.lock();
            if lane.users.fetch_sub(1, Ordering::AcqRel) != 1 {
                return;
            }
            let in_slot = lane.slot.is_some_and(|i| {
                slots[lane.role as usize].0[i]
                    .as_ref()
                    .is_some_and(|l| Arc::ptr_eq(l, lane))
            });
            let keep = !linger.is_zero() && lane.health.broken().is_none();
            if keep && self.config.per_comm {
                let mut spare = self.spare.lock();
                let pool = &mut spare[lane.role as usize];
                if pool.len() < MAX_SPARE {
                    *lane.idle_since.lock() = Some(std::time::Instant::now());
                    pool.push(lane.clone());
                    false
                } else {
                    true
                }
            } else if keep && in_slot {
                *lane.idle_since.lock() = Some(std::time::Instant::now());
                false
            } else {
                if let (true, Some(i)) = (in_slot, lane.slot) {
                    slots[lane.role as usize].0[i] = None;
                }
                true
            }
        };
        if retire {
            lane.retire(Some(&self.config.adopt));
            return;
        }
        let pool = Arc::downgrade(self);
        (self.config.schedule)(
            linger,
            Box::new(move || {
                if let Some(pool) = pool.upgrade() {
                    pool.close_idle();
                }
            }),
        );
    }

    /// Closes the lanes (shared or spare) nobody has used for the linger time.
    fn close_idle(&self) {
        let linger = self.config.linger;
        let mut idle = Vec::new();
        {
            let expired = |l: &Arc<Lane>| {
                l.users.load(Ordering::Acquire) == 0
                    && l.idle_since.lock().is_some_and(|t| t.elapsed() >= linger)
            };
            let mut slots = self.slots.lock();
            for pool in self.spare.lock().iter_mut() {
                let (gone, kept): (Vec<_>, Vec<_>) = pool.drain(..).partition(expired);
                *pool = kept;
                idle.extend(gone);
            }
            for (lanes, _) in slots.iter_mut() {
                for slot in lanes.iter_mut() {
                    if slot.as_ref().is_some_and(expired) {
                        idle.extend(slot.take());
                    }
                }
            }
        }
        for lane in idle {
            tracing::debug!(
                "closing an idle {:?} endpoint on {} (unused for {} ms)",
                lane.role,
                self.config.label,
                linger.as_millis()
            );
            lane.retire(Some(&self.config.adopt));
        }
    }

    /// The pool's lanes that NCCL's calls drive (no progress thread), alive now. The
    /// members' lock is held only to copy the list.
    fn driven_by_calls(&self) -> Vec<Arc<Lane>> {
        let members: Vec<Weak<Lane>> = self.members.lock().clone();
        members
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !l.threaded)
            .collect()
    }

    /// Gives every lane of the pool that NCCL's calls drive the control thread's turn every
    /// [`NUDGE`], while the pool exists; started with the pool's first such lane.
    fn keep_nudging(self: &Arc<Self>) {
        let pool = Arc::downgrade(self);
        (self.config.schedule)(
            NUDGE,
            Box::new(move || {
                if let Some(pool) = pool.upgrade() {
                    for lane in pool.driven_by_calls() {
                        lane.nudge();
                    }
                    pool.keep_nudging();
                }
            }),
        );
    }

    fn open(self: &Arc<Self>, role: Role, slot: Option<usize>) -> Result<Arc<Lane>> {
        let c = &self.config;
        let base = match (slot, c.rails.len()) {
            (Some(k), n) if n > 1 => &c.rails[k % n],
            _ => &c.domain,
        };
        let domain = base.sibling(c.own_fabric)?;
        let sleeps = c.spin.is_some();
        let (endpoint, queue) = Endpoint::open_waitable(&domain, c.expected_answer, sleeps)?;
        if sleeps && queue.wait_fd().is_none() && !REFUSED_WAIT_TOLD.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "{}: {} gave its completion queue no wait object (FI_WAIT_FD, FI_GETWAIT): \
                 its progress threads spin and nap instead of sleeping on its sockets",
                c.label,
                endpoint.provider
            );
        }
        let inbox = Arc::new(Inbox::default());
        let health = Arc::new(Health::default());
        let label = format!("{} endpoint on {}", endpoint.provider, c.label);
        let driver = Driver::new(queue, inbox.clone(), health.clone(), label);
        let crew = self.crew();
        let threaded = crew.is_some();
        tracing::debug!(
            "endpoint opened on {} for {:?} comms ({}; setopt FI_OPT_CUDA_API_PERMITTED=false \
             answered {}; {})",
            c.label,
            role,
            crate::fabric::address_text(&endpoint.name),
            crate::provider::errno_name(endpoint.cuda_api_answer),
            match threaded {
                true => "a progress thread drives it",
                false => "NCCL's calls drive it",
            }
        );
        let lane = Arc::new(Lane {
            tags: Tags::new(domain.info.info().mem_tag_format()),
            endpoint,
            role,
            threaded,
            inbox,
            health,
            link: Mutex::new(Some(Box::new(driver))),
            worker: OnceLock::new(),
            ids: Mutex::new(std::collections::HashSet::new()),
            peers: Mutex::new(HashMap::new()),
            users: AtomicUsize::new(1),
            idle_since: Mutex::new(None),
            last_call: AtomicU64::new(crate::control::now_ms()),
            last_work: AtomicU64::new(crate::control::now_ms()),
            pool: Arc::downgrade(self),
            slot,
        });
        if let Some(crew) = crew {
            let worker = crew.adopt(lane.clone());
            lane.inbox.set_waker(worker.waker().clone());
            let _ = lane.worker.set((worker, crew));
        }
        if !threaded && c.nudge && !self.nudging.swap(true, Ordering::Relaxed) {
            self.keep_nudging();
        }
        let mut members = self.members.lock();
        members.retain(|l| l.strong_count() > 0);
        members.push(Arc::downgrade(&lane));
        Ok(lane)
    }
}

/// The most flows a comm may have on `lanes` shared lanes per role over `rails` NICs: a
/// connection each, so a lane each over several NICs (flow j must travel on rail j mod rails
/// at both ends), else every pair of a sending and a receiving lane (see [`flow_lane`]), up
/// to the pieces a message can be cut into.
pub fn most_flows(lanes: usize, rails: usize) -> usize {
    let lanes = lanes.max(1);
    match rails > 1 {
        true => lanes,
        false => (lanes * lanes).min(crate::tags::MAX_PIECES),
    }
}

/// Which lane, counted from a comm's first, flow `k` of its `flows` takes of `lanes`. Up to
/// one flow per lane, the lanes in turn. Where the flows outnumber the lanes, a sending
/// comm goes round its lanes once per `lanes` flows, while a receiving one gives each lane
/// `flows / lanes` (rounded up) consecutive flows: flow k then pairs sending lane k mod L
/// with receiving lane k div m, a different pair of endpoints, so a connection of its own,
/// for every flow (up to L x L flows on L lanes a side, when both ends have the same lanes).
pub fn flow_lane(role: Role, k: usize, flows: usize, lanes: usize) -> usize {
    let lanes = lanes.max(1);
    match role {
        Role::Sending => k % lanes,
        Role::Receiving => (k / flows.div_ceil(lanes).max(1)) % lanes,
    }
}

/// The lane the `n`-th comm of a role starts on, of `lanes`, for comms of `flows` flows (the
/// lanes from the first on) on a device of `rails` NICs. Over several rails, a lane of the
/// first rail (see `LaneConfig::rails`). Where the lanes hold several whole sets of flows,
/// consecutive comms start a set apart (0, 16, 1, 17, … for 32 lanes and 16 flows): their
/// flows are then distinct connections, which a network that caps each one lets add up.
/// Where they hold one set, sending comms start in turn and receiving ones two lanes apart:
/// the c-th comm between two ranks then pairs sending lane n + k with receiving lane 2n + k,
/// so its flows are connections no earlier comm of theirs has (up to `lanes` comms), where
/// starting both in turn gave every comm the same connections.
pub fn first_lane(role: Role, n: usize, lanes: usize, flows: usize, rails: usize) -> usize {
    let lanes = lanes.max(1);
    if rails > 1 {
        return n.wrapping_mul(rails) % lanes;
    }
    let sets = lanes / flows.max(1);
    match (sets, flows, role) {
        (_, 0 | 1, _) => n % lanes,
        (0 | 1, _, Role::Sending) => n % lanes,
        (0 | 1, _, Role::Receiving) => n.wrapping_mul(2) % lanes,
        _ => ((n % sets) * flows + n / sets) % lanes,
    }
}

#[cfg(test)]
mod tests {
    use super::{first_lane, flow_lane, Role};

    #[test]
    fn flows_beyond_the_lanes_pair_lanes_no_other_flow_pairs() {
        for lanes in 1..=8 {
            for flows in 1..=(lanes * lanes).min(32) {
                let pairs: std::collections::HashSet<(usize, usize)> = (0..flows)
                    .map(|k| {
                        let send = flow_lane(Role::Sending, k, flows, lanes);
                        let recv = flow_lane(Role::Receiving, k, flows, lanes);
                        assert!(send < lanes && recv < lanes);
                        (send, recv)
                    })
                    .collect();
                assert_eq!(pairs.len(), flows, "{flows} flows on {lanes} lanes");
            }
        }
        let on = |role, flows, lanes| -> Vec<usize> {
            (0..flows)
                .map(|k| flow_lane(role, k, flows, lanes))
                .collect()
        };
        // Up to a flow per lane, both ends take the lanes in turn, as before.
        assert_eq!(on(Role::Receiving, 4, 16), vec![0, 1, 2, 3]);
        assert_eq!(on(Role::Sending, 4, 16), vec![0, 1, 2, 3]);
        assert_eq!(on(Role::Sending, 6, 4), vec![0, 1, 2, 3, 0, 1]);
        assert_eq!(on(Role::Receiving, 6, 4), vec![0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn comms_start_a_set_of_flows_apart_where_the_lanes_hold_several_sets() {
        let starts = |lanes, flows, rails| -> Vec<usize> {
            (0..6)
                .map(|n| first_lane(Role::Sending, n, lanes, flows, rails))
                .collect()
        };
        assert_eq!(
            starts(16, 16, 1),
            vec![0, 1, 2, 3, 4, 5],
            "one set: in turn"
        );
        // One set: the c-th comm's flows are connections of its own (sending lane n + k to
        // receiving lane 2n + k), for 16 comms on 16 lanes.
        let mut pairs = std::collections::HashSet::new();
        for c in 0..16 {
            let (s, r) = (
                first_lane(Role::Sending, c, 16, 16, 1),
                first_lane(Role::Receiving, c, 16, 16, 1),
            );
            for k in 0..16 {
                assert!(
                    pairs.insert(((s + k) % 16, (r + k) % 16)),
                    "comm {c} flow {k}"
                );
            }
        }
        assert_eq!(
            starts(4, 1, 1),
            vec![0, 1, 2, 3, 0, 1],
            "whole messages: in turn"
        );
        assert_eq!(starts(32, 16, 1), vec![0, 16, 1, 17, 2, 18]);
        assert_eq!(starts(48, 16, 1), vec![0, 16, 32, 1, 17, 33]);
        assert_eq!(starts(16, 16, 4), vec![0, 4, 8, 12, 0, 4], "the first rail");
        // Two comms that start one after the other share no lane.
        let lanes_of = |first: usize| (first..first + 16).map(|k| k % 32).collect::<Vec<_>>();
        let (a, b) = (
            lanes_of(first_lane(Role::Receiving, 0, 32, 16, 1)),
            lanes_of(first_lane(Role::Receiving, 1, 32, 16, 1)),
        );
        assert!(a.iter().all(|k| !b.contains(k)));
    }
}
