//! Reading a queue's completions: what the completion queue said about each operation, and
//! whether its driver may sleep on the queue's wait object.

use super::{Queue, CQ_BATCH};
use crate::error::{Error, Result};
use crate::sys;
use std::ffi::c_void;
use std::ptr;

/// What the completion queue said about one operation.
#[derive(Debug, Clone)]
pub enum Event {
    /// Finished: bytes moved; for a receive on an endpoint with `FI_SOURCE`, who sent it.
    Done {
        context: *mut c_void,
        len: usize,
        /// The message's tag (a receive's; what a send's entry holds otherwise).
        tag: u64,
        src: Option<sys::fi_addr_t>,
    },
    /// Failed (`fi_cq_readerr`); the context may be NULL (an error of the endpoint itself).
    Failed(Failure),
}

/// A failed operation, from `fi_cq_readerr`.
#[derive(Debug, Clone)]
pub struct Failure {
    pub context: *mut c_void,
    /// Positive errno (`FI_ETRUNC`, `FI_ECANCELED`, …); providers differ in its sign.
    pub err: i32,
    pub prov_errno: i32,
    pub olen: usize,
    /// The message's tag, where the provider says (0 otherwise).
    pub tag: u64,
    pub text: String,
}

impl Queue {
    /// The fd to sleep on for this queue's progress (see [`Queue::may_sleep`]).
    pub fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.wait_fd
    }

    /// Whether the driver may sleep on [`Queue::wait_fd`] now: `fi_trywait` found nothing
    /// ready that a read would return, so the fd polls readable when something is. Only
    /// after a read found nothing.
    pub fn may_sleep(&mut self) -> bool {
        if self.wait_fd.is_none() {
            return false;
        }
        // SAFETY: fabric and cq are open (the queue holds the endpoint, which holds its
        // domain and fabric); the array holds the one fid the call reads.
        unsafe {
            let mut fids = [&raw mut (*self.cq).fid];
            sys::fi_trywait(self.fabric, fids.as_mut_ptr(), 1) == 0
        }
    }

    /// Drives progress and reads up to [`CQ_BATCH`] entries into `out`; returns how many.
    /// An error of the queue itself is returned; failed operations come back as events.
    pub fn poll(&mut self, out: &mut Vec<Event>) -> Result<usize> {
        let mut entries = [sys::fi_cq_tagged_entry::default(); CQ_BATCH];
        let mut srcs = [sys::ADDR_UNSPEC; CQ_BATCH];
        let source = self.shared.source;
        // SAFETY: cq is open; entries has room for CQ_BATCH tagged entries (the CQ's format)
        // and srcs for as many addresses.
        let n = unsafe {
            match source {
                true => sys::fi_cq_readfrom(
                    self.cq,
                    entries.as_mut_ptr().cast(),
                    CQ_BATCH,
                    srcs.as_mut_ptr(),
                ),
                false => sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), CQ_BATCH),
            }
        };
        if n > 0 {
            let n = n as usize;
            out.extend(
                entries[..n]
                    .iter()
                    .zip(&srcs[..n])
                    .map(|(e, &src)| Event::Done {
                        context: e.op_context,
                        len: e.len,
                        tag: e.tag,
                        src: (source && e.flags & sys::FI_RECV as u64 != 0).then_some(src),
                    }),
            );
            return Ok(n);
        }
        if n == 0 || n == -(sys::FI_EAGAIN as isize) {
            return Ok(0);
        }
        if n != -(sys::FI_EAVAIL as isize) {
            return Err(Error::fabric("fi_cq_read", n as i64));
        }
        let mut err = sys::fi_cq_err_entry::default();
        // SAFETY: cq is open and reported an error entry; err is a zeroed entry (err_data NULL,
        // so the provider uses its own buffer for the text, valid until the next readerr).
        let r = unsafe { sys::fi_cq_readerr(self.cq, &mut err, 0) };
        if r == -(sys::FI_EAGAIN as isize) || r == 0 {
            // Another read took the entry, or it is not ready yet: nothing to report.
            return Ok(0);
        }
        if r < 0 {
            return Err(Error::fabric("fi_cq_readerr", r as i64));
        }
        // SAFETY: cq is open; err was just filled by fi_cq_readerr.
        let text = unsafe {
            let p = sys::fi_cq_strerror(self.cq, err.prov_errno, err.err_data, ptr::null_mut(), 0);
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        out.push(Event::Failed(Failure {
            context: err.op_context,
            err: err.err,
            prov_errno: err.prov_errno,
            olen: err.olen,
            tag: err.tag,
            text,
        }));
        Ok(1)
    }
}
