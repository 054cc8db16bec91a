//! Opening an endpoint: its completion queue and address vector, bound and enabled, with
//! `FI_OPT_CUDA_API_PERMITTED=false` set first and the answer kept.

use super::peers::OPEN_HERE;
use super::posting::Backpressure;
use super::{Endpoint, Queue, SetoptAnswer, AV_SIZE, CQ_SIZE};
use crate::address::Shape;
use crate::error::{check, Error, Result};
use crate::fabric::{close_fid, Domain};
use crate::sys;
use parking_lot::Mutex;
use std::ptr;
use std::sync::Arc;

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
}
