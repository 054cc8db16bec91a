//! `ncclNetPlugin_v8` (NCCL 2.20–2.23): v7 with a `size_t` size in `regMr`.

use super::{boundary, props, v6};
use crate::nccl::{NetV8, PropertiesV8};
use std::ffi::c_int;

unsafe extern "C" fn get_properties(dev: c_int, p: *mut PropertiesV8) -> c_int {
    // SAFETY: NCCL passes a v8 properties struct.
    boundary("getProperties", || unsafe {
        super::properties(dev, p, props::v8)
    })
}

/// The table NCCL 2.20–2.23 load.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v8: NetV8 = NetV8 {
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
    isend: v6::isend,
    irecv: v6::irecv,
    iflush: super::iflush,
    test: super::test,
    close_send: super::close_send,
    close_recv: super::close_recv,
    close_listen: super::close_listen,
    get_device_mr: Some(super::get_device_mr),
    irecv_consumed: Some(super::irecv_consumed),
};
