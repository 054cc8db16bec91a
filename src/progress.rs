//! A progress thread: drives one endpoint's [`Driver`] continuously, so the provider moves
//! data while NCCL's threads do other work, and posts what NCCL's calls handed in.
//!
//! It spins while work comes, then yields. Where the provider's wait object tells all
//! (`quirks::wait_object_tells_all`), a thread that found nothing to do for
//! `NCCL_FABRIC_PROGRESS_SPIN_US` (20 ms; 50 µs for threads forced onto too few CPUs, see
//! `settings::SPIN_CROWDED_US`) sleeps in `poll` on that fd and its inbox's bell:
//! it wakes when data arrives, a socket takes more, a command comes or it is stopped, and
//! after [`SLEEP_IN_FLIGHT`] at most while operations are in flight. Elsewhere it naps (20 µs,
//! later 200 µs) while operations are in flight. Once nothing is in flight it sleeps (50 ms):
//! then no completion can come, and a new operation wakes it at once (commands unpark it, and
//! ring its bell); where it sleeps on the wait object it does so after [`SPIN_IDLE`] without
//! work once nothing is in flight. Stopping it hands the driver back.
//!
//! The quiet time before sleeping is long by default: a collective's steps leave a lane
//! without work for 0.05–1 ms at a time (its GPU filling the next slot), and a thread that
//! slept through such a gap costs the step a wake-up. On the GPU machine (two ranks as two
//! hosts, `tcp;ofi_rxm`) sleeping after 50 µs took 15–25 % of all_reduce's busbw at 1 MiB–1 GiB
//! and saved no CPU time: the threads slept and woke once per step.

use crate::driver::Driver;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest sleep on the wait object while operations are in flight: rxm's connection
/// events are not behind it.
pub const SLEEP_IN_FLIGHT: Duration = Duration::from_millis(1);
/// The sleep once nothing is in flight.
const SLEEP_IDLE: Duration = Duration::from_millis(50);
/// How long a thread with nothing in flight spins before it sleeps, where the quiet time set
/// is longer: no completion can come then, and NCCL's next operation rings the bell (a run of
/// communicators, each a short burst of traffic, otherwise spins the whole quiet time after
/// each).
const SPIN_IDLE: Duration = Duration::from_millis(1);

/// How long a thread that has found nothing to do for `quiet` sleeps, if it is to sleep now:
/// after `spin` with operations in flight, sooner (after [`SPIN_IDLE`]) with nothing in
/// flight (`nothing`, asked only once the shorter time has passed: it walks the operations).
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

/// A running progress thread.
pub struct Progress {
    stop: Arc<AtomicBool>,
    inbox: Arc<crate::driver::Inbox>,
    handle: JoinHandle<Driver>,
}

impl Progress {
    /// Starts a thread that drives `driver`, sleeping on the provider's wait object after
    /// `spin` without work (`None`: never; see the module notes); gives the driver back if
    /// no thread can start.
    pub fn spawn(
        driver: Driver,
        inbox: &Arc<crate::driver::Inbox>,
        spin: Option<Duration>,
    ) -> Result<Progress, Box<Driver>> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        // The driver moves into the thread only once it started; until then it waits here.
        let slot = Arc::new(parking_lot::Mutex::new(Some(driver)));
        let taken = slot.clone();
        let started = std::thread::Builder::new()
            .name("nfab-progress".into())
            .spawn(move || {
                let mut driver = taken.lock().take().expect("handed over before start");
                run(&mut driver, &stopped, spin);
                driver
            });
        match started {
            Ok(handle) => {
                inbox.set_worker(handle.thread().clone());
                Ok(Progress {
                    stop,
                    inbox: inbox.clone(),
                    handle,
                })
            }
            Err(e) => {
                tracing::warn!("no progress thread ({e}); NCCL's calls drive this endpoint");
                Err(Box::new(
                    slot.lock().take().expect("not taken: the thread never ran"),
                ))
            }
        }
    }

    /// Stops the thread and takes its driver back (`None` if the thread panicked).
    pub fn stop(self) -> Option<Driver> {
        self.stop.store(true, Ordering::Release);
        self.inbox.wake_worker();
        match self.handle.join() {
            Ok(d) => Some(d),
            Err(_) => {
                tracing::warn!("a progress thread panicked; its endpoint is left open");
                None
            }
        }
    }
}

fn run(driver: &mut Driver, stop: &AtomicBool, spin: Option<Duration>) {
    // Where the queue has a wait object to sleep on; elsewhere the spin, yield, nap schedule.
    let spin = spin.filter(|_| driver.can_sleep());
    let mut idle = 0u32;
    // When the turns started finding nothing (checked every few turns).
    let mut quiet_since = None;
    while !stop.load(Ordering::Acquire) {
        match driver.turn() {
            Ok(0) => idle = idle.saturating_add(1),
            Ok(_) => {
                idle = 0;
                quiet_since = None;
            }
            // The queue failed (recorded in the endpoint's health): nothing more to drive.
            Err(_) => {
                while !stop.load(Ordering::Acquire) {
                    std::thread::park_timeout(Duration::from_millis(100));
                }
                return;
            }
        }
        if let Some(spin) = spin.filter(|_| idle > 0) {
            let quiet = quiet_since.get_or_insert_with(Instant::now).elapsed();
            if let Some(limit) = sleep_for(quiet, spin, || driver.idle()) {
                // Slept, or something is ready (a read will find it): turn again at once,
                // not into the naps below, which nothing but their timer ends.
                if driver.sleep(limit, stop) {
                    continue;
                }
            }
        }
        match idle {
            0..=4_000 => std::hint::spin_loop(),
            4_001..=40_000 => std::thread::yield_now(),
            // Nothing in flight (closed comms' sinks aside): nothing to wait for.
            _ if driver.idle() => std::thread::park_timeout(Duration::from_millis(50)),
            // About a second of 20 µs naps, then 200 µs: an endpoint idle between NCCL
            // operations costs little CPU and wakes within a fraction of a millisecond.
            40_001..=90_000 => std::thread::park_timeout(Duration::from_micros(20)),
            _ => std::thread::park_timeout(Duration::from_micros(200)),
        }
    }
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
}
