//! `ncclNetPlugin_v12` (NCCL 2.30 and later): v11 with properties that carry rail and
//! plane ids (unknown here: -1) and up to 8 devices per virtual NIC.

use super::{boundary, props, v10, v11};
use crate::nccl::{NetV12, PropertiesV12};
use std::ffi::c_int;

unsafe extern "C" fn get_properties(dev: c_int, p: *mut PropertiesV12) -> c_int {
    // SAFETY: NCCL passes a v12 properties struct.
    boundary("getProperties", || unsafe {
        super::properties(dev, p, props::v12)
    })
}

/// The table NCCL 2.30+ load first.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v12: NetV12 = NetV12 {
    name: super::NAME.as_ptr(),
    init: v11::init,
    devices: super::devices,
    get_properties,
    listen: v11::listen,
    connect: v11::connect,
    accept: super::accept,
    reg_mr: super::reg_mr,
    reg_mr_dma_buf: Some(super::reg_mr_dma_buf),
    dereg_mr: super::dereg_mr,
    isend: v10::isend,
    irecv: v10::irecv,
    iflush: super::iflush,
    test: super::test,
    close_send: super::close_send,
    close_recv: super::close_recv,
    close_listen: super::close_listen,
    get_device_mr: Some(super::get_device_mr),
    irecv_consumed: Some(super::irecv_consumed),
    make_v_device: None,
    finalize: super::finalize,
    set_net_attr: Some(super::set_net_attr),
};
