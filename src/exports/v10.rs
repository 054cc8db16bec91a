//! `ncclNetPlugin_v10` (NCCL 2.26–2.27): a profiler callback at `init`, a comm config at
//! `connect`, profiler handles in `isend`/`irecv` (which v11 and v12 keep).

use super::{boundary, v9, Lengths};
use crate::nccl::{DeviceHandleV8, Logger, NetV10, ProfilerFn};
use std::ffi::{c_int, c_void};

unsafe extern "C" fn init(logger: Logger, profiler: ProfilerFn) -> c_int {
    boundary("init", || super::init(logger, profiler))
}

unsafe extern "C" fn connect(
    dev: c_int,
    _config: *mut c_void,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dc: *mut *mut DeviceHandleV8,
) -> c_int {
    // SAFETY: the v8 arguments; the traffic class in the config does not apply here.
    unsafe { super::connect(dev, handle, sc, dc) }
}

/// `isend` with a profiler handle (v10–v12).
pub(crate) unsafe extern "C" fn isend(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    // SAFETY: NCCL's arguments as they are.
    boundary("isend", || unsafe {
        super::isend(comm, data, size, tag, mhandle, phandle, request)
    })
}

/// `irecv` with profiler handles (v10–v12).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn irecv(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("irecv", || {
        let sizes = Lengths::Size(sizes);
        // SAFETY: NCCL's arguments as they are.
        unsafe { super::irecv(comm, n, data, sizes, tags, mhandles, phandles, request) }
    })
}

/// The table NCCL 2.26–2.27 load.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v10: NetV10 = NetV10 {
    name: super::NAME.as_ptr(),
    init,
    devices: super::devices,
    get_properties: v9::get_properties,
    listen: super::listen,
    connect,
    accept: super::accept,
    reg_mr: super::reg_mr,
    reg_mr_dma_buf: Some(super::reg_mr_dma_buf),
    dereg_mr: super::dereg_mr,
    isend,
    irecv,
    iflush: super::iflush,
    test: super::test,
    close_send: super::close_send,
    close_recv: super::close_recv,
    close_listen: super::close_listen,
    get_device_mr: Some(super::get_device_mr),
    irecv_consumed: Some(super::irecv_consumed),
    make_v_device: None,
};
