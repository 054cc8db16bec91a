//! GPU buffers through the plugin, where a GPU and GPU buffers exist: memory from the CUDA
//! driver (`cuMemAlloc`), registered as NCCL does (`NCCL_PTR_CUDA`), sent from one GPU
//! buffer and received into another, checked after copying back. This tool may call CUDA;
//! the plugin never does.

use super::checks::{call, close_all, fill, intact, pairs, Ctx, Outcome};
use super::{Row, Verdict};
use nccl_net_fabric::nccl::{PTR_CUDA, PTR_DMABUF};
use nccl_net_host::PluginLib;
use std::ffi::{c_void, CStr};
use std::time::Instant;

const SIZE: usize = 1 << 20;

type Init = unsafe extern "C" fn(u32) -> i32;
type DeviceGet = unsafe extern "C" fn(*mut i32, i32) -> i32;
type CtxRetain = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
type CtxSet = unsafe extern "C" fn(*mut c_void) -> i32;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> i32;
type HtoD = unsafe extern "C" fn(u64, *const c_void, usize) -> i32;
type DtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> i32;
type Free = unsafe extern "C" fn(u64) -> i32;

/// The CUDA driver's entry points this check needs.
struct Driver {
    alloc: Alloc,
    htod: HtoD,
    dtoh: DtoH,
    free: Free,
}

fn sym<T>(lib: *mut c_void, name: &CStr) -> Result<T, String> {
    // SAFETY: dlsym only looks the name up in the CUDA driver loaded below.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("the CUDA driver has no {}", name.to_string_lossy()));
    }
    // SAFETY: T is the documented signature of that driver entry point (a function pointer
    // of the same size as the symbol's address).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

/// Loads the CUDA driver, makes device 0's primary context current on this thread.
fn driver() -> Result<Driver, String> {
    // SAFETY: dlopen of the system's CUDA driver library; it stays loaded.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        return Err("no CUDA driver (libcuda.so.1) on this machine".into());
    }
    let init: Init = sym(lib, c"cuInit")?;
    let get: DeviceGet = sym(lib, c"cuDeviceGet")?;
    let retain: CtxRetain = sym(lib, c"cuDevicePrimaryCtxRetain")?;
    let set: CtxSet = sym(lib, c"cuCtxSetCurrent")?;
    let (mut dev, mut ctx) = (0i32, std::ptr::null_mut());
    // SAFETY: the driver's documented calls with valid out-parameters.
    unsafe {
        let r = init(0);
        if r != 0 {
            return Err(format!("cuInit failed ({r}): no usable GPU"));
        }
        if get(&mut dev, 0) != 0 || retain(&mut ctx, dev) != 0 || set(ctx) != 0 {
            return Err("GPU 0's context could not be made current".into());
        }
    }
    Ok(Driver {
        alloc: sym(lib, c"cuMemAlloc_v2")?,
        htod: sym(lib, c"cuMemcpyHtoD_v2")?,
        dtoh: sym(lib, c"cuMemcpyDtoH_v2")?,
        free: sym(lib, c"cuMemFree_v2")?,
    })
}

/// Whether the GPU check can run: the plugin offers GPU buffers and a GPU is there.
pub fn available(lib: &PluginLib) -> Result<(), String> {
    let p = lib.properties(0).map_err(call)?;
    if p.ptr_support & PTR_CUDA == 0 {
        return Err(format!(
            "the plugin offers no GPU buffers on dev 0 (ptrSupport {:#x}; see the setopt row)",
            p.ptr_support
        ));
    }
    driver().map(|_| ())
}

pub fn not_offered(why: &str) -> Row {
    Row::new(
        "GPU buffers (NCCL_PTR_CUDA)",
        Verdict::NotOffered,
        false,
        "regMr of cuMemAlloc memory with NCCL_PTR_CUDA (FI_HMEM_CUDA), a 1 MiB transfer GPU to GPU",
        why.to_string(),
        "NCCL stages GPU data through host buffers",
    )
}

pub fn dmabuf_row(lib: &PluginLib) -> Row {
    let offered = lib
        .properties(0)
        .map(|p| p.ptr_support & PTR_DMABUF != 0)
        .unwrap_or(false);
    Row::new(
        "DMA-BUF registration (NCCL_PTR_DMABUF)",
        if offered {
            Verdict::Info
        } else {
            Verdict::NotOffered
        },
        false,
        "ptrSupport of dev 0",
        if offered {
            "offered".into()
        } else {
            "the plugin does not offer DMA-BUF registrations (regMrDmaBuf)".into()
        },
        "NCCL then registers GPU buffers by address (NCCL_PTR_CUDA) where GPU buffers are offered",
    )
}

/// Both sides: a GPU buffer each; the initiator sends, the responder receives and checks.
pub fn transfer(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    let cu = driver()?;
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let lib = &ctx.lib;
    let comm = if ctx.initiator { s[0] } else { r[0] };
    let mut dptr = 0u64;
    // SAFETY: driver calls with a valid out-parameter and sizes of the allocation.
    let r0 = unsafe { (cu.alloc)(&mut dptr, SIZE) };
    if r0 != 0 {
        return Err(format!("cuMemAlloc failed ({r0})"));
    }
    let mut host = vec![0u8; SIZE];
    let result = (|| {
        if ctx.initiator {
            fill(&mut host, SIZE, 1);
            // SAFETY: dptr holds SIZE bytes; host is SIZE bytes.
            let r = unsafe { (cu.htod)(dptr, host.as_ptr().cast(), SIZE) };
            if r != 0 {
                return Err(format!("cuMemcpyHtoD failed ({r})"));
            }
        }
        let t = Instant::now();
        // SAFETY: the GPU buffer stays allocated until after dereg below.
        let mh = unsafe { lib.reg_mr(comm, dptr as *mut c_void, SIZE, PTR_CUDA) }.map_err(call)?;
        let reg_ms = t.elapsed().as_secs_f64() * 1e3;
        // SAFETY: as above; the request is waited for before the buffer is freed.
        let q = unsafe {
            match ctx.initiator {
                true => lib.isend_until(comm, dptr as *mut c_void, SIZE as i32, mh, deadline),
                false => lib.irecv_until(comm, dptr as *mut c_void, SIZE as i32, mh, deadline),
            }
        }
        .map_err(call)?;
        let n = lib.wait(q, deadline).map_err(call)?;
        lib.dereg_mr(comm, mh).map_err(call)?;
        if ctx.initiator {
            return Ok(format!(
                "registered in {reg_ms:.2} ms, 1 MiB sent from GPU memory"
            ));
        }
        // SAFETY: as for HtoD.
        let r = unsafe { (cu.dtoh)(host.as_mut_ptr().cast(), dptr, SIZE) };
        if r != 0 {
            return Err(format!("cuMemcpyDtoH failed ({r})"));
        }
        match n as usize == SIZE && intact(&host, SIZE, 1) {
            true => Ok(format!(
                "registered in {reg_ms:.2} ms, 1 MiB received into GPU memory, intact"
            )),
            false => Err(format!(
                "{n} bytes arrived in GPU memory, not what was sent"
            )),
        }
    })();
    // SAFETY: the buffer was allocated above and no request uses it any more.
    unsafe { (cu.free)(dptr) };
    close_all(&ctx.lib, &s, &r)?;
    result
}

pub fn judge(mine: Outcome, theirs: Outcome, warns: &[String]) -> Vec<Row> {
    let tried = "regMr of cuMemAlloc memory with NCCL_PTR_CUDA (FI_HMEM_CUDA with the buffer's device), 1 MiB from one GPU buffer into another, checked";
    let meaning =
        "NCCL can hand this provider GPU buffers (GPUDirect: no copy through host memory)";
    let (verdict, observed) = match (mine, theirs) {
        (Ok(a), Ok(b)) => (Verdict::Pass, format!("{a}; the other side: {b}")),
        (Err(e), _) => (Verdict::Fail, format!("this side: {e}")),
        (_, Err(e)) => (Verdict::Fail, format!("the other side: {e}")),
    };
    let observed = match warns.first() {
        Some(w) => format!("{observed}; WARN: {w}"),
        None => observed,
    };
    vec![Row::new(
        "GPU buffers (NCCL_PTR_CUDA)",
        verdict,
        true,
        tried,
        observed,
        meaning,
    )]
}
