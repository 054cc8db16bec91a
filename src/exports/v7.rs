//! `ncclNetPlugin_v7` (NCCL 2.19): v6 plus device handles, `getDeviceMr`, `irecvConsumed`.

use super::{boundary, props, v6};
use crate::nccl::{NetV7, PropertiesV7};
use std::ffi::c_int;

unsafe extern "C" fn get_properties(dev: c_int, p: *mut PropertiesV7) -> c_int {
    // SAFETY: NCCL passes a v7 properties struct.
    boundary("getProperties", || unsafe {
        super::properties(dev, p, props::v7)
    })
}

/// The table NCCL 2.19 loads.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v7: NetV7 = NetV7 {
    name: super::NAME.as_ptr(),
    init: v6::init,
    devices: super::devices,
    get_properties,
    listen: super::listen,
    connect: super::connect,
    accept: super::accept,
    reg_mr: v6::reg_mr,
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
