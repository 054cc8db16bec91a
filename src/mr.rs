//! Memory registration, honouring the mr_mode the provider answered.
//!
//! - `FI_MR_PROV_KEY` absent: every registration asks for a unique key (tcp, rxm and shm fail
//!   a repeated one with -FI_ENOKEY), so registering the same range again just works.
//! - `FI_MR_ENDPOINT`: the registration is bound to the comm's endpoint and enabled.
//! - A comm whose pieces spread over several flows (lanes) has the buffer registered in each
//!   lane's domain.
//! - Host buffers use iface `FI_HMEM_SYSTEM`; CUDA buffers (only when GPU buffers were
//!   allowed at init) use `FI_HMEM_CUDA` with the buffer's device.

use crate::comm::{Comm, Descs, Keep, Registered, NO_DESCS};
use crate::error::{check, Error, Result};
use crate::fabric::{close_fid, unique_key};
use crate::lane::Lane;
use crate::sys;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::ptr;
use std::sync::{Arc, OnceLock};

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    Host,
    Cuda { device: i32 },
}

/// NCCL's mhandle: the buffer registered in the domain of each of its comm's flows. It uses
/// those lanes until it is dropped (deregMr); the registrations themselves close when the
/// last of it and of the comms that keep them (see `comm::Registered`) goes.
pub struct MemoryRegion {
    regs: Arc<Vec<Registration>>,
    pub memory: Memory,
}

/// Most registrations beginning inside one registration (see `comm::Registered`): NCCL
/// sends from its buffers' slots, and pieces at fixed offsets within them, so a few dozen
/// are made.
const MAX_STARTS: usize = 1024;

/// The buffer in one lane's domain.
struct Registration {
    mr: *mut sys::fid_mr,
    desc: *mut c_void,
    /// The range registered.
    base: usize,
    len: usize,
    memory: Memory,
    /// Registrations beginning inside it, to its end, by where they begin, made when a send
    /// first begins there.
    starts: Mutex<Vec<(usize, *mut sys::fid_mr, *mut c_void)>>,
    /// Keeps the lane and its domain open while the registration exists (its use of the
    /// lane is the region's).
    lane: Arc<Lane>,
}

impl crate::opaque::Kind for MemoryRegion {
    const MAGIC: u64 = 0x4e46_4142_4d52_4547; // "NFABMREG"
    const NAME: &'static str = "mhandle";
}

// SAFETY: the registrations are immutable after creation; libfabric objects are thread-safe
// (FI_THREAD_SAFE) and closed once, from Drop.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

// SAFETY: as for MemoryRegion.
unsafe impl Send for Registration {}
// SAFETY: as above.
unsafe impl Sync for Registration {}

impl MemoryRegion {
    /// # Safety
    /// `data` must stay allocated for `size` bytes until the region is dropped, and while a
    /// comm keeps it where its domains claim `FI_MR_LOCAL` (those pin nothing, see
    /// `quirks::claim_local_mr`).
    pub unsafe fn register(
        comm: &Comm,
        data: *mut c_void,
        size: usize,
        memory: Memory,
    ) -> Result<Self> {
        let mut regs = Vec::with_capacity(comm.flows());
        for lane in comm.lanes() {
            // SAFETY: per the caller. A failure drops what was registered so far.
            regs.push(unsafe { Registration::new(lane, data, size, memory)? });
        }
        for r in &regs {
            r.lane.add_user();
        }
        Ok(MemoryRegion {
            regs: Arc::new(regs),
            memory,
        })
    }

    /// Whether this registration belongs to `comm`'s domains: endpoints each have their own,
    /// so a registration made on one comm is no descriptor for another.
    pub fn fits(&self, comm: &Comm) -> bool {
        self.regs.len() == comm.flows()
            && self
                .regs
                .iter()
                .zip(comm.lanes())
                .all(|(r, l)| Arc::ptr_eq(&r.lane.endpoint.domain, &l.endpoint.domain))
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        for r in self.regs.iter() {
            r.lane.release_user();
        }
    }
}

impl Registered for MemoryRegion {
    fn descs(&self) -> Descs {
        let mut descs = NO_DESCS;
        for (d, r) in descs.iter_mut().zip(self.regs.iter()) {
            *d = r.desc;
        }
        descs
    }

    fn desc_at(&self, flow: usize, addr: *mut c_void) -> Result<*mut c_void> {
        let reg = self.regs.get(flow).ok_or_else(|| {
            Error::Internal(format!(
                "a registration of {} flows asked for flow {flow}",
                self.regs.len()
            ))
        })?;
        reg.desc_at(addr as usize)
    }

    fn keep(&self) -> Keep {
        self.regs.clone()
    }
}

impl Registration {
    /// # Safety
    /// As [`MemoryRegion::register`].
    unsafe fn new(
        lane: &Arc<Lane>,
        data: *mut c_void,
        size: usize,
        memory: Memory,
    ) -> Result<Self> {
        // SAFETY: per the caller.
        let (mr, desc) = unsafe { register_range(lane, data, size, memory)? };
        Ok(Registration {
            mr,
            desc,
            base: data as usize,
            len: size,
            memory,
            starts: Mutex::new(Vec::new()),
            lane: lane.clone(),
        })
    }

    /// The descriptor of a registration beginning at `addr` and reaching to this one's end.
    fn desc_at(&self, addr: usize) -> Result<*mut c_void> {
        if addr == self.base {
            return Ok(self.desc);
        }
        if !(self.base..self.base + self.len).contains(&addr) {
            return Err(Error::InvalidArgument(format!(
                "a send at {addr:#x}, outside its registration ({:#x}, {} bytes)",
                self.base, self.len
            )));
        }
        let mut starts = self.starts.lock();
        if let Some(&(_, _, desc)) = starts.iter().find(|(a, _, _)| *a == addr) {
            return Ok(desc);
        }
        if starts.len() >= MAX_STARTS {
            return Err(Error::InvalidArgument(format!(
                "sends begin at more than {MAX_STARTS} places of one registration: register \
                 each buffer with regMr where its sends begin"
            )));
        }
        // SAFETY: the range lies inside this registration's, whose buffer the caller of
        // `register` keeps allocated while it exists; it is closed with it.
        let (mr, desc) = unsafe {
            register_range(
                &self.lane,
                addr as *mut c_void,
                self.base + self.len - addr,
                self.memory,
            )?
        };
        starts.push((addr, mr, desc));
        Ok(desc)
    }
}

/// Registers `size` bytes at `data` in the lane's domain (bound to its endpoint where the
/// provider asks): the registration and its descriptor.
///
/// # Safety
/// As [`MemoryRegion::register`].
unsafe fn register_range(
    lane: &Arc<Lane>,
    data: *mut c_void,
    size: usize,
    memory: Memory,
) -> Result<(*mut sys::fid_mr, *mut c_void)> {
    let endpoint = &lane.endpoint;
    let mr_mode = endpoint.domain.info.info().mr_mode();
    let key = if mr_mode & sys::FI_MR_PROV_KEY as i32 != 0 {
        0
    } else {
        unique_key()
    };
    let (iface, device) = match memory {
        Memory::Host => (sys::FI_HMEM_SYSTEM, 0),
        Memory::Cuda { device } => (sys::FI_HMEM_CUDA, device),
    };
    let mut mr = ptr::null_mut();
    // SAFETY: the domain is open; the caller keeps the buffer allocated until drop.
    let ret = unsafe {
        sys::nccl_net_fabric_mr_reg(
            endpoint.domain.raw(),
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
    if mr_mode & sys::FI_MR_ENDPOINT as i32 != 0 {
        let bound = (|| {
            // SAFETY: mr and the endpoint are open (the comm holds its lane).
            check("fi_mr_bind", unsafe {
                sys::fi_mr_bind(mr, endpoint.fid(), 0)
            })?;
            // SAFETY: mr is open and bound.
            check("fi_mr_enable", unsafe { sys::fi_mr_enable(mr) })
        })();
        if let Err(e) = bound {
            close_fid("memory registration", mr.cast());
            return Err(e);
        }
    }
    // SAFETY: mr is open; the descriptor stays valid until it is closed.
    Ok((mr, unsafe { sys::fi_mr_desc(mr) }))
}

impl Drop for Registration {
    fn drop(&mut self) {
        for (_, mr, _) in self.starts.get_mut().drain(..) {
            close_fid("memory registration", mr.cast());
        }
        close_fid("memory registration", self.mr.cast());
    }
}

/// The CUDA driver's `cuPointerGetAttribute`, once found. The CUDA runtime loads
/// `libcuda.so.1` privately (not into the global namespace), so the driver is looked up by
/// name among the loaded objects (`RTLD_NOLOAD`: never loaded here); kept once found, looked
/// for again while it is not.
fn pointer_get_attribute() -> Option<usize> {
    static FOUND: OnceLock<usize> = OnceLock::new();
    if let Some(&f) = FOUND.get() {
        return Some(f);
    }
    // SAFETY: RTLD_NOLOAD only returns a handle to an object already loaded (its reference
    // is kept: the driver stays loaded for the process's life); dlsym on it or on
    // RTLD_DEFAULT only looks a symbol up.
    let sym = unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        let scope = if handle.is_null() {
            libc::RTLD_DEFAULT
        } else {
            handle
        };
        libc::dlsym(scope, c"cuPointerGetAttribute".as_ptr())
    };
    (!sym.is_null()).then(|| *FOUND.get_or_init(|| sym as usize))
}

/// The CUDA device a GPU buffer lives on, asked of the CUDA driver NCCL already loaded
/// (`cuPointerGetAttribute`, a query that neither allocates nor synchronises), once per
/// registration (`regMr`), never on the data path. 0 when the driver is not loaded.
pub fn cuda_device_of(address: usize) -> i32 {
    const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: i32 = 9;
    type GetAttr = unsafe extern "C" fn(*mut c_void, i32, usize) -> i32;
    let Some(sym) = pointer_get_attribute() else {
        tracing::warn!(
            "CUDA buffer registered but the CUDA driver is not loaded: assuming device 0"
        );
        return 0;
    };
    // SAFETY: the symbol is the CUDA driver's cuPointerGetAttribute, whose signature is
    // CUresult (void* data, CUpointer_attribute attribute, CUdeviceptr ptr).
    let get: GetAttr = unsafe { std::mem::transmute::<usize, GetAttr>(sym) };
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
