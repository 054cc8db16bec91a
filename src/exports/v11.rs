//! The `ncclNetPlugin_v11` table (NCCL 2.28 and later look it up first).
//!
//! Adapters of a few lines over the same bodies as v8: `init` runs per communicator and
//! hands back a context (the plugin's state is still decided once, at the first init);
//! sizes are `size_t`; properties carry the v9–v11 fields. NCCL 2.28 calls `finalize` on
//! the table after a failed init, so a v11 table must exist for a refused provider not to
//! take the process down (2.28's v8 adapter leaves `finalize` unset).

use super::{boundary, byte_count, init_body, one_buffer, out, post_one};
use crate::comm::Direction;
use crate::nccl::{DeviceHandleV8, Logger, NetV11, PropertiesV11};
use crate::plugin;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// What `init` hands NCCL as the communicator's context.
struct Context {
    comm_id: u64,
}

impl crate::opaque::Kind for Context {
    const MAGIC: u64 = 0x4e46_4142_4354_5831; // "NFABCTX1"
    const NAME: &'static str = "context";
}

/// Contexts NCCL holds: when the last one is finalized, what closed comms left behind is
/// released.
static CONTEXTS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    _config: *mut c_void,
    logger: Logger,
    _profiler: *mut c_void,
) -> c_int {
    boundary("init", || {
        // SAFETY: NCCL passes an out-pointer for the context.
        let slot = unsafe { out(ctx, "ctx")? };
        *slot = std::ptr::null_mut();
        init_body(logger)?;
        tracing::debug!("init for communicator {comm_id:#x}");
        *slot = crate::opaque::into_raw(Context { comm_id });
        CONTEXTS.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> c_int {
    boundary("finalize", || {
        // A failed init left no context: nothing to release.
        if ctx.is_null() {
            return Ok(());
        }
        // SAFETY: NCCL passes back the context init gave it, once.
        let c = unsafe { crate::opaque::take::<Context>(ctx)? };
        tracing::debug!("finalize for communicator {:#x}", c.comm_id);
        // Devices and endpoints stay for other and later communicators; what closed comms
        // left behind goes with the last context.
        if CONTEXTS.fetch_sub(1, Ordering::AcqRel) == 1 {
            plugin::release_leftovers();
        }
        Ok(())
    })
}

unsafe extern "C" fn get_properties(dev: c_int, props: *mut PropertiesV11) -> c_int {
    boundary("getProperties", || {
        let plugin = plugin::get()?;
        let device = plugin.device(dev)?;
        // SAFETY: NCCL passes a pointer to a properties struct of the v11 layout.
        *unsafe { out(props, "props") }? = device.props.to_v11(dev);
        Ok(())
    })
}

unsafe extern "C" fn listen(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    lc: *mut *mut c_void,
) -> c_int {
    // SAFETY: same arguments as v8 listen, without the context.
    unsafe { super::listen(dev, handle, lc) }
}

unsafe extern "C" fn connect(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut DeviceHandleV8,
) -> c_int {
    // SAFETY: same arguments as v8 connect, without the context.
    unsafe { super::connect(dev, handle, send_comm, send_dev_comm) }
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    _tag: c_int,
    mhandle: *mut c_void,
    _phandle: *mut c_void,
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

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    _tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
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

unsafe extern "C" fn set_net_attr(_ctx: *mut c_void, _attr: *mut c_void) -> c_int {
    // Traffic hints (peers, flows per peer) do not change how this plugin posts.
    boundary("setNetAttr", || Ok(()))
}

/// The table NCCL 2.28+ loads first (`NCCL_NET_PLUGIN` or `LD_PRELOAD`).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v11: NetV11 = NetV11 {
    name: c"Fabric".as_ptr(),
    init,
    devices: super::devices,
    get_properties,
    listen,
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
    finalize,
    set_net_attr: Some(set_net_attr),
};
