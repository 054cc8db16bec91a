//! What is posted on a queue: tagged sends and receives, cancels, and what a post's
//! return value means while the provider's queue is full.

use super::Queue;
use crate::error::{check, Error, Result};
use crate::sys;
use std::ffi::c_void;

impl Queue {
    /// Posts a tagged send. `Ok(false)` means the provider said `-FI_EAGAIN`: try again.
    ///
    /// # Safety
    /// `buf` must stay readable for `len` bytes and `context` must point to an `fi_context2`
    /// that stays valid until the operation's completion has been read or the queue closed.
    pub unsafe fn send(
        &mut self,
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        dest: sys::fi_addr_t,
        tag: u64,
        context: *mut c_void,
    ) -> Result<bool> {
        // SAFETY: upheld by the caller as documented above.
        let ret = unsafe { sys::fi_tsend(self.ep, buf, len, desc, dest, tag, context) };
        self.again_or("fi_tsend", ret)
    }

    /// Posts a tagged receive of one or more pieces matching `tag` (bits in `ignore` aside)
    /// from `src` (`ADDR_UNSPEC`: any source).
    ///
    /// # Safety
    /// Every piece must stay writable and `context` valid as for [`Queue::send`]; `desc` has
    /// one entry per piece.
    pub unsafe fn recv(
        &mut self,
        iov: &[libc::iovec],
        desc: &mut [*mut c_void],
        src: sys::fi_addr_t,
        tag: u64,
        ignore: u64,
        context: *mut c_void,
    ) -> Result<bool> {
        debug_assert_eq!(iov.len(), desc.len());
        // SAFETY: upheld by the caller; iovec and struct iovec share their layout.
        let ret = unsafe {
            sys::fi_trecvv(
                self.ep,
                iov.as_ptr().cast(),
                desc.as_mut_ptr(),
                iov.len(),
                src,
                tag,
                ignore,
                context,
            )
        };
        self.again_or("fi_trecv", ret)
    }

    /// Asks the provider to cancel the posted operation whose context has this address (its
    /// completion then reports `FI_ECANCELED`, or it completes normally if it was done).
    /// Returns `fi_cancel`'s answer (negative: the provider found nothing to cancel, or
    /// cannot).
    pub fn cancel(&mut self, context: usize) -> isize {
        // SAFETY: ep is open; cancel only compares the context with those of posted
        // operations and never dereferences one it does not know.
        unsafe { sys::fi_cancel(self.ep.cast(), context as *mut c_void) }
    }

    fn again_or(&mut self, call: &'static str, ret: isize) -> Result<bool> {
        let now = std::time::Instant::now();
        self.backpressure
            .answer(call, ret, &self.shared.provider, now)
    }
}

/// What a post's return value means, remembering since when the queue has been full.
#[derive(Debug, Default)]
pub(super) struct Backpressure {
    /// Since when the provider has refused every post with "no free entry" (-FI_ENOMEM where
    /// it means that, see `quirks::enomem_means_full`); `None` after any post it took.
    full_since: Option<std::time::Instant>,
}

impl Backpressure {
    /// `Ok(true)` taken, `Ok(false)` "not now" (try again), else an error. -FI_EAGAIN is
    /// always "not now" (a dead peer is found by liveness, not here); so is -FI_ENOMEM from
    /// providers that mean "no free entry" by it, until the queue has stayed full for
    /// [`crate::quirks::FULL_FOR_TOO_LONG`].
    fn answer(
        &mut self,
        call: &'static str,
        ret: isize,
        provider: &str,
        now: std::time::Instant,
    ) -> Result<bool> {
        if ret == -(sys::FI_EAGAIN as isize) {
            return Ok(false);
        }
        if ret == -(sys::FI_ENOMEM as isize) && crate::quirks::enomem_means_full(provider) {
            let since = *self.full_since.get_or_insert_with(|| {
                tracing::debug!("{call}: {provider}'s queue is full (-FI_ENOMEM): trying again");
                now
            });
            let limit = crate::quirks::FULL_FOR_TOO_LONG;
            if now.duration_since(since) < limit {
                return Ok(false);
            }
            self.full_since = None;
            let receive = call == "fi_trecv";
            return Err(Error::Internal(format!(
                "{call}: {provider} refused every operation for {} s: its {} queue is full \
                 (-FI_ENOMEM; {}). Raise the provider's limit, or give NCCL fewer channels \
                 (NCCL_MAX_NCHANNELS)",
                limit.as_secs(),
                if receive { "receive" } else { "send" },
                crate::quirks::queue_limit(provider, receive),
            )));
        }
        let taken = check(call, ret as i64).map(|_| true);
        if taken.is_ok() {
            self.full_since = None;
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::Backpressure;
    use crate::sys;
    use std::time::{Duration, Instant};

    const EAGAIN: isize = -(sys::FI_EAGAIN as isize);
    const ENOMEM: isize = -(sys::FI_ENOMEM as isize);

    #[test]
    fn a_full_shm_queue_is_waited_for_then_named() {
        let mut b = Backpressure::default();
        let t0 = Instant::now();
        assert!(!b.answer("fi_trecv", ENOMEM, "shm", t0).unwrap());
        assert!(!b
            .answer("fi_trecv", ENOMEM, "shm", t0 + Duration::from_secs(9))
            .unwrap());
        // A post taken ends the full spell: the next one starts counting anew.
        assert!(b
            .answer("fi_trecv", 0, "shm", t0 + Duration::from_secs(9))
            .unwrap());
        let t1 = t0 + Duration::from_secs(9);
        assert!(!b.answer("fi_trecv", ENOMEM, "shm", t1).unwrap());
        let e = b
            .answer("fi_trecv", ENOMEM, "shm", t1 + Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("receive queue is full") && e.contains("FI_SHM_RX_SIZE"),
            "{e}"
        );
        let e = b
            .answer("fi_tsend", ENOMEM, "sm2", t1)
            .and_then(|_| b.answer("fi_tsend", ENOMEM, "sm2", t1 + Duration::from_secs(11)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("send queue") && e.contains("FI_SM2_TX_SIZE"),
            "{e}"
        );
    }

    #[test]
    fn eagain_is_always_not_now_and_enomem_elsewhere_an_error() {
        let mut b = Backpressure::default();
        let t0 = Instant::now();
        for s in [0, 60, 3600] {
            assert!(!b
                .answer(
                    "fi_tsend",
                    EAGAIN,
                    "tcp;ofi_rxm",
                    t0 + Duration::from_secs(s)
                )
                .unwrap());
        }
        let e = b.answer("fi_trecv", ENOMEM, "tcp;ofi_rxm", t0).unwrap_err();
        assert!(e.to_string().contains("fi_trecv failed"), "{e}");
    }
}
