//! Memory registration, honouring the mr_mode the provider answered.
//!
//! - `FI_MR_PROV_KEY` absent: every registration asks for a unique key (tcp, rxm and shm fail
//!   a repeated one with -FI_ENOKEY), so registering the same range again just works.
//! - `FI_MR_ENDPOINT`: the registration is bound to the comm's endpoint and enabled.
//! - Host buffers use iface `FI_HMEM_SYSTEM`; CUDA buffers (only when GPU buffers were
//!   allowed at init) use `FI_HMEM_CUDA` with the buffer's device.

use crate::comm::{Comm, SharedEndpoint};
use crate::error::{check, Error, Result};
use crate::fabric::close_fid;
use crate::sys;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const MR_MAGIC: u64 = 0x4e46_4142_4d52_4547; // "NFABMREG"

/// Keys requested when the provider does not pick them (process-wide, never repeated).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    Host,
    Cuda { device: i32 },
}

/// NCCL's mhandle.
pub struct MemoryRegion {
    magic: u64,
    mr: *mut sys::fid_mr,
    desc: *mut c_void,
    /// Keeps the endpoint (and its domain) open while the registration exists.
    _ep: Arc<SharedEndpoint>,
}

// SAFETY: the registration is immutable after creation; libfabric objects are thread-safe
// (FI_THREAD_SAFE) and closed once, from Drop.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// # Safety
    /// `data` must stay allocated for `size` bytes until the region is dropped.
    pub unsafe fn register(
        comm: &Comm,
        data: *mut c_void,
        size: usize,
        memory: Memory,
    ) -> Result<Box<Self>> {
        let ep = &comm.ep;
        let mr_mode = ep.ep.domain.info.info().mr_mode();
        let key = if mr_mode & sys::FI_MR_PROV_KEY as i32 != 0 {
            0
        } else {
            NEXT_KEY.fetch_add(1, Ordering::Relaxed)
        };
        let (iface, device) = match memory {
            Memory::Host => (sys::FI_HMEM_SYSTEM, 0),
            Memory::Cuda { device } => (sys::FI_HMEM_CUDA, device),
        };
        let mut mr = ptr::null_mut();
        // SAFETY: the domain is open; the caller keeps the buffer allocated until drop.
        let ret = unsafe {
            sys::nccl_net_fabric_mr_reg(
                ep.ep.domain.raw(),
                data,
                size,
                (sys::FI_SEND | sys::FI_RECV) as u64,
                key,
                iface as i32,
                device,
                &mut mr,
            )
        };
        check("fi_mr_regattr", ret)?;
        let mut region = Box::new(MemoryRegion {
            magic: MR_MAGIC,
            mr,
            desc: ptr::null_mut(),
            _ep: ep.clone(),
        });
        if mr_mode & sys::FI_MR_ENDPOINT as i32 != 0 {
            // SAFETY: mr and the endpoint are open.
            check("fi_mr_bind", unsafe { sys::fi_mr_bind(mr, ep.ep.fid(), 0) })?;
            // SAFETY: mr is open and bound.
            check("fi_mr_enable", unsafe { sys::fi_mr_enable(mr) })?;
        }
        // SAFETY: mr is open; the descriptor stays valid until it is closed.
        region.desc = unsafe { sys::fi_mr_desc(mr) };
        Ok(region)
    }

    /// # Safety
    /// `p` must be NULL or point to readable memory of at least a `u64`.
    pub unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<Option<&'a MemoryRegion>> {
        // SAFETY: readable per the caller.
        let Some(r) = (unsafe { p.cast::<MemoryRegion>().as_ref() }) else {
            return Ok(None);
        };
        if r.magic != MR_MAGIC {
            return Err(Error::InvalidArgument(
                "mhandle is not a nccl-net-fabric memory registration".into(),
            ));
        }
        Ok(Some(r))
    }

    pub fn desc(&self) -> *mut c_void {
        self.desc
    }

    /// Whether this registration belongs to `comm`'s domain: endpoints each have their own,
    /// so a registration made on one comm is no descriptor for another.
    pub fn fits(&self, comm: &Comm) -> bool {
        Arc::ptr_eq(&self._ep.ep.domain, &comm.ep.ep.domain)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        close_fid("memory registration", self.mr.cast());
    }
}

/// The CUDA device a GPU buffer lives on, asked of the CUDA driver NCCL already loaded
/// (`cuPointerGetAttribute`, a query that neither allocates nor synchronises). 0 when the
/// driver is not loaded in this process.
pub fn cuda_device_of(address: usize) -> i32 {
    const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: i32 = 9;
    type GetAttr = unsafe extern "C" fn(*mut c_void, i32, usize) -> i32;
    // SAFETY: dlsym on RTLD_DEFAULT looks up a symbol among already loaded objects only.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"cuPointerGetAttribute".as_ptr()) };
    if sym.is_null() {
        tracing::warn!(
            "CUDA buffer registered but the CUDA driver is not loaded: assuming device 0"
        );
        return 0;
    }
    // SAFETY: the symbol is the CUDA driver's cuPointerGetAttribute, whose signature is
    // CUresult (void* data, CUpointer_attribute attribute, CUdeviceptr ptr).
    let get: GetAttr = unsafe { std::mem::transmute::<*mut c_void, GetAttr>(sym) };
    let mut device: i32 = 0;
    // SAFETY: device is a valid int out-parameter for DEVICE_ORDINAL.
    let r = unsafe {
        get(
            (&raw mut device).cast(),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            address,
        )
    };
    if r != 0 {
        tracing::warn!("cuPointerGetAttribute failed ({r}) for a CUDA buffer: assuming device 0");
        return 0;
    }
    device
}
