//! `init` and `finalize` (from v11 a context per communicator), `setNetAttr`, `devices` and
//! `getProperties`.

use super::boundary::{boundary, out};
use super::profiler;
use crate::device::Properties;
use crate::error::Result;
use crate::nccl::{Logger, ProfilerFn};
use crate::opaque;
use crate::plugin;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `init` of every version: NCCL's logger, and its profiler callback (v10+; NULL: none).
pub(crate) fn init(logger: Logger, profiler: ProfilerFn) -> Result<()> {
    crate::log::init_nccl(logger);
    profiler::set(profiler);
    plugin::init().map(|_| ())
}

/// What `init` hands NCCL as the communicator's context (v11+).
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

/// `init` of v11+: per communicator, with a context.
///
/// # Safety
/// `ctx` is NULL or NCCL's out-pointer for the context.
pub(crate) unsafe fn init_context(
    ctx: *mut *mut c_void,
    comm_id: u64,
    logger: Logger,
    profiler: ProfilerFn,
) -> Result<()> {
    // SAFETY: per the caller.
    let slot = unsafe { out(ctx, "ctx")? };
    *slot = std::ptr::null_mut();
    init(logger, profiler)?;
    tracing::debug!("init for communicator {comm_id:#x}");
    *slot = opaque::into_raw(Context { comm_id });
    CONTEXTS.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// `finalize` (v11+).
pub(crate) unsafe extern "C" fn finalize(ctx: *mut c_void) -> c_int {
    boundary("finalize", || {
        // A failed init left no context: nothing to release.
        if ctx.is_null() {
            return Ok(());
        }
        // SAFETY: NCCL passes back the context init gave it, once.
        let c = unsafe { opaque::take::<Context>(ctx)? };
        tracing::debug!("finalize for communicator {:#x}", c.comm_id);
        // Devices and endpoints stay for other and later communicators; what closed comms
        // left behind goes with the last context.
        if CONTEXTS.fetch_sub(1, Ordering::AcqRel) == 1 {
            plugin::release_leftovers();
        }
        Ok(())
    })
}

/// `setNetAttr` (v11+): traffic hints (peers, flows per peer) do not change how this plugin
/// posts.
pub(crate) unsafe extern "C" fn set_net_attr(_ctx: *mut c_void, _attr: *mut c_void) -> c_int {
    boundary("setNetAttr", || Ok(()))
}

/// `getProperties` of every version, in the layout `convert` makes.
///
/// # Safety
/// `props` is NULL or NCCL's pointer to a properties struct of type `T`.
pub(crate) unsafe fn properties<T>(
    dev: c_int,
    props: *mut T,
    convert: fn(&Properties, c_int) -> T,
) -> Result<()> {
    let plugin = plugin::get()?;
    let device = plugin.device(dev)?;
    // SAFETY: per the caller.
    *unsafe { out(props, "props") }? = convert(&device.props, dev);
    Ok(())
}

pub(crate) unsafe extern "C" fn devices(ndev: *mut c_int) -> c_int {
    boundary("devices", || {
        let n = plugin::get()?.devices.len();
        // SAFETY: NCCL passes a pointer to an int.
        *unsafe { out(ndev, "ndev") }? = c_int::try_from(n).unwrap_or(c_int::MAX);
        Ok(())
    })
}
