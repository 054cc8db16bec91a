//! Sleeping on file descriptors: a progress thread that has nothing to do waits in `poll(2)` on
//! its provider's wait object and on a [`Bell`] that other threads ring when they hand it work.

use std::os::fd::RawFd;
use std::time::Duration;

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
}
