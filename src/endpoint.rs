//! A tagged `FI_EP_RDM` endpoint with its completion queue and address vector.
//!
//! `FI_OPT_CUDA_API_PERMITTED=false` is set on every endpoint before `fi_enable`, and the
//! answer is kept: it is the evidence the provider policy decides on. Operations carry a
//! caller-owned `fi_context2` as their context; [`Endpoint::poll`] hands completions back
//! as those context pointers.

use crate::error::{check, Error, Result};
use crate::fabric::{close_fid, Domain, Info, OwnedInfo};
use crate::sys;
use std::ffi::c_void;
use std::ptr;
use std::sync::{Arc, OnceLock};

/// Entries read from the completion queue per `fi_cq_read`.
pub const CQ_BATCH: usize = 32;
const CQ_SIZE: usize = 4096;
const AV_SIZE: usize = 64;

/// Return value of `fi_setopt(FI_OPT_CUDA_API_PERMITTED=false)`: 0 or a negative errno.
pub type SetoptAnswer = i32;

/// One completion: the operation's context and the bytes it moved.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub context: *mut c_void,
    pub len: usize,
    pub tag: u64,
}

/// A failed operation, from `fi_cq_readerr`.
#[derive(Debug, Clone)]
pub struct Failure {
    pub context: *mut c_void,
    /// Positive errno (`FI_ETRUNC`, `FI_ECANCELED`, …).
    pub err: i32,
    pub prov_errno: i32,
    pub olen: usize,
    pub text: String,
}

/// For shm, the endpoint's info with a source address no earlier process can have used.
///
/// shm names each endpoint's shared-memory file after its source address, by default
/// `fi_shm://<pid>` plus uid and a per-process counter. A file left in /dev/shm by a process
/// that died without cleaning up (killed, or crashed) keeps that name; when a later process
/// gets the same pid, shm finds the pid recorded in the file alive (it is the new process)
/// and `fi_enable` fails with EBUSY. A random part per process rules the clash out.
fn shm_name(info: Info<'_>) -> Result<Option<OwnedInfo>> {
    static NONCE: OnceLock<u64> = OnceLock::new();
    let default = format!("fi_shm://{}", std::process::id());
    if info.provider() != "shm" || info.src_addr_str().as_deref() != Some(default.as_str()) {
        return Ok(None);
    }
    let nonce = NONCE.get_or_init(crate::comm::random_u64);
    info.with_src_addr_str(&format!("{default}-{:08x}", *nonce as u32))
        .map(Some)
}

pub struct Endpoint {
    ep: *mut sys::fid_ep,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    /// The answer to `FI_OPT_CUDA_API_PERMITTED=false` on this endpoint.
    pub cuda_api_answer: SetoptAnswer,
    /// This endpoint's address (`fi_getname`).
    pub name: Vec<u8>,
    pub domain: Arc<Domain>,
}

// SAFETY: the plugin asks for FI_THREAD_SAFE, so the provider serialises concurrent calls on
// these objects itself; the pointers are only closed from Drop, when no other user is left.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// Opens, binds and enables an endpoint, setting `FI_OPT_CUDA_API_PERMITTED=false` first.
    ///
    /// `expected_answer`: fail (`Err`) unless the provider answers exactly this — real
    /// endpoints of a provider whose probe answer allowed GPU buffers must not answer
    /// differently later. The probe endpoint passes `None` and only records the answer.
    pub fn open(domain: &Arc<Domain>, expected_answer: Option<SetoptAnswer>) -> Result<Self> {
        let renamed = shm_name(domain.info.info())?;
        let info = renamed.as_ref().map_or(domain.info.info(), |r| r.info());
        let mut me = Endpoint {
            ep: ptr::null_mut(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            cuda_api_answer: 0,
            name: Vec::new(),
            domain: domain.clone(),
        };
        // SAFETY: domain is open; each out-pointer receives a new object, closed by Drop. The
        // attribute structs live on the stack for the duration of the calls that read them.
        unsafe {
            let mut cq_attr = sys::fi_cq_attr {
                size: CQ_SIZE,
                format: sys::FI_CQ_FORMAT_TAGGED,
                wait_obj: sys::FI_WAIT_NONE,
                ..Default::default()
            };
            check(
                "fi_cq_open",
                sys::fi_cq_open(domain.raw(), &mut cq_attr, &mut me.cq, ptr::null_mut()),
            )?;
            let mut av_attr = sys::fi_av_attr {
                type_: sys::FI_AV_TABLE,
                count: AV_SIZE,
                ..Default::default()
            };
            check(
                "fi_av_open",
                sys::fi_av_open(domain.raw(), &mut av_attr, &mut me.av, ptr::null_mut()),
            )?;
            let mut ep = ptr::null_mut();
            check(
                "fi_endpoint",
                sys::fi_endpoint(domain.raw(), info.raw() as *mut _, &mut ep, ptr::null_mut()),
            )?;
            // Until fi_enable succeeds the endpoint is not stored in `me`: some providers crash
            // when an endpoint that was never bound or enabled is closed (1.17 tcp;ofi_rxm,
            // 2.1 sm2), so such an endpoint is left open rather than closed.
            let setup = || -> Result<SetoptAnswer> {
                check(
                    "fi_ep_bind(cq)",
                    sys::fi_ep_bind(ep, me.cq.cast(), (sys::FI_TRANSMIT | sys::FI_RECV) as u64),
                )?;
                check("fi_ep_bind(av)", sys::fi_ep_bind(ep, me.av.cast(), 0))?;
                let permitted = false;
                let answer = sys::fi_setopt(
                    &raw mut (*ep).fid,
                    sys::FI_OPT_ENDPOINT as i32,
                    sys::OPT_CUDA_API_PERMITTED as i32,
                    (&raw const permitted).cast(),
                    std::mem::size_of::<bool>(),
                );
                if let Some(expected) = expected_answer.filter(|&e| e != answer) {
                    return Err(Error::Internal(format!(
                        "fi_setopt(FI_OPT_CUDA_API_PERMITTED=false) answered {answer} on this \
                         endpoint but {expected} on the probe endpoint that allowed GPU buffers"
                    )));
                }
                check("fi_enable", sys::fi_enable(ep))?;
                Ok(answer)
            };
            match setup() {
                Ok(answer) => {
                    me.ep = ep;
                    me.cuda_api_answer = answer;
                }
                Err(e) => {
                    tracing::debug!("endpoint setup failed ({e}); the endpoint is left unclosed");
                    return Err(e);
                }
            }
            let mut len = 256usize;
            let mut buf = vec![0u8; len];
            check(
                "fi_getname",
                sys::fi_getname(&raw mut (*me.ep).fid, buf.as_mut_ptr().cast(), &mut len),
            )?;
            buf.truncate(len);
            me.name = buf;
        }
        Ok(me)
    }

    /// Inserts a peer address; returns its `fi_addr_t`.
    pub fn insert(&self, addr: &[u8]) -> Result<sys::fi_addr_t> {
        let mut out: sys::fi_addr_t = 0;
        // SAFETY: av is open; addr is a readable buffer holding one address of the provider's
        // format (a bad one is rejected by the provider with a count of 0 or an error).
        let n = unsafe {
            sys::fi_av_insert(
                self.av,
                addr.as_ptr().cast(),
                1,
                &mut out,
                0,
                ptr::null_mut(),
            )
        };
        if n != 1 {
            return Err(if n < 0 {
                Error::fabric("fi_av_insert", n)
            } else {
                Error::InvalidArgument("fi_av_insert rejected the peer address".into())
            });
        }
        Ok(out)
    }

    /// Posts a tagged send. `Ok(false)` means the provider said `-FI_EAGAIN`: try again.
    ///
    /// # Safety
    /// `buf` must stay readable for `len` bytes and `context` must point to an `fi_context2`
    /// that stays valid until the operation's completion has been read from the queue.
    pub unsafe fn tsend(
        &self,
        buf: *const c_void,
        len: usize,
        desc: *mut c_void,
        dest: sys::fi_addr_t,
        tag: u64,
        context: *mut c_void,
    ) -> Result<bool> {
        // SAFETY: upheld by the caller as documented above.
        let ret = unsafe { sys::fi_tsend(self.ep, buf, len, desc, dest, tag, context) };
        if ret == -(sys::FI_EAGAIN as isize) {
            return Ok(false);
        }
        check("fi_tsend", ret as i64).map(|_| true)
    }

    /// Posts a tagged receive matching `tag` exactly (`ignore` = 0) from any source.
    ///
    /// # Safety
    /// As [`Endpoint::tsend`], with `buf` writable.
    pub unsafe fn trecv(
        &self,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        tag: u64,
        context: *mut c_void,
    ) -> Result<bool> {
        // SAFETY: upheld by the caller as documented above.
        let ret =
            unsafe { sys::fi_trecv(self.ep, buf, len, desc, sys::ADDR_UNSPEC, tag, 0, context) };
        if ret == -(sys::FI_EAGAIN as isize) {
            return Ok(false);
        }
        check("fi_trecv", ret as i64).map(|_| true)
    }

    /// Asks the provider to cancel a posted operation (its completion then reports
    /// `FI_ECANCELED`, or it completes normally if it was already done).
    ///
    /// # Safety
    /// `context` must be a context this crate posted on this endpoint (or one already done).
    pub unsafe fn cancel(&self, context: *mut c_void) {
        // SAFETY: ep is open; cancel only looks the context up among posted operations.
        unsafe { sys::fi_cancel(self.ep.cast(), context) };
    }

    /// The endpoint's fid, for binding memory registrations (`FI_MR_ENDPOINT`).
    pub fn fid(&self) -> *mut sys::fid {
        self.ep.cast()
    }

    /// Drives progress and reads up to [`CQ_BATCH`] completions, handing each to `done`, or
    /// one error entry to `failed`. Returns how many entries were read.
    pub fn poll(
        &self,
        mut done: impl FnMut(Completion),
        failed: impl FnOnce(Failure),
    ) -> Result<usize> {
        let mut entries = [sys::fi_cq_tagged_entry::default(); CQ_BATCH];
        // SAFETY: cq is open; entries has room for CQ_BATCH tagged entries (the CQ's format).
        let n = unsafe { sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), CQ_BATCH) };
        if n > 0 {
            for e in &entries[..n as usize] {
                done(Completion {
                    context: e.op_context,
                    len: e.len,
                    tag: e.tag,
                });
            }
            return Ok(n as usize);
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
        failed(Failure {
            context: err.op_context,
            err: err.err,
            prov_errno: err.prov_errno,
            olen: err.olen,
            text,
        });
        Ok(1)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // The endpoint first (it holds bindings to the queue and the address vector).
        close_fid("endpoint", self.ep.cast());
        close_fid("address vector", self.av.cast());
        close_fid("completion queue", self.cq.cast());
    }
}
