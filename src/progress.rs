//! A progress thread: drives one endpoint's [`Driver`] continuously, so the provider moves
//! data while NCCL's threads do other work, and posts what NCCL's calls handed in.
//!
//! It spins while work comes, then yields, then naps (20 µs, later 200 µs) while operations
//! are in flight, and sleeps (50 ms) once nothing is: then no completion can come, and a new
//! operation wakes it at once (commands unpark it). Stopping it hands the driver back.

use crate::driver::Driver;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A running progress thread.
pub struct Progress {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Driver>,
}

impl Progress {
    /// Starts a thread that drives `driver`; gives the driver back if no thread can start.
    pub fn spawn(driver: Driver, inbox: &crate::driver::Inbox) -> Result<Progress, Box<Driver>> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        // The driver moves into the thread only once it started; until then it waits here.
        let slot = Arc::new(parking_lot::Mutex::new(Some(driver)));
        let taken = slot.clone();
        let started = std::thread::Builder::new()
            .name("nfab-progress".into())
            .spawn(move || {
                let mut driver = taken.lock().take().expect("handed over before start");
                run(&mut driver, &stopped);
                driver
            });
        match started {
            Ok(handle) => {
                inbox.set_worker(handle.thread().clone());
                Ok(Progress { stop, handle })
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
        self.handle.thread().unpark();
        match self.handle.join() {
            Ok(d) => Some(d),
            Err(_) => {
                tracing::warn!("a progress thread panicked; its endpoint is left open");
                None
            }
        }
    }
}

fn run(driver: &mut Driver, stop: &AtomicBool) {
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        match driver.turn() {
            Ok(0) => idle = idle.saturating_add(1),
            Ok(_) => idle = 0,
            // The queue failed (recorded in the endpoint's health): nothing more to drive.
            Err(_) => {
                while !stop.load(Ordering::Acquire) {
                    std::thread::park_timeout(Duration::from_millis(100));
                }
                return;
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
