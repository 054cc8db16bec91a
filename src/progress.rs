//! Progress threads: a device's crew of a few threads, each driving the drivers of many
//! endpoints (lanes), so the provider moves data while NCCL's threads do other work. How many
//! threads follows the CPUs a rank has, never how many endpoints or flows there are.
//!
//! NCCL's calls hand the threads what to post, but for short sends and receives, which a call
//! may post itself (`NCCL_FABRIC_INLINE_POST_BYTES`); the threads read every completion. A
//! call's own post after a thread asked its providers whether it may sleep wakes it
//! ([`Waker::look`]).
//!
//! A thread gives every endpoint with something in flight (or commands waiting) a turn in
//! each sweep, and the others one every [`COLD_TURN`]: those have nothing to complete, and
//! what they may need (a peer's connection request) can wait that long. A driver busy in
//! another thread's hands (the control thread winding it down) is skipped, never waited for.
//!
//! A thread spins while work comes, then yields. Where every provider's wait object tells
//! all (`quirks::wait_object_tells_all`), a thread that found nothing to do for
//! `NCCL_FABRIC_PROGRESS_SPIN_US` (20 ms; 50 µs for threads forced onto too few CPUs, see
//! `sizing::SPIN_CROWDED_US`) sleeps in `poll` on the wait objects of all its endpoints
//! and its bell: it wakes when data arrives, a socket takes more, a command comes or it is
//! stopped, and after [`SLEEP_IN_FLIGHT`] at most while operations are in flight; then every
//! endpoint gets a turn (what woke it may be any endpoint's, or a connection request that
//! only a turn of the listening endpoint takes in). Elsewhere
//! it naps (20 µs, later 200 µs) while operations are in flight. Once nothing is in flight it
//! sleeps (50 ms): then no completion can come, and a new operation wakes it at once
//! (commands unpark it, and ring its bell); where it sleeps on wait objects it does so after
//! `SPIN_IDLE` without work once nothing is in flight.
//!
//! The quiet time before sleeping is long by default: a collective's steps leave an endpoint
//! without work for 0.05–1 ms at a time (its GPU filling the next slot), and a thread that
//! slept through such a gap costs the step a wake-up. On the GPU machine (two ranks as two
//! hosts, `tcp;ofi_rxm`) sleeping after 50 µs took 15–25 % of all_reduce's busbw at 1 MiB–1 GiB
//! and saved no CPU time: the threads slept and woke once per step.

use crate::error::Result;
use crate::wake::{Sleep, Waker};
use parking_lot::Mutex;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest sleep on the wait objects while operations are in flight: rxm's connection
/// events are not behind them.
pub const SLEEP_IN_FLIGHT: Duration = Duration::from_millis(1);
/// The sleep once nothing is in flight.
const SLEEP_IDLE: Duration = Duration::from_millis(50);
/// How long a thread with nothing in flight spins before it sleeps, where the quiet time set
/// is longer: no completion can come then, and NCCL's next operation rings the bell (a run of
/// communicators, each a short burst of traffic, otherwise spins the whole quiet time after
/// each).
const SPIN_IDLE: Duration = Duration::from_millis(1);
/// How often an endpoint with nothing in flight gets a turn all the same.
pub const COLD_TURN: Duration = Duration::from_millis(1);

/// An endpoint's driver as a progress thread sees it (a lane).
pub trait Driven: Send + Sync {
    /// One turn of its driver, unless another thread holds it right now or it is retired
    /// (`None`). An error is the endpoint's own (its completion queue failed).
    fn turn(&self) -> Option<Result<usize>>;
    /// Whether a turn may find work: operations in flight or commands waiting.
    fn busy(&self) -> bool;
    /// Whether nothing is in flight but sinks (so no completion it waits for can come).
    fn idle(&self) -> bool;
    /// Whether, and on what, its driver may sleep now.
    fn sleep_check(&self) -> Sleep;
    /// Whether commands wait for its driver.
    fn has_commands(&self) -> bool;
}

/// How long a thread that has found nothing to do for `quiet` sleeps, if it is to sleep now:
/// after `spin` with operations in flight, sooner (after [`SPIN_IDLE`]) with nothing in
/// flight (`nothing`, asked only once the shorter time has passed: it walks the endpoints).
fn sleep_for(quiet: Duration, spin: Duration, nothing: impl FnOnce() -> bool) -> Option<Duration> {
    if quiet < spin.min(SPIN_IDLE) {
        return None;
    }
    match nothing() {
        true => Some(SLEEP_IDLE),
        false if quiet >= spin => Some(SLEEP_IN_FLIGHT),
        false => None,
    }
}

/// One progress thread and the endpoints it drives.
pub struct Worker {
    members: Mutex<Vec<Arc<dyn Driven>>>,
    /// Bumped when `members` changes, so the thread copies it again.
    generation: AtomicU64,
    /// How many endpoints it drives (for placing the next).
    load: AtomicUsize,
    stop: AtomicBool,
    waker: Arc<Waker>,
}

impl Worker {
    /// Stops driving the member at `member` (its address). The thread may be in its turn
    /// right now; the caller then waits for the driver's lock, which the turn holds.
    pub fn remove(&self, member: *const ()) {
        let mut members = self.members.lock();
        let before = members.len();
        members.retain(|m| Arc::as_ptr(m).cast::<()>() != member);
        if members.len() != before {
            self.load.fetch_sub(1, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            // Its thread lets go of its copy of the member at once.
            self.waker.wake();
        }
    }

    /// The waker of its thread, for the inboxes of the endpoints it drives.
    pub fn waker(&self) -> &Arc<Waker> {
        &self.waker
    }
}

/// A device's progress threads.
pub struct Crew {
    workers: Vec<(Arc<Worker>, JoinHandle<()>)>,
}

impl Crew {
    /// Starts `threads` progress threads (named `nfab-progress`), which sleep on their
    /// endpoints' wait objects after `spin` without work (`None`: never; see the module
    /// notes). Fewer start if the system refuses threads; `None` if none does.
    pub fn start(threads: usize, spin: Option<Duration>) -> Option<Crew> {
        let mut workers = Vec::with_capacity(threads);
        for _ in 0..threads.max(1) {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<Worker>>(1);
            let started = std::thread::Builder::new()
                .name("nfab-progress".into())
                .spawn(move || {
                    let worker = Arc::new(Worker {
                        members: Mutex::new(Vec::new()),
                        generation: AtomicU64::new(0),
                        load: AtomicUsize::new(0),
                        stop: AtomicBool::new(false),
                        waker: Arc::new(Waker::new(std::thread::current())),
                    });
                    if tx.send(worker.clone()).is_ok() {
                        run(&worker, spin);
                    }
                });
            match started.map(|h| (rx.recv(), h)) {
                Ok((Ok(w), h)) => workers.push((w, h)),
                Ok((Err(_), h)) => {
                    let _ = h.join();
                    break;
                }
                Err(e) => {
                    tracing::warn!(
                        "{} of {} progress thread(s) started ({e}); the rest of the work goes \
                         to those",
                        workers.len(),
                        threads
                    );
                    break;
                }
            }
        }
        (!workers.is_empty()).then_some(Crew { workers })
    }

    /// How many threads it has.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Has thread `on` (counted modulo the threads), or else the least loaded thread, drive
    /// `member` from now on; returns that thread, to [`Worker::remove`] it from later and
    /// wake it.
    pub fn adopt(&self, member: Arc<dyn Driven>, on: Option<usize>) -> Arc<Worker> {
        let (worker, _) = match on {
            Some(i) => &self.workers[i % self.workers.len()],
            None => self
                .workers
                .iter()
                .min_by_key(|(w, _)| w.load.load(Ordering::Relaxed))
                .expect("a crew has a thread"),
        };
        worker.members.lock().push(member);
        worker.load.fetch_add(1, Ordering::Relaxed);
        worker.generation.fetch_add(1, Ordering::Release);
        worker.waker.wake();
        worker.clone()
    }
}

impl Drop for Crew {
    /// Stops the threads and waits for them, but for the calling thread itself (the last
    /// holder of a crew may be one of its threads letting go of a lane): that one ends on
    /// its own once this returns.
    fn drop(&mut self) {
        for (w, _) in &self.workers {
            w.stop.store(true, Ordering::Release);
            w.waker.wake();
        }
        let me = std::thread::current().id();
        for (_, h) in self.workers.drain(..) {
            if h.thread().id() != me && h.join().is_err() {
                tracing::warn!("a progress thread panicked");
            }
        }
    }
}

fn run(worker: &Worker, spin: Option<Duration>) {
    let mut members: Vec<Arc<dyn Driven>> = Vec::new();
    let mut seen = u64::MAX;
    let mut fds: Vec<RawFd> = Vec::new();
    let mut idle = 0u32;
    // When the sweeps started finding nothing.
    let mut quiet_since: Option<Instant> = None;
    let mut last_cold = Instant::now();
    // Whether the next sweep turns every member (after a sleep).
    let mut cold_now = false;
    while !worker.stop.load(Ordering::Acquire) {
        let generation = worker.generation.load(Ordering::Acquire);
        if generation != seen {
            members = worker.members.lock().clone();
            seen = generation;
        }
        let cold = std::mem::take(&mut cold_now) || last_cold.elapsed() >= COLD_TURN;
        if cold {
            last_cold = Instant::now();
        }
        let mut work = 0;
        for m in &members {
            if cold || m.busy() {
                if let Some(Ok(n)) = m.turn() {
                    work += n;
                }
            }
        }
        if work > 0 {
            idle = 0;
            quiet_since = None;
            continue;
        }
        idle = idle.saturating_add(1);
        let nothing = || members.iter().all(|m| m.idle());
        if let Some(spin) = spin {
            let quiet = quiet_since.get_or_insert_with(Instant::now).elapsed();
            // Before asking what is in flight: a call's own post after this keeps the doze
            // below from sleeping on an answer it changed.
            worker.waker.look();
            if let Some(limit) = sleep_for(quiet, spin, nothing) {
                match sleep_on(&members, &mut fds) {
                    // Something is ready: a sweep will find it.
                    Together::Ready => continue,
                    // Slept: sweep again at once, not into the naps below, which nothing
                    // but their timer ends.
                    Together::On => {
                        let commands = || {
                            worker.stop.load(Ordering::Acquire)
                                || worker.generation.load(Ordering::Acquire) != seen
                                || members.iter().any(|m| m.has_commands())
                        };
                        if worker.waker.doze(&mut fds, limit, commands) {
                            // Whatever woke it (or the timer) may be any member's: every
                            // one gets a turn now, the idle ones' connection events too.
                            cold_now = true;
                            continue;
                        }
                    }
                    Together::Cannot => {}
                }
            }
        }
        match idle {
            0..=4_000 => std::hint::spin_loop(),
            4_001..=40_000 => std::thread::yield_now(),
            // Nothing in flight (closed comms' sinks aside): nothing to wait for.
            _ if nothing() => std::thread::park_timeout(SLEEP_IDLE),
            // About a second of 20 µs naps, then 200 µs: endpoints idle between NCCL
            // operations cost little CPU and wake within a fraction of a millisecond.
            40_001..=90_000 => std::thread::park_timeout(Duration::from_micros(20)),
            _ => std::thread::park_timeout(Duration::from_micros(200)),
        }
    }
}

/// Whether a thread's members may sleep together.
enum Together {
    /// On the wait objects gathered.
    On,
    /// One of them has something ready.
    Ready,
    /// One of them cannot sleep.
    Cannot,
}

/// Gathers the wait objects of every member in `fds`, if all of them may sleep now.
fn sleep_on(members: &[Arc<dyn Driven>], fds: &mut Vec<RawFd>) -> Together {
    fds.clear();
    for m in members {
        match m.sleep_check() {
            Sleep::On(fd) => fds.push(fd),
            Sleep::Ready => return Together::Ready,
            Sleep::Cannot => return Together::Cannot,
        }
    }
    Together::On
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_with_nothing_in_flight_sleep_sooner() {
        let ms = Duration::from_millis;
        let spin = ms(20);
        // In flight: only after the whole quiet time, and then at most 1 ms at a time.
        assert_eq!(sleep_for(ms(5), spin, || false), None);
        assert_eq!(sleep_for(ms(20), spin, || false), Some(SLEEP_IN_FLIGHT));
        // Nothing in flight: after a millisecond, for long.
        assert_eq!(sleep_for(Duration::from_micros(500), spin, || true), None);
        assert_eq!(sleep_for(ms(1), spin, || true), Some(SLEEP_IDLE));
        // Before that, what is in flight is not even asked.
        let asked = || -> bool { unreachable!("asked before the shorter quiet time") };
        assert_eq!(sleep_for(Duration::from_micros(500), spin, asked), None);
        // A shorter quiet time set applies to both.
        let short = Duration::from_micros(50);
        assert_eq!(sleep_for(short, short, || true), Some(SLEEP_IDLE));
        assert_eq!(sleep_for(short, short, || false), Some(SLEEP_IN_FLIGHT));
        assert_eq!(
            sleep_for(Duration::ZERO, Duration::ZERO, || false),
            Some(SLEEP_IN_FLIGHT)
        );
    }

    /// A member that counts its turns and says it is busy while it has turns to take.
    struct Counter {
        turns: AtomicUsize,
        wanted: AtomicUsize,
    }

    impl Driven for Counter {
        fn turn(&self) -> Option<Result<usize>> {
            let n = self.turns.fetch_add(1, Ordering::AcqRel);
            Some(Ok(usize::from(n < self.wanted.load(Ordering::Acquire))))
        }
        fn busy(&self) -> bool {
            self.turns.load(Ordering::Acquire) < self.wanted.load(Ordering::Acquire)
        }
        fn idle(&self) -> bool {
            !self.busy()
        }
        fn sleep_check(&self) -> Sleep {
            Sleep::Cannot
        }
        fn has_commands(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_few_threads_drive_many_members_and_idle_ones_still_get_turns() {
        let crew = Crew::start(2, None).expect("threads");
        assert_eq!(crew.threads(), 2);
        let members: Vec<Arc<Counter>> = (0..16)
            .map(|i| {
                Arc::new(Counter {
                    turns: AtomicUsize::new(0),
                    // Half of them busy for a while, half never.
                    wanted: AtomicUsize::new(if i % 2 == 0 { 10_000 } else { 0 }),
                })
            })
            .collect();
        let workers: Vec<Arc<Worker>> = members
            .iter()
            .map(|m| crew.adopt(m.clone() as Arc<dyn Driven>, None))
            .collect();
        let load = |w: &Arc<Worker>| workers.iter().filter(|x| Arc::ptr_eq(x, w)).count();
        assert_eq!(load(&workers[0]) + load(&workers[1]), 16);
        assert_eq!(load(&workers[0]), 8, "spread evenly");
        let deadline = Instant::now() + Duration::from_secs(30);
        while members.iter().any(|m| m.busy()) {
            assert!(Instant::now() < deadline, "busy members were not driven");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Members with nothing to do get a turn now and then all the same.
        let idle_turns = |m: &Counter| m.turns.load(Ordering::Acquire);
        let before = idle_turns(&members[1]);
        while idle_turns(&members[1]) == before {
            assert!(Instant::now() < deadline, "an idle member never got a turn");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Removed members are left alone.
        workers[3].remove(Arc::as_ptr(&members[3]).cast());
        std::thread::sleep(Duration::from_millis(20));
        let after = idle_turns(&members[3]);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(idle_turns(&members[3]), after, "a removed member got turns");
        drop(crew);
    }
}
