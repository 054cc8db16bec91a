//! A device's lane pool: which lane each new comm gets, and how long lanes nobody uses stay
//! open.
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

use super::{first_lane, flow_slots, lane_thread, most_flows, Lane, Role, NUDGE};
use crate::driver::{Driver, Health, Inbox};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::fabric::Domain;
use crate::progress::Crew;
use crate::tags::Tags;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

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
    /// Where progress threads drive, NCCL's calls take turns on their comms' lanes too.
    pub calls_help: bool,
    /// Where progress threads drive, NCCL's calls post operations of at most this many
    /// bytes themselves when the lane is free (0: never).
    pub inline_post: usize,
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
    /// When NCCL's calls last drove the lanes of other comms (see
    /// [`Lane::drive_neighbours`]; ms, `control::now_ms`).
    neighbours_at: AtomicU64,
    /// Whether no progress thread could start: NCCL's calls drive from then on.
    crewless: AtomicBool,
    /// Per role, the lanes being opened off NCCL's calls, if any (see [`LanePool::prepare`]).
    opening: Mutex<[Option<Arc<Opening>>; 2]>,
}

/// Lanes of a role being opened on a thread of their own, so that no connect or accept call
/// waits for endpoints to open (an endpoint's buffers may take tens of milliseconds to set
/// up, and a device's first comm needs all its lanes).
#[derive(Default)]
pub struct Opening {
    done: AtomicBool,
}

impl Opening {
    /// Whether every lane it was to open has opened or failed to.
    pub fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// Lanes an opening holds for its comms: let go (left to linger) when dropped.
struct Held(Vec<Arc<Lane>>);

impl Drop for Held {
    fn drop(&mut self) {
        for lane in self.0.drain(..) {
            lane.release_user();
        }
    }
}

/// Marks an [`Opening`] done when dropped.
struct MarkDone(Arc<Opening>);

impl Drop for MarkDone {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Release);
    }
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
            neighbours_at: AtomicU64::new(0),
            opening: Mutex::new([None, None]),
        })
    }

    /// Whether a comm of `n` flows in `role` may take its lanes now without opening any:
    /// `None` if so (or where lanes are a comm's own, close as soon as nobody uses them, or
    /// no thread could start: the comm then opens them itself), else the opening under way,
    /// on a thread of its own, of the role's shared lanes such a comm takes that are not
    /// open. The caller tells NCCL "not yet" until it is done, then takes its lanes
    /// ([`LanePool::acquire_flows`]), opening there any that failed (or closed meanwhile:
    /// they linger as lanes nobody uses).
    pub fn prepare(self: &Arc<Self>, role: Role, n: usize) -> Option<Arc<Opening>> {
        // Lanes that close as soon as nobody uses them could not wait for their comm.
        if self.config.per_comm || self.config.linger.is_zero() {
            return None;
        }
        let missing: Vec<usize> = {
            let slots = self.slots.lock();
            let (lanes, next) = &slots[role as usize];
            let c = &self.config;
            let first = first_lane(role, *next, lanes.len(), c.flows, c.rails.len());
            let n = n.clamp(1, self.most_flows());
            let mut wanted: Vec<usize> = flow_slots(role, first, n, lanes.len()).collect();
            wanted.sort_unstable();
            wanted.dedup();
            wanted.retain(|&i| {
                !lanes[i]
                    .as_ref()
                    .is_some_and(|l| l.health.broken().is_none())
            });
            wanted
        };
        if missing.is_empty() {
            return None;
        }
        let mut opening = self.opening.lock();
        if let Some(under_way) = &opening[role as usize] {
            if !under_way.done() {
                return Some(under_way.clone());
            }
        }
        let fresh = Arc::new(Opening::default());
        let (pool, ticket) = (self.clone(), fresh.clone());
        let started = std::thread::Builder::new()
            .name("nfab-open".into())
            .spawn(move || {
                // Done however the thread ends, so that no connect waits for it forever.
                let _done = MarkDone(ticket);
                // Held until the last has opened, then left lingering in their slots as
                // lanes whose comms closed (dropped before `_done`): a lane let go as soon
                // as it opened could linger out before the last one opened, and the comm
                // would open it again inside NCCL's call (`conform`, three runs at once on
                // 2 cores: a connect or accept call of up to 2.6 s).
                let mut held = Held(Vec::with_capacity(missing.len()));
                for index in missing {
                    match pool.acquire_slot(role, index) {
                        Ok(lane) => held.0.push(lane),
                        Err(e) => tracing::debug!(
                            "opening a {role:?} endpoint on {} ahead of its comm failed: {e}",
                            pool.config.label
                        ),
                    }
                }
            });
        match started {
            Ok(_) => {
                opening[role as usize] = Some(fresh.clone());
                Some(fresh)
            }
            Err(_) => None,
        }
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
    /// after it in the pool (see [`flow_slots`] where the flows outnumber the lanes). Only the
    /// first must open; the comm goes without the others when they fail.
    pub fn acquire_flows(self: &Arc<Self>, role: Role, n: usize) -> Result<Vec<Arc<Lane>>> {
        let first = self.acquire(role)?;
        let (Some(slot), n) = (first.slot, n.min(self.most_flows())) else {
            return Ok(vec![first]);
        };
        let mut lanes = vec![first];
        for index in flow_slots(role, slot, n, self.config.lanes).skip(1) {
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

    pub(super) fn release(self: &Arc<Self>, lane: &Arc<Lane>) {
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

    /// Whether a call at `now` (ms) is the first this millisecond to drive other comms'
    /// lanes; it takes the turn if so.
    pub(super) fn neighbours_due(&self, now: u64) -> bool {
        first_at(&self.neighbours_at, now)
    }

    /// The pool's lanes that NCCL's calls drive (no progress thread), alive now. The
    /// members' lock is held only to copy the list.
    pub(super) fn driven_by_calls(&self) -> Vec<Arc<Lane>> {
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
            calls_help: threaded && c.calls_help,
            inline_post: if threaded { c.inline_post } else { 0 },
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
            last_idle_turn: AtomicU64::new(0),
            pool: Arc::downgrade(self),
            slot,
        });
        if let Some(crew) = crew {
            let on = slot.and_then(|k| {
                lane_thread(role, k, c.lanes, c.flows, c.rails.len(), crew.threads())
            });
            let worker = crew.adopt(lane.clone(), on);
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

/// Whether `now` differs from the time `at` holds, which it then takes: true for one caller
/// per distinct `now`, however many threads ask at once.
fn first_at(at: &AtomicU64, now: u64) -> bool {
    let last = at.load(Ordering::Relaxed);
    last != now
        && at
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::first_at;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    #[test]
    fn one_caller_a_millisecond_drives_the_neighbours() {
        let at = AtomicU64::new(0);
        assert!(first_at(&at, 5));
        assert!(!first_at(&at, 5), "the same millisecond again");
        assert!(first_at(&at, 6));
        let won = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if first_at(&at, 7) {
                            won.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(
            won.load(Ordering::Relaxed),
            1,
            "one of 8 threads asking at once"
        );
    }
}
