//! The C ABI: the immutable `ncclNetPlugin_v8` table NCCL looks up, and its entry points.
//!
//! Each entry point checks its pointers, converts types and calls the version-free code in
//! `plugin`, `connection`, `comm` and `mr`, all inside [`boundary`], which turns an error
//! into its `ncclResult_t` plus one WARN line, and a panic into `ncclInternalError`: nothing
//! unwinds into NCCL. The v8 table lives here; [`v11`] adapts the same bodies to v11.

pub mod v11;

use crate::comm::{Comm, Direction, Request};
use crate::connection::{self, ListenComm};
use crate::error::{Error, Result};
use crate::mr::{cuda_device_of, Memory, MemoryRegion};
use crate::nccl::{self, DeviceHandleV8, Logger, NcclResult, NetV8, PropertiesV8};
use crate::opaque;
use crate::plugin;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Runs an entry point's body: errors become their `ncclResult_t` and a WARN line, panics
/// become `ncclInternalError`.
pub(crate) fn boundary(call: &'static str, body: impl FnOnce() -> Result<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NcclResult::Success as c_int,
        Ok(Err(e)) => {
            tracing::warn!("{call}: {e}");
            e.nccl_result() as c_int
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // Logging itself must not unwind out of here either.
            let _ = catch_unwind(|| {
                tracing::warn!(
                    "{call}: internal error ({what}); this is a plugin bug, please report it"
                )
            });
            NcclResult::InternalError as c_int
        }
    }
}

/// Writes through an out-pointer NCCL passed, refusing NULL.
///
/// # Safety
/// `p` must be NULL or valid for writing a `T`.
pub(crate) unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: per the caller, p is NULL or valid for writes.
    unsafe { p.as_mut() }.ok_or_else(|| Error::InvalidArgument(format!("{what} is NULL")))
}

pub(crate) fn init_body(logger: Logger) -> Result<()> {
    crate::log::init_nccl(logger);
    plugin::init().map(|_| ())
}

unsafe extern "C" fn init(logger: Logger) -> c_int {
    boundary("init", || init_body(logger))
}

pub(crate) unsafe extern "C" fn devices(ndev: *mut c_int) -> c_int {
    boundary("devices", || {
        let n = plugin::get()?.devices.len();
        // SAFETY: NCCL passes a pointer to an int.
        *unsafe { out(ndev, "ndev") }? = c_int::try_from(n).unwrap_or(c_int::MAX);
        Ok(())
    })
}

unsafe extern "C" fn get_properties(dev: c_int, props: *mut PropertiesV8) -> c_int {
    boundary("getProperties", || {
        let plugin = plugin::get()?;
        let device = plugin.device(dev)?;
        // SAFETY: NCCL passes a pointer to a properties struct of the v8 layout.
        *unsafe { out(props, "props") }? = device.props.to_v8();
        Ok(())
    })
}

/// # Safety
/// `handle` must be NULL or point to `NCCL_NET_HANDLE_MAXSIZE` writable (or readable) bytes.
pub(crate) unsafe fn handle_bytes<'a>(
    handle: *mut c_void,
) -> Result<&'a mut [u8; nccl::NET_HANDLE_MAXSIZE]> {
    // SAFETY: per the caller; NCCL's handle buffers are NCCL_NET_HANDLE_MAXSIZE bytes.
    unsafe { out(handle.cast::<[u8; nccl::NET_HANDLE_MAXSIZE]>(), "handle") }
}

pub(crate) unsafe extern "C" fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> c_int {
    boundary("listen", || {
        // SAFETY: NCCL passes its handle buffer and an out-pointer.
        let (handle, slot) = unsafe { (handle_bytes(handle)?, out(listen_comm, "listenComm")?) };
        *slot = std::ptr::null_mut();
        let l = connection::listen(&*plugin::get()?, dev, handle)?;
        *slot = opaque::into_raw(l);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut DeviceHandleV8,
) -> c_int {
    boundary("connect", || {
        // SAFETY: NCCL passes the peer's handle and an out-pointer.
        let (handle, slot) = unsafe { (handle_bytes(handle)?, out(send_comm, "sendComm")?) };
        *slot = std::ptr::null_mut();
        if let Some(comm) = connection::connect(&*plugin::get()?, dev, handle)? {
            *slot = opaque::into_raw(comm);
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _recv_dev_comm: *mut *mut DeviceHandleV8,
) -> c_int {
    boundary("accept", || {
        // SAFETY: NCCL passes the listenComm we returned and an out-pointer.
        let (l, slot) = unsafe {
            (
                opaque::borrow::<ListenComm>(listen_comm)?,
                out(recv_comm, "recvComm")?,
            )
        };
        *slot = std::ptr::null_mut();
        if let Some(comm) = l.accept(&*plugin::get()?)? {
            *slot = opaque::into_raw(comm);
        }
        Ok(())
    })
}

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
        let memory = match kind {
            nccl::PTR_HOST => Memory::Host,
            nccl::PTR_CUDA if plugin::get()?.gpu => Memory::Cuda {
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

/// The descriptor of `mhandle` for an operation on `comm`, and whether it is host memory.
///
/// # Safety
/// `mhandle` must be NULL or a registration we returned.
unsafe fn desc_of(comm: &Comm, mhandle: *mut c_void) -> Result<(*mut c_void, bool)> {
    if mhandle.is_null() {
        return Ok((std::ptr::null_mut(), true));
    }
    // SAFETY: per the caller.
    match unsafe { opaque::borrow::<MemoryRegion>(mhandle)? } {
        region if region.fits(comm) => Ok((region.desc(), region.memory == Memory::Host)),
        _ => Err(Error::InvalidArgument(
            "the mhandle was registered on another comm (each comm's endpoint has its own \
             libfabric domain): register the buffer with regMr on the comm that uses it"
                .into(),
        )),
    }
}

/// Sizes as NCCL passes them: `int` up to v8, `size_t` from v9 on.
pub(crate) fn byte_count(size: impl TryInto<usize> + Copy + std::fmt::Display) -> Result<usize> {
    match size.try_into() {
        Ok(n) if n <= crate::device::MAX_MESSAGE_BYTES => Ok(n),
        _ => Err(Error::InvalidArgument(format!(
            "message size {size} is negative or above {} bytes",
            crate::device::MAX_MESSAGE_BYTES
        ))),
    }
}

/// isend/irecv of every version: checks the comm's direction and posts one buffer.
///
/// # Safety
/// `send_or_recv_comm` and `mhandle` as NCCL passes them; `request` an out-pointer; `data`
/// valid for `len` bytes until the request completes.
pub(crate) unsafe fn post_one(
    call: Direction,
    comm: *mut c_void,
    data: *mut c_void,
    len: usize,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: per the caller.
    let (comm, slot) = unsafe { (opaque::borrow::<Arc<Comm>>(comm)?, out(request, "request")?) };
    // NCCL may pre-set a receive request as a hint (v9+); we always write ours.
    *slot = std::ptr::null_mut();
    // SAFETY: per the caller.
    unsafe { post(comm, call, data, len, mhandle, slot) }
}

/// # Safety
/// As [`post_one`].
unsafe fn post(
    comm: &Arc<Comm>,
    want: Direction,
    data: *mut c_void,
    len: usize,
    mhandle: *mut c_void,
    request: &mut *mut c_void,
) -> Result<()> {
    if comm.dir != want {
        return Err(Error::InvalidArgument(format!(
            "{:?} called on a {:?} comm",
            want, comm.dir
        )));
    }
    // SAFETY: NCCL passes the mhandle regMr gave it, or NULL.
    let (desc, host) = unsafe { desc_of(comm, mhandle)? };
    // SAFETY: the caller keeps `data` valid for `len` bytes until the request is done.
    *request = unsafe { comm.post(data, len, desc, host)? }.unwrap_or(std::ptr::null_mut());
    Ok(())
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    _tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("isend", || {
        // SAFETY: NCCL passes a sendComm we returned, its buffer and an out-pointer.
        unsafe {
            post_one(
                Direction::Send,
                send_comm,
                data,
                byte_count(size)?,
                mhandle,
                request,
            )
        }
    })
}

unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    _tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("irecv", || {
        // SAFETY: NCCL passes one-element arrays for n == 1 (checked first).
        unsafe {
            let (buf, size, mh) = one_buffer(n, data, sizes, mhandles)?;
            post_one(
                Direction::Recv,
                recv_comm,
                buf,
                byte_count(size)?,
                mh,
                request,
            )
        }
    })
}

/// The one buffer of a grouped receive (`maxRecvs` is 1).
///
/// # Safety
/// For n == 1, `data` and `sizes` point to one element each; `mhandles` likewise or NULL.
pub(crate) unsafe fn one_buffer<S: Copy>(
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut S,
    mhandles: *mut *mut c_void,
) -> Result<(*mut c_void, S, *mut c_void)> {
    if n != 1 {
        return Err(Error::InvalidArgument(format!(
            "irecv of {n} buffers; this plugin reports maxRecvs {}",
            crate::device::MAX_RECVS
        )));
    }
    // SAFETY: per the caller.
    unsafe {
        Ok((
            *out(data, "data")?,
            *out(sizes, "sizes")?,
            mhandles.as_ref().copied().unwrap_or(std::ptr::null_mut()),
        ))
    }
}

pub(crate) unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("iflush", || {
        // SAFETY: NCCL passes a recvComm we returned and an out-pointer.
        let (_, slot) = unsafe {
            (
                opaque::borrow::<Arc<Comm>>(recv_comm)?,
                out(request, "request")?,
            )
        };
        // Received data is already where NCCL reads it: nothing to flush ("already done").
        *slot = std::ptr::null_mut();
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> c_int {
    boundary("test", || {
        // SAFETY: NCCL passes a request we returned and an out-pointer for `done`.
        let (req, done) = unsafe { (Request::from_handle(request)?, out(done, "done")?) };
        *done = 0;
        if let Some(n) = req.test()? {
            *done = 1;
            // SAFETY: NCCL passes a size slot (one per grouped buffer: we have one) or NULL.
            if let Some(s) = unsafe { sizes.as_mut() } {
                *s = c_int::try_from(n).unwrap_or(c_int::MAX);
            }
        }
        Ok(())
    })
}

/// # Safety
/// `comm` must be NULL or a comm we returned that NCCL closes once.
unsafe fn close_comm(comm: *mut c_void, want: Direction) -> Result<()> {
    // SAFETY: per the caller.
    let c = unsafe { opaque::borrow::<Arc<Comm>>(comm)? };
    if c.dir != want {
        return Err(Error::InvalidArgument(format!(
            "close{want:?} called on a {:?} comm",
            c.dir
        )));
    }
    // SAFETY: comm came from connect/accept; NCCL gives it back once.
    unsafe { opaque::take::<Arc<Comm>>(comm)? }.close();
    Ok(())
}

pub(crate) unsafe extern "C" fn close_send(comm: *mut c_void) -> c_int {
    // SAFETY: NCCL passes a sendComm we returned, once.
    boundary("closeSend", || unsafe { close_comm(comm, Direction::Send) })
}

pub(crate) unsafe extern "C" fn close_recv(comm: *mut c_void) -> c_int {
    // SAFETY: NCCL passes a recvComm we returned, once.
    boundary("closeRecv", || unsafe { close_comm(comm, Direction::Recv) })
}

pub(crate) unsafe extern "C" fn close_listen(listen_comm: *mut c_void) -> c_int {
    boundary("closeListen", || {
        // SAFETY: NCCL passes a listenComm we returned, once.
        unsafe { opaque::take::<ListenComm>(listen_comm)? }.close();
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
        if let Some(slot) = unsafe { dptr.as_mut() } {
            *slot = std::ptr::null_mut();
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn irecv_consumed(
    _recv_comm: *mut c_void,
    _n: c_int,
    _request: *mut c_void,
) -> c_int {
    // Receives are finished when test() says so; nothing more to release.
    NcclResult::Success as c_int
}

/// The table NCCL 2.20+ loads (`NCCL_NET_PLUGIN` or `LD_PRELOAD`).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v8: NetV8 = NetV8 {
    name: c"Fabric".as_ptr(),
    init,
    devices,
    get_properties,
    listen,
    connect,
    accept,
    reg_mr,
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr,
    isend,
    irecv,
    iflush,
    test,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: Some(get_device_mr),
    irecv_consumed: Some(irecv_consumed),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_maps_errors_and_catches_panics() {
        assert_eq!(boundary("t", || Ok(())), 0);
        let invalid = boundary("t", || Err(Error::InvalidArgument("bad".into())));
        assert_eq!(invalid, NcclResult::InvalidArgument as c_int);
        let remote = boundary("t", || Err(Error::Remote("gone".into())));
        assert_eq!(remote, NcclResult::RemoteError as c_int);
        let panicked = boundary("t", || panic!("a bug"));
        assert_eq!(panicked, NcclResult::InternalError as c_int);
    }
}
