//! A tagged `FI_EP_RDM` endpoint, in two parts:
//!
//! - [`Endpoint`], shared (`Arc`): the address vector, the endpoint's own address and
//!   what was learnt opening it. Any thread may insert peers or bind registrations.
//! - [`Queue`], owned by exactly one driver (it is `Send` but not `Sync`, and not `Clone`):
//!   posting, cancelling and reading the completion queue. Whoever holds the `Queue` is the
//!   only reader of the completion queue, by construction.
//!
//! `FI_OPT_CUDA_API_PERMITTED=false` is set on every endpoint before `fi_enable`, and the
//! answer is kept: it is the evidence the provider policy decides on.

use crate::address::Shape;
use crate::error::{check, Error, Result};
use crate::fabric::{close_fid, Domain};
use crate::sys;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

/// Entries read from the completion queue per `fi_cq_read`.
pub const CQ_BATCH: usize = 32;
const CQ_SIZE: usize = 4096;
const AV_SIZE: usize = 64;

/// Return value of `fi_setopt(FI_OPT_CUDA_API_PERMITTED=false)`: 0 or a negative errno.
pub type SetoptAnswer = i32;

/// Addresses of this process's endpoints whose queue is open now (see
/// `quirks::names_this_process`). Locked only to look up, add or remove an address.
static OPEN_HERE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Refuses a peer address that is not of `shape` (see `address`), or that names an endpoint
/// of this process that is not open: sending there hangs some providers (libfabric 2.1 shm).
pub fn check_peer_address(shape: &Shape, provider: &str, addr: &[u8]) -> Result<()> {
    shape.check(addr)?;
    if crate::quirks::names_this_process(provider, addr)
        && !OPEN_HERE.lock().iter().any(|a| a == addr)
    {
        return Err(Error::InvalidArgument(format!(
            "the address {} names an endpoint of this process that is not open (a stale or \
             forged handle)",
            crate::fabric::address_text(addr)
        )));
    }
    Ok(())
}

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

/// The shared part of an endpoint.
pub struct Endpoint {
    av: *mut sys::fid_av,
    /// The endpoint's fid, for binding registrations (`FI_MR_ENDPOINT`); valid while the
    /// [`Queue`] is open, which every holder of a registration ensures.
    ep_fid: *mut sys::fid,
    /// The answer to `FI_OPT_CUDA_API_PERMITTED=false` on this endpoint.
    pub cuda_api_answer: SetoptAnswer,
    /// This endpoint's address (`fi_getname`).
    pub name: Vec<u8>,
    /// What peer addresses must look like.
    pub shape: Shape,
    /// Whether receives name their source (`FI_DIRECTED_RECV`).
    pub directed: bool,
    /// Whether completions say who sent a message (`FI_SOURCE`).
    pub source: bool,
    pub provider: String,
    /// Whether receives may carry the overflow area as a second piece (the provider takes two
    /// pieces, and needs no descriptor for host memory or has the area registered), and if
    /// so the area's descriptor in this endpoint's domain (0: none needed).
    pub overflow: Option<usize>,
    pub max_msg_size: usize,
    pub domain: Arc<Domain>,
    /// Sending queues of this process that must close after this endpoint (see
    /// `quirks::sender_waits_for_receiver`); dropped once this endpoint is closed.
    close_after: Mutex<Vec<Retired>>,
}

// SAFETY: the plugin asks for FI_THREAD_SAFE, so the provider serialises concurrent calls on
// the address vector itself; the pointers are only closed from Drop, when no user is left.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

/// A queue given up by its driver, with the owners of what it still had in flight: the
/// queue closes first (fields drop in order), then the owners' memory goes.
pub struct Retired {
    pub queue: Queue,
    pub keep: Vec<Box<dyn Send + Sync>>,
}

/// The driver's part of an endpoint: the endpoint and its completion queue.
pub struct Queue {
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    /// The completion queue's wait object (an fd that polls readable when there is progress
    /// to make), where the provider has one that tells all.
    wait_fd: Option<std::os::fd::RawFd>,
    fabric: *mut sys::fid_fabric,
    shared: Arc<Endpoint>,
    backpressure: Backpressure,
    /// The device's turn lock, where its endpoints must progress one at a time.
    serial: Option<Arc<Mutex<()>>>,
}

// SAFETY: a Queue moves between threads (a lane's progress thread, the control thread) but is
// used by one at a time: it is not Sync and not Clone.
unsafe impl Send for Queue {}

impl Endpoint {
    /// Opens, binds and enables an endpoint, setting `FI_OPT_CUDA_API_PERMITTED=false` first.
    ///
    /// `expected_answer`: fail unless the provider answers exactly this — real endpoints of
    /// a provider whose probe answer allowed GPU buffers must not answer differently later.
    /// The probe endpoint passes `None` and only records the answer.
    pub fn open(
        domain: &Arc<Domain>,
        expected_answer: Option<SetoptAnswer>,
    ) -> Result<(Arc<Endpoint>, Queue)> {
        Self::open_waitable(domain, expected_answer, false)
    }

    /// As [`Endpoint::open`]; with `waitable`, the completion queue asks for a wait object
    /// (for providers whose wait object tells all: `quirks::wait_object_tells_all`);
    /// [`Queue::wait_fd`] says whether it got one.
    pub fn open_waitable(
        domain: &Arc<Domain>,
        expected_answer: Option<SetoptAnswer>,
        waitable: bool,
    ) -> Result<(Arc<Endpoint>, Queue)> {
        let renamed = crate::quirks::shm_source_name(domain.info.info())?;
        let info = renamed.as_ref().map_or(domain.info.info(), |r| r.info());
        let mut cq: *mut sys::fid_cq = ptr::null_mut();
        let mut av: *mut sys::fid_av = ptr::null_mut();
        // Closes what was opened so far if a later step fails.
        let undo = |cq: *mut sys::fid_cq, av: *mut sys::fid_av| {
            close_fid("address vector", av.cast());
            close_fid("completion queue", cq.cast());
        };
        // SAFETY: domain is open; each out-pointer receives a new object (FI_GETWAIT writes
        // one int into `fd`). The attribute structs live on the stack for the duration of the
        // calls that read them.
        unsafe {
            let mut open_cq = |wait_obj| {
                let mut cq_attr = sys::fi_cq_attr {
                    size: CQ_SIZE,
                    format: sys::FI_CQ_FORMAT_TAGGED,
                    wait_obj,
                    ..Default::default()
                };
                sys::fi_cq_open(domain.raw(), &mut cq_attr, &mut cq, ptr::null_mut())
            };
            // A provider that refuses a wait object gets none.
            let with_fd = waitable && open_cq(sys::FI_WAIT_FD) == 0;
            if !with_fd {
                check("fi_cq_open", open_cq(sys::FI_WAIT_NONE))?;
            }
            let mut fd: libc::c_int = -1;
            let wait_fd = (with_fd
                && sys::fi_control(
                    &raw mut (*cq).fid,
                    sys::FI_GETWAIT as i32,
                    (&raw mut fd).cast(),
                ) == 0
                && fd >= 0)
                .then_some(fd);
            // The type the provider asks for, else a table; a provider that takes no table
            // (ucx: FI_AV_MAP only, though it asks for none) gets to choose.
            let mut open_av = |type_| {
                let mut av_attr = sys::fi_av_attr {
                    type_,
                    count: AV_SIZE,
                    ..Default::default()
                };
                sys::fi_av_open(domain.raw(), &mut av_attr, &mut av, ptr::null_mut())
            };
            let wanted = match info.av_type() {
                sys::FI_AV_MAP => sys::FI_AV_MAP,
                _ => sys::FI_AV_TABLE,
            };
            let mut ret = open_av(wanted);
            if ret == -(sys::FI_EINVAL as i32) && wanted == sys::FI_AV_TABLE {
                ret = open_av(sys::FI_AV_UNSPEC);
            }
            if let Err(e) = check("fi_av_open", ret) {
                undo(cq, ptr::null_mut());
                return Err(e);
            }
            let mut ep = ptr::null_mut();
            if let Err(e) = check(
                "fi_endpoint",
                sys::fi_endpoint(domain.raw(), info.raw() as *mut _, &mut ep, ptr::null_mut()),
            ) {
                undo(cq, av);
                return Err(e);
            }
            let setup = || -> Result<SetoptAnswer> {
                check(
                    "fi_ep_bind(cq)",
                    sys::fi_ep_bind(ep, cq.cast(), (sys::FI_TRANSMIT | sys::FI_RECV) as u64),
                )?;
                check("fi_ep_bind(av)", sys::fi_ep_bind(ep, av.cast(), 0))?;
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
            let answer = match setup() {
                Ok(answer) => answer,
                Err(e) => {
                    // The endpoint itself is left open (see quirks); cq and av were never
                    // used by it and are bound to it, so they stay too.
                    if crate::quirks::close_unenabled_endpoints() {
                        close_fid("endpoint", ep.cast());
                        undo(cq, av);
                    }
                    tracing::debug!("endpoint setup failed ({e}); the endpoint is left unclosed");
                    return Err(e);
                }
            };
            // A provider with longer names (ucx: 1024 bytes) says how long: asked again.
            let mut len = 256usize;
            let mut buf = vec![0u8; len];
            let mut ret = sys::fi_getname(&raw mut (*ep).fid, buf.as_mut_ptr().cast(), &mut len);
            if ret == -(sys::FI_ETOOSMALL as i32) && len > buf.len() {
                buf = vec![0u8; len];
                ret = sys::fi_getname(&raw mut (*ep).fid, buf.as_mut_ptr().cast(), &mut len);
            }
            let named = check("fi_getname", ret);
            if let Err(e) = named {
                close_fid("endpoint", ep.cast());
                undo(cq, av);
                return Err(e);
            }
            buf.truncate(len);
            OPEN_HERE.lock().push(buf.clone());
            let overflow_desc = (info.rx_iov_limit() >= 2
                && !crate::quirks::keeps_iov(&info.provider()))
            .then(|| domain.overflow_desc())
            .flatten();
            let shared = Arc::new(Endpoint {
                av,
                ep_fid: ep.cast(),
                cuda_api_answer: answer,
                shape: Shape::of(info.addr_format(), &buf),
                directed: info.caps() & sys::FI_DIRECTED_RECV != 0,
                source: info.caps() & sys::FI_SOURCE != 0
                    && !crate::quirks::source_unreported(&info.provider()),
                name: buf,
                provider: info.provider(),
                overflow: overflow_desc.map(|d| d as usize),
                max_msg_size: info.max_msg_size(),
                domain: domain.clone(),
                close_after: Mutex::new(Vec::new()),
            });
            let queue = Queue {
                ep,
                cq,
                wait_fd,
                fabric: domain.fabric_raw(),
                shared: shared.clone(),
                backpressure: Backpressure::default(),
                serial: crate::quirks::serial_progress(
                    &info.provider(),
                    crate::fabric::runtime_version(),
                )
                .then(|| domain.turns.clone()),
            };
            // The first entry of the address vector is the endpoint itself, so no peer gets
            // fi_addr 0: libfabric 1.17 shm and (at times) tcp;ofi_rxm report a sender that
            // is not in the address vector as fi_addr 0 and let it match a receive bound to
            // that address.
            if let Err(e) = shared.insert(&shared.name) {
                tracing::debug!("could not enter the endpoint's own address first: {e}");
            }
            Ok((shared, queue))
        }
    }

    /// Refuses a peer address this endpoint must not be given (see [`check_peer_address`]).
    pub fn check_peer(&self, addr: &[u8]) -> Result<()> {
        check_peer_address(&self.shape, &self.provider, addr)
    }

    /// Inserts a peer address, checked with [`Endpoint::check_peer`] first; returns its
    /// `fi_addr_t`.
    pub fn insert(&self, addr: &[u8]) -> Result<sys::fi_addr_t> {
        self.check_peer(addr)?;
        let mut out: sys::fi_addr_t = 0;
        // SAFETY: av is open; addr was just checked to hold exactly one address of the
        // provider's format and length (NUL-terminated for string formats), so the provider
        // reads inside it.
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

    /// The endpoint's fid, for binding memory registrations (`FI_MR_ENDPOINT`).
    pub fn fid(&self) -> *mut sys::fid {
        self.ep_fid
    }

    /// Keeps `sender` open until this endpoint has closed.
    pub fn close_before(&self, sender: Retired) {
        self.close_after.lock().push(sender);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        close_fid("address vector", self.av.cast());
        // Sending queues that waited for this endpoint close now (their Drop).
        self.close_after.get_mut().clear();
    }
}

impl Queue {
    /// The lock a driver holds for its turn, if this provider's endpoints of one device must
    /// not progress at the same time (see `quirks::serial_progress`).
    pub fn serial(&self) -> Option<Arc<Mutex<()>>> {
        self.serial.clone()
    }
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.shared
    }

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

impl Drop for Queue {
    fn drop(&mut self) {
        let name = &self.shared.name;
        OPEN_HERE.lock().retain(|a| a != name);
        // The endpoint first (it holds bindings to the queue and the address vector).
        close_fid("endpoint", self.ep.cast());
        close_fid("completion queue", self.cq.cast());
    }
}

impl Queue {
    fn again_or(&mut self, call: &'static str, ret: isize) -> Result<bool> {
        let now = std::time::Instant::now();
        self.backpressure
            .answer(call, ret, &self.shared.provider, now)
    }
}

/// What a post's return value means, remembering since when the queue has been full.
#[derive(Debug, Default)]
struct Backpressure {
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
