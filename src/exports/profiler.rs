//! Profiler events (v10+): the callback NCCL passes at init, an event started per buffer of
//! a request just posted and stopped when `test` finds the request done.

use crate::comm::{Buffer, Request};
use crate::nccl::{self, ProfilerFn};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The profiler callback NCCL passed at init (v10+), or NULL.
static PROFILER: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Keeps the profiler callback NCCL passed at init (NULL: none).
pub(super) fn set(profiler: ProfilerFn) {
    PROFILER.store(
        profiler.map_or(std::ptr::null_mut(), |f| f as *mut c_void),
        Ordering::Release,
    );
}

fn profiler() -> ProfilerFn {
    let p = PROFILER.load(Ordering::Acquire);
    // SAFETY: PROFILER only ever holds NULL or a callback NCCL passed at init, of this type.
    (!p.is_null()).then(|| unsafe {
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> c_int,
        >(p)
    })
}

/// Starts a profiler event per buffer of a request just posted, with the handles NCCL gave.
///
/// # Safety
/// `request` is a request this plugin just returned; `phandles` NULL or one per buffer.
pub(super) unsafe fn profile_start(
    request: *mut c_void,
    phandles: &[*mut c_void],
    bufs: &[Buffer],
    kind: u8,
) {
    let Some(f) = profiler() else { return };
    // SAFETY: per the caller.
    let Ok(req) = (unsafe { Request::from_handle(request) }) else {
        return;
    };
    for (i, (event, b)) in req.events().zip(bufs).enumerate() {
        let phandle = phandles.get(i).copied().unwrap_or(std::ptr::null_mut());
        let mut descr = nccl::ProfilerDescrV1 {
            kind,
            part: i as i32,
            tag: b.tag,
            length: b.len,
        };
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL's callback; descr lives through the call, handle is ours to keep.
        unsafe {
            f(
                &mut handle,
                nccl::profiler::START,
                phandle,
                nccl::profiler::PLUGIN_ID,
                (&raw mut descr).cast(),
            )
        };
        event.store(handle, Ordering::Release);
    }
}

/// Stops the profiler events of a request that is done.
pub(super) fn profile_stop(req: &Request) {
    let Some(f) = profiler() else { return };
    for event in req.events() {
        let mut handle = event.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !handle.is_null() {
            // SAFETY: NCCL's callback with the handle its start gave.
            unsafe {
                f(
                    &mut handle,
                    nccl::profiler::STOP,
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                )
            };
        }
    }
}
