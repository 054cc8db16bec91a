//! Registrations: `regMr`, `regMrDmaBuf` (not advertised), `deregMr`, `getDeviceMr`, and
//! the descriptors an operation takes from its registration.

use super::boundary::{boundary, out};
use crate::comm::{Comm, Descs, Direction, Registered, NO_DESCS};
use crate::error::{Error, Result};
use crate::gdr::Side;
use crate::mr::{cuda_device_of, Memory, MemoryRegion};
use crate::nccl;
use crate::opaque;
use crate::plugin;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// `regMr` of every version (sizes are `int` until v7).
pub(crate) unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> c_int {
    boundary("regMr", || {
        // SAFETY: NCCL passes a send or recv comm we returned and an out-pointer.
        let (comm, slot) =
            unsafe { (opaque::borrow::<Arc<Comm>>(comm)?, out(mhandle, "mhandle")?) };
        *slot = std::ptr::null_mut();
        let plugin = plugin::get()?;
        if let Some(d) = plugin.devices.get(comm.dev) {
            d.buffers.note(
                match comm.dir {
                    Direction::Send => Side::Send,
                    Direction::Recv => Side::Recv,
                },
                kind,
            );
        }
        let memory = match kind {
            nccl::PTR_HOST => Memory::Host,
            nccl::PTR_CUDA if plugin.gpu => Memory::Cuda {
                device: cuda_device_of(data as usize),
            },
            nccl::PTR_CUDA => {
                return Err(Error::InvalidArgument(
                    "CUDA buffer offered, but this plugin told NCCL it takes host buffers only"
                        .into(),
                ))
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown buffer type {other}"
                )))
            }
        };
        // SAFETY: NCCL keeps the buffer allocated until deregMr.
        *slot = opaque::into_raw(unsafe { MemoryRegion::register(comm, data, size, memory)? });
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn reg_mr_dma_buf(
    _comm: *mut c_void,
    _data: *mut c_void,
    _size: usize,
    _kind: c_int,
    _offset: u64,
    _fd: c_int,
    mhandle: *mut *mut c_void,
) -> c_int {
    boundary("regMrDmaBuf", || {
        // SAFETY: NULL or NCCL's out-pointer for the handle, writable for one pointer.
        if let Some(slot) = unsafe { mhandle.as_mut() } {
            *slot = std::ptr::null_mut();
        }
        Err(Error::Internal(
            "DMA-BUF registration was not advertised (ptrSupport has no NCCL_PTR_DMABUF)".into(),
        ))
    })
}

pub(crate) unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> c_int {
    boundary("deregMr", || {
        // SAFETY: NCCL passes the comm and mhandle it got from us.
        unsafe { opaque::borrow::<Arc<Comm>>(comm)? };
        // NULL: nothing was registered.
        if !mhandle.is_null() {
            // SAFETY: mhandle came from reg_mr and NCCL releases it once.
            drop(unsafe { opaque::take::<MemoryRegion>(mhandle)? });
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn get_device_mr(
    _comm: *mut c_void,
    _mhandle: *mut c_void,
    dptr: *mut *mut c_void,
) -> c_int {
    boundary("getDeviceMr", || {
        // A host plugin has no device-side handles.
        // SAFETY: NULL or NCCL's out-pointer for the device handle, writable for one pointer.
        if let Some(slot) = unsafe { dptr.as_mut() } {
            *slot = std::ptr::null_mut();
        }
        Ok(())
    })
}

/// The descriptors of `mhandle` for an operation on `comm` of `len` bytes at `data` (one
/// per leg), whether it is host memory, and where the comm's domains claim `FI_MR_LOCAL`
/// the registration itself (see `comm::Registered`). Without an mhandle (NCCL always gives
/// one; other callers may not) on such a comm, the comm registers the host buffer itself,
/// once per address and length.
///
/// # Safety
/// `mhandle` must be NULL or a registration we returned.
pub(super) unsafe fn desc_of(
    comm: &Comm,
    mhandle: *mut c_void,
    data: *mut c_void,
    len: usize,
) -> Result<(Descs, bool, Option<*const dyn Registered>)> {
    let needs = comm.needs_descs();
    if mhandle.is_null() {
        if len == 0 || !needs {
            return Ok((NO_DESCS, true, None));
        }
        let region = comm.adhoc(data as usize, len, || {
            // SAFETY: only domains whose registrations pin nothing claim FI_MR_LOCAL
            // (`quirks::claim_local_mr`: tcp), so a registration that outlives the buffer
            // is only an entry in the provider's key map; while the buffer lives it is
            // valid for `len` bytes (the caller's promise for the operation).
            let r = unsafe { MemoryRegion::register(comm, data, len, Memory::Host)? };
            Ok(Arc::new(r) as Arc<dyn Registered>)
        })?;
        // The comm holds the registration until it closes, past this operation's posting.
        let at = Arc::as_ptr(&region);
        return Ok((region.descs(), true, Some(at)));
    }
    // SAFETY: per the caller.
    match unsafe { opaque::borrow::<MemoryRegion>(mhandle)? } {
        region if region.fits(comm) => Ok((
            region.descs(),
            region.memory == Memory::Host,
            needs.then_some(region as &dyn Registered as *const dyn Registered),
        )),
        _ => Err(Error::InvalidArgument(
            "the mhandle was registered on another comm (each comm's endpoints have \
             libfabric domains of their own): register the buffer with regMr on the comm \
             that uses it"
                .into(),
        )),
    }
}
