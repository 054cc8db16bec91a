//! Sleeping on file descriptors: a progress thread that has nothing to do waits in `poll(2)` on
//! its providers' wait objects and on a [`Bell`] that other threads ring when they hand it work
//! (through its [`Waker`]).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;
use std::time::Duration;

/// Whether a driver may sleep now, and on what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sleep {
    /// It has no wait object, or posts the provider refused wait to be tried again: the
    /// thread spins, yields or naps instead.
    Cannot,
    /// Something is ready that a read would return: turn again now.
    Ready,
    /// Its provider's fd polls readable when there is progress to make.
    On(RawFd),
}

/// How other threads wake a progress thread: unpark it, and ring its bell while it sleeps in
/// `poll` (see [`Waker::doze`]).
pub struct Waker {
    thread: Thread,
    /// `None` when the system had no eventfd left: the thread then naps instead.
    bell: Option<Bell>,
    asleep: AtomicBool,
    /// A wake came since the thread last looked (see [`Waker::look`]).
    called: AtomicBool,
}

impl Waker {
    /// A waker for `thread` (the calling thread, in practice).
    pub fn new(thread: Thread) -> Waker {
        let bell = Bell::new()
            .map_err(|e| tracing::debug!("no eventfd for a progress thread ({e}); it naps instead"))
            .ok();
        Waker {
            thread,
            bell,
            asleep: AtomicBool::new(false),
            called: AtomicBool::new(false),
        }
    }

    /// Wakes the thread if it naps or sleeps (work came, or it is to stop).
    pub fn wake(&self) {
        self.called.store(true, Ordering::Relaxed);
        // Pairs with the fence in `doze`: either the thread sees the call before it sleeps,
        // or this sees it asleep and rings.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed) {
            if let Some(b) = &self.bell {
                b.ring();
            }
        }
        self.thread.unpark();
    }

    /// Forgets earlier wakes: the thread is about to ask its providers whether it may sleep
    /// (`fi_trywait`), which sees what was posted so far. A wake after this (an NCCL call
    /// that posted to a provider itself, after the provider's answer) keeps [`Waker::doze`]
    /// from sleeping on an answer that no longer holds.
    pub fn look(&self) {
        self.called.store(false, Ordering::Relaxed);
    }

    /// Sleeps in `poll` on `fds` and the bell for at most `timeout`, unless a wake came since
    /// [`Waker::look`] or `ready` (asked after the thread is marked asleep) says work came
    /// meanwhile. False if there is no bell to sleep on.
    pub fn doze(
        &self,
        fds: &mut Vec<RawFd>,
        timeout: Duration,
        ready: impl FnOnce() -> bool,
    ) -> bool {
        let Some(bell) = &self.bell else {
            return false;
        };
        self.asleep.store(true, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        if !self.called.load(Ordering::Relaxed) && !ready() {
            fds.push(bell.fd());
            readable(fds, timeout);
            fds.pop();
        }
        self.asleep.store(false, Ordering::Relaxed);
        bell.silence();
        true
    }
}

/// An eventfd: rung by any thread, heard by the one that polls it.
pub struct Bell {
    fd: RawFd,
}

impl Bell {
    pub fn new() -> std::io::Result<Bell> {
        // SAFETY: eventfd takes no pointers; a negative answer is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Bell { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: fd is this bell's open eventfd; the write reads 8 bytes from `one`. A full
        // counter (EAGAIN) means it is rung already.
        unsafe { libc::write(self.fd, (&raw const one).cast(), 8) };
    }

    /// Takes the rings heard so far, so that the next poll waits again.
    pub fn silence(&self) {
        let mut count: u64 = 0;
        // SAFETY: fd is this bell's open eventfd (non-blocking); the read writes 8 bytes into
        // `count`.
        unsafe { libc::read(self.fd, (&raw mut count).cast(), 8) };
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        // SAFETY: fd is open and owned by this bell alone.
        unsafe { libc::close(self.fd) };
    }
}

/// Waits until one of `fds` is readable or `timeout` has passed; true if one is (or the wait
/// failed: the caller then looks for work at once rather than sleeping on a broken wait).
pub fn readable(fds: &[RawFd], timeout: Duration) -> bool {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
    // SAFETY: `polled` holds fds.len() initialised pollfd entries for the call to fill.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    n != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_bell_wakes_a_poll_until_silenced() {
        let bell = Bell::new().unwrap();
        assert!(!readable(&[bell.fd()], Duration::ZERO));
        bell.ring();
        bell.ring();
        assert!(readable(&[bell.fd()], Duration::from_secs(5)));
        bell.silence();
        assert!(!readable(&[bell.fd()], Duration::ZERO));
    }

    #[test]
    fn a_ring_from_another_thread_ends_the_wait() {
        let bell = std::sync::Arc::new(Bell::new().unwrap());
        let ringer = bell.clone();
        let start = Instant::now();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            ringer.ring();
        });
        assert!(readable(&[bell.fd()], Duration::from_secs(30)));
        assert!(start.elapsed() < Duration::from_secs(30));
        t.join().unwrap();
    }

    /// A wake that came after the thread looked, before it dozed (an NCCL call posting to
    /// the provider itself between the provider's "you may sleep" and the sleep), keeps it
    /// awake; one from before it looked does not.
    #[test]
    fn a_wake_between_looking_and_dozing_keeps_the_thread_awake() {
        let waker = Waker::new(std::thread::current());
        let mut fds = Vec::new();
        let long = Duration::from_secs(30);
        waker.look();
        waker.wake();
        let start = Instant::now();
        assert!(waker.doze(&mut fds, long, || false));
        assert!(start.elapsed() < Duration::from_secs(10), "it slept");
        waker.wake();
        waker.look();
        let start = Instant::now();
        assert!(waker.doze(&mut fds, Duration::from_millis(100), || false));
        assert!(
            start.elapsed() >= Duration::from_millis(90),
            "a wake it had already seen kept it awake"
        );
    }
}
