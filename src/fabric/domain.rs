//! An open fabric and its domains: the parents of endpoints and memory registrations, each
//! domain with the overflow area's registration where the plugin claimed `FI_MR_LOCAL`.

use super::{close_fid, unique_key, Info, OwnedInfo};
use crate::error::{check, Result};
use crate::sys;
use std::ffi::c_void;
use std::ptr;
use std::sync::{Arc, OnceLock};

/// An open fabric (`fi_fabric`).
pub struct Fabric {
    raw: *mut sys::fid_fabric,
}

// SAFETY: libfabric objects may be used from any thread; the plugin serialises use of each
// domain's objects where the provider's threading model requires it.
unsafe impl Send for Fabric {}
// SAFETY: as above.
unsafe impl Sync for Fabric {}

impl Fabric {
    pub fn open(info: Info<'_>) -> Result<Arc<Self>> {
        let mut raw = ptr::null_mut();
        // SAFETY: fabric_attr comes from fi_getinfo; raw receives a new fabric on success.
        let ret = unsafe { sys::fi_fabric(info.raw.fabric_attr, &mut raw, ptr::null_mut()) };
        check("fi_fabric", ret)?;
        Ok(Arc::new(Fabric { raw }))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        close_fid("fabric", self.raw.cast());
    }
}

/// An open domain (`fi_domain`), the parent of endpoints and memory registrations.
pub struct Domain {
    raw: *mut sys::fid_domain,
    pub info: OwnedInfo,
    /// Taken around each driver's turn on providers whose endpoints of one device must not
    /// make progress at the same time (`quirks::serial_progress`); siblings share it.
    pub turns: Arc<parking_lot::Mutex<()>>,
    /// Whether the plugin claimed `FI_MR_LOCAL` where the provider did not ask for it (see
    /// [`Domain::open_claiming_local_mr`]); siblings do too.
    claimed_local_mr: bool,
    /// The overflow area registered in this domain, once a receive needed its descriptor:
    /// the registration and its descriptor (`None`: registering failed).
    overflow: OnceLock<Option<(Registration, usize)>>,
    _fabric: Arc<Fabric>,
}

/// A registration the domain itself holds (closed before the domain).
struct Registration(*mut sys::fid_mr);

impl Drop for Registration {
    fn drop(&mut self) {
        close_fid("memory registration", self.0.cast());
    }
}

// SAFETY: see Fabric.
unsafe impl Send for Domain {}
// SAFETY: see Fabric.
unsafe impl Sync for Domain {}

impl Domain {
    pub fn open(fabric: &Arc<Fabric>, info: Info<'_>) -> Result<Arc<Self>> {
        Self::open_sharing(fabric, info, Arc::default(), false)
    }

    /// A domain whose buffers all come with descriptors although the provider did not ask
    /// for them (`FI_MR_LOCAL` claimed, see `quirks::claim_local_mr`). Receives then
    /// register the overflow area too, once per domain: only for providers whose
    /// registrations pin nothing.
    pub fn open_claiming_local_mr(fabric: &Arc<Fabric>, info: Info<'_>) -> Result<Arc<Self>> {
        let claimed = info.with_local_mr(true)?;
        Self::open_sharing(fabric, claimed.info(), Arc::default(), true)
    }

    /// This domain, or where it claimed `FI_MR_LOCAL`, another of the same fabric and info
    /// that does not: for endpoints whose buffers are not registered (control endpoints).
    pub fn unclaimed(self: &Arc<Self>) -> Result<Arc<Self>> {
        if !self.claimed_local_mr {
            return Ok(self.clone());
        }
        let info = self.info.info().with_local_mr(false)?;
        Self::open_sharing(&self._fabric, info.info(), self.turns.clone(), false)
    }

    fn open_sharing(
        fabric: &Arc<Fabric>,
        info: Info<'_>,
        turns: Arc<parking_lot::Mutex<()>>,
        claimed_local_mr: bool,
    ) -> Result<Arc<Self>> {
        let info = info.to_owned()?;
        let mut raw = ptr::null_mut();
        // SAFETY: fabric is open; the info entry is valid; raw receives a new domain.
        let ret = unsafe {
            sys::fi_domain(
                fabric.raw,
                info.info().raw().cast_mut(),
                &mut raw,
                ptr::null_mut(),
            )
        };
        check("fi_domain", ret)?;
        Ok(Arc::new(Domain {
            raw,
            info,
            turns,
            claimed_local_mr,
            overflow: OnceLock::new(),
            _fabric: fabric.clone(),
        }))
    }
    /// Another domain from the same info: its own progress engine (a tcp domain drives all
    /// its endpoints' sockets under one lock) and its own registrations. It shares this
    /// domain's fabric, or with `own_fabric` opens a fabric of its own from the same info.
    pub fn sibling(&self, own_fabric: bool) -> Result<Arc<Self>> {
        let fabric = match own_fabric {
            true => Fabric::open(self.info.info())?,
            false => self._fabric.clone(),
        };
        Self::open_sharing(
            &fabric,
            self.info.info(),
            self.turns.clone(),
            self.claimed_local_mr,
        )
    }
    /// Whether the plugin claimed `FI_MR_LOCAL` on it: every buffer needs a descriptor.
    pub fn claimed_local_mr(&self) -> bool {
        self.claimed_local_mr
    }
    /// The descriptor that goes with the overflow area in this domain's receives: null
    /// where the provider needs none, the area's registration where the plugin claimed
    /// `FI_MR_LOCAL`; `None` where there is no area or the provider itself needs
    /// descriptors (registering 2 GiB there could pin it).
    pub fn overflow_desc(&self) -> Option<*mut c_void> {
        let (area, len) = crate::overflow::whole()?;
        if self.info.info().mr_mode() & sys::FI_MR_LOCAL as i32 == 0 {
            return Some(ptr::null_mut());
        }
        if !self.claimed_local_mr {
            return None;
        }
        let registered = self.overflow.get_or_init(|| {
            let mut mr = ptr::null_mut();
            // SAFETY: the domain is open; the area is mapped for the process's life; mr
            // receives a new registration, closed (Registration's drop) before the domain.
            let ret = unsafe {
                sys::nccl_net_fabric_mr_reg(
                    self.raw,
                    area.cast(),
                    len,
                    (sys::FI_SEND | sys::FI_RECV) as u64,
                    unique_key(),
                    sys::FI_HMEM_SYSTEM as i32,
                    0,
                    &mut mr,
                )
            };
            match check("fi_mr_regattr", ret) {
                Ok(_) => {
                    let reg = Registration(mr);
                    // SAFETY: mr is open; the descriptor stays valid until it is closed.
                    let desc = unsafe { sys::fi_mr_desc(mr) };
                    Some((reg, desc as usize))
                }
                Err(e) => {
                    tracing::warn!(
                        "could not register the overflow area ({e}): a message larger than \
                         its receive is left to the provider"
                    );
                    None
                }
            }
        });
        registered.as_ref().map(|(_, desc)| *desc as *mut c_void)
    }
    pub fn raw(&self) -> *mut sys::fid_domain {
        self.raw
    }
    /// The fabric the domain belongs to (for `fi_trywait`).
    pub fn fabric_raw(&self) -> *mut sys::fid_fabric {
        self._fabric.raw
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        drop(self.overflow.take());
        close_fid("domain", self.raw.cast());
    }
}
