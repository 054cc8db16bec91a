//! `ncclNetPlugin_v9` (NCCL 2.24–2.25): `size_t` sizes in `isend`/`irecv`, properties with
//! virtual devices and transfer limits, `makeVDevice` (not offered).

use super::{boundary, props, v6, Lengths};
use crate::nccl::{NetV9, PropertiesV9};
use std::ffi::{c_int, c_void};

/// `getProperties` of v9 and v10 (the same layout).
pub(crate) unsafe extern "C" fn get_properties(dev: c_int, p: *mut PropertiesV9) -> c_int {
    // SAFETY: NCCL passes a v9/v10 properties struct.
    boundary("getProperties", || unsafe {
        super::properties(dev, p, props::v9)
    })
}

unsafe extern "C" fn isend(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    // SAFETY: NCCL's arguments, without a profiler handle.
    boundary("isend", || unsafe {
        super::isend(
            comm,
            data,
            size,
            tag,
            mhandle,
            std::ptr::null_mut(),
            request,
        )
    })
}

unsafe extern "C" fn irecv(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("irecv", || {
        let (sizes, none) = (Lengths::Size(sizes), std::ptr::null_mut());
        // SAFETY: NCCL's arguments, without profiler handles.
        unsafe { super::irecv(comm, n, data, sizes, tags, mhandles, none, request) }
    })
}

/// The table NCCL 2.24–2.25 load.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v9: NetV9 = NetV9 {
    name: super::NAME.as_ptr(),
    init: v6::init,
    devices: super::devices,
    get_properties,
    listen: super::listen,
    connect: super::connect,
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
