//! `ncclNetPlugin_v6` (NCCL 2.13–2.18): no device handles, `int` sizes. Its `int`-sized
//! entry points serve v7 and v8 too.

use super::{boundary, byte_count, Lengths};
use crate::exports::props;
use crate::nccl::{Logger, NetV6, PropertiesV6};
use std::ffi::{c_int, c_void};

/// `init` before v10: a logger only.
pub(crate) unsafe extern "C" fn init(logger: Logger) -> c_int {
    boundary("init", || super::init(logger, None))
}

unsafe extern "C" fn get_properties(dev: c_int, p: *mut PropertiesV6) -> c_int {
    // SAFETY: NCCL passes a v6 properties struct.
    boundary("getProperties", || unsafe {
        super::properties(dev, p, props::v6)
    })
}

unsafe extern "C" fn connect(dev: c_int, handle: *mut c_void, sc: *mut *mut c_void) -> c_int {
    // SAFETY: the v8 arguments without a device handle.
    unsafe { super::connect(dev, handle, sc, std::ptr::null_mut()) }
}

unsafe extern "C" fn accept(lc: *mut c_void, rc: *mut *mut c_void) -> c_int {
    // SAFETY: the v8 arguments without a device handle.
    unsafe { super::accept(lc, rc, std::ptr::null_mut()) }
}

/// `regMr` with an `int` size (v6, v7).
pub(crate) unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> c_int {
    match usize::try_from(size) {
        // SAFETY: NCCL's arguments, the size widened.
        Ok(size) => unsafe { super::reg_mr(comm, data, size, kind, mhandle) },
        Err(_) => boundary("regMr", || byte_count(size).map(|_| ())),
    }
}

/// `isend` with an `int` size (v6–v8).
pub(crate) unsafe extern "C" fn isend(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("isend", || {
        let size = byte_count(size)?;
        // SAFETY: NCCL's arguments, without a profiler handle.
        unsafe {
            super::isend(
                comm,
                data,
                size,
                tag,
                mhandle,
                std::ptr::null_mut(),
                request,
            )
        }
    })
}

/// `irecv` with `int` sizes (v6–v8).
pub(crate) unsafe extern "C" fn irecv(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("irecv", || {
        let (sizes, none) = (Lengths::Int(sizes), std::ptr::null_mut());
        // SAFETY: NCCL's arguments, without profiler handles.
        unsafe { super::irecv(comm, n, data, sizes, tags, mhandles, none, request) }
    })
}

/// The table NCCL 2.13–2.18 load.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v6: NetV6 = NetV6 {
    name: super::NAME.as_ptr(),
    init,
    devices: super::devices,
    get_properties,
    listen: super::listen,
    connect,
    accept,
    reg_mr,
    reg_mr_dma_buf: Some(super::reg_mr_dma_buf),
    dereg_mr: super::dereg_mr,
    isend,
    irecv,
    iflush: super::iflush,
    test: super::test,
    close_send: super::close_send,
    close_recv: super::close_recv,
    close_listen: super::close_listen,
};
