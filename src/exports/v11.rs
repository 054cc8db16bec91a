//! `ncclNetPlugin_v11` (NCCL 2.28–2.29): `init` per communicator with a context, which
//! `listen`/`connect` get back and `finalize` ends; `setNetAttr`. NCCL 2.28 calls `finalize`
//! after a failed init, so a v11 table must exist for a refused provider not to take the
//! process down (2.28's v8 adapter leaves `finalize` unset).

use super::{boundary, props, v10};
use crate::nccl::{DeviceHandleV8, Logger, NetV11, ProfilerFn, PropertiesV11};
use std::ffi::{c_int, c_void};

/// `init` of v11 and v12.
pub(crate) unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    _config: *mut c_void,
    logger: Logger,
    profiler: ProfilerFn,
) -> c_int {
    // SAFETY: NCCL passes an out-pointer for the context.
    boundary("init", || unsafe {
        super::init_context(ctx, comm_id, logger, profiler)
    })
}

/// `listen` of v11 and v12 (the context is not needed).
pub(crate) unsafe extern "C" fn listen(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    lc: *mut *mut c_void,
) -> c_int {
    // SAFETY: the v8 arguments.
    unsafe { super::listen(dev, handle, lc) }
}

/// `connect` of v11 and v12.
pub(crate) unsafe extern "C" fn connect(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    sc: *mut *mut c_void,
    dc: *mut *mut DeviceHandleV8,
) -> c_int {
    // SAFETY: the v8 arguments.
    unsafe { super::connect(dev, handle, sc, dc) }
}

unsafe extern "C" fn get_properties(dev: c_int, p: *mut PropertiesV11) -> c_int {
    // SAFETY: NCCL passes a v11 properties struct.
    boundary("getProperties", || unsafe {
        super::properties(dev, p, props::v11)
    })
}

/// The table NCCL 2.28–2.29 load first.
#[no_mangle]
#[used]
pub static ncclNetPlugin_v11: NetV11 = NetV11 {
    name: super::NAME.as_ptr(),
    init,
    devices: super::devices,
    get_properties,
    listen,
    connect,
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
