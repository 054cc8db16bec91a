//! What `fi_getinfo` is asked ([`Hints`]) and what it answers: the owned list, a borrowed
//! entry with its attributes read in Rust terms, and a single entry copied out of the list
//! (changed where the plugin needs another source address or `FI_MR_LOCAL`).

use super::socket_address;
use crate::error::{check, Error, Result};
use crate::sys;
use std::ffi::{c_char, CStr, CString};
use std::ptr;

fn owned_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric fills name fields with NUL-terminated strings it owns for the lifetime
    // of the fi_info; the text is copied at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn dup_cstring(s: &str) -> Result<*mut c_char> {
    let c = CString::new(s).map_err(|_| Error::InvalidUsage(format!("name {s:?} contains NUL")))?;
    // SAFETY: strdup copies a NUL-terminated string into malloc'ed memory, which fi_freeinfo frees.
    let p = unsafe { libc::strdup(c.as_ptr()) };
    if p.is_null() {
        return Err(Error::Internal("strdup failed: out of memory".into()));
    }
    Ok(p)
}

/// What to ask `fi_getinfo` for.
#[derive(Debug, Clone)]
pub struct Hints {
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: i32,
    pub ep_type: sys::fi_ep_type,
    pub threading: sys::fi_threading,
    pub provider: Option<String>,
}

/// An owned `fi_info` list (freed with `fi_freeinfo`).
pub struct InfoList {
    head: *mut sys::fi_info,
}

// SAFETY: the list is exclusively owned and only read after fi_getinfo returns it.
unsafe impl Send for InfoList {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for InfoList {}

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.head.is_null() {
            // SAFETY: head came from fi_getinfo/fi_dupinfo and is freed exactly once here.
            unsafe { sys::fi_freeinfo(self.head) };
        }
    }
}

impl InfoList {
    /// Calls `fi_getinfo(version, NULL, NULL, 0, hints)`. No match gives an empty list.
    pub fn get(version: u32, hints: &Hints) -> Result<Self> {
        // SAFETY: fi_allocinfo returns a zeroed fi_info with all attribute structs allocated
        // (or NULL). Every field written below is owned by that fi_info and released by
        // fi_freeinfo, including the strdup'ed provider name.
        unsafe {
            let h = sys::fi_allocinfo();
            if h.is_null() {
                return Err(Error::Internal("fi_allocinfo failed: out of memory".into()));
            }
            let hints_list = InfoList { head: h };
            (*h).caps = hints.caps;
            (*h).mode = hints.mode;
            (*(*h).ep_attr).type_ = hints.ep_type;
            (*(*h).domain_attr).mr_mode = hints.mr_mode;
            (*(*h).domain_attr).threading = hints.threading;
            (*(*h).domain_attr).resource_mgmt = sys::FI_RM_ENABLED;
            (*(*h).tx_attr).msg_order = sys::FI_ORDER_SAS as u64;
            (*(*h).rx_attr).msg_order = sys::FI_ORDER_SAS as u64;
            if let Some(p) = &hints.provider {
                (*(*h).fabric_attr).prov_name = dup_cstring(p)?;
            }
            let mut out: *mut sys::fi_info = ptr::null_mut();
            let ret = sys::fi_getinfo(version, ptr::null(), ptr::null(), 0, h, &mut out);
            drop(hints_list);
            if ret == -(sys::FI_ENODATA as i32) {
                return Ok(InfoList {
                    head: ptr::null_mut(),
                });
            }
            check("fi_getinfo", ret)?;
            Ok(InfoList { head: out })
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Info<'_>> {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur.is_null() {
                return None;
            }
            // SAFETY: cur is a node of the list this InfoList owns; the borrow ties it to self.
            let info = unsafe { &*cur };
            cur = info.next;
            Some(Info { raw: info })
        })
    }
}

/// A borrowed entry of an [`InfoList`].
#[derive(Clone, Copy)]
pub struct Info<'a> {
    pub(super) raw: &'a sys::fi_info,
}

impl<'a> Info<'a> {
    pub fn raw(&self) -> *const sys::fi_info {
        self.raw
    }
    fn fabric_attr(&self) -> &'a sys::fi_fabric_attr {
        // SAFETY: fi_getinfo results always carry fabric, domain and endpoint attributes.
        unsafe { &*self.raw.fabric_attr }
    }
    fn domain_attr(&self) -> &'a sys::fi_domain_attr {
        // SAFETY: see fabric_attr.
        unsafe { &*self.raw.domain_attr }
    }
    fn ep_attr(&self) -> &'a sys::fi_ep_attr {
        // SAFETY: see fabric_attr.
        unsafe { &*self.raw.ep_attr }
    }
    pub fn provider(&self) -> String {
        owned_str(self.fabric_attr().prov_name)
    }
    pub fn fabric(&self) -> String {
        owned_str(self.fabric_attr().name)
    }
    pub fn domain(&self) -> String {
        owned_str(self.domain_attr().name)
    }
    pub fn api_version(&self) -> u32 {
        self.fabric_attr().api_version
    }
    pub fn caps(&self) -> u64 {
        self.raw.caps
    }
    pub fn mode(&self) -> u64 {
        self.raw.mode
    }
    pub fn mr_mode(&self) -> i32 {
        self.domain_attr().mr_mode
    }
    /// The address vector type the provider asks for (`FI_AV_UNSPEC` when it has none).
    pub fn av_type(&self) -> sys::fi_av_type {
        self.domain_attr().av_type
    }
    pub fn mr_key_size(&self) -> usize {
        self.domain_attr().mr_key_size
    }
    pub fn addr_format(&self) -> u32 {
        self.raw.addr_format
    }
    pub fn mem_tag_format(&self) -> u64 {
        self.ep_attr().mem_tag_format
    }
    pub fn max_msg_size(&self) -> usize {
        self.ep_attr().max_msg_size
    }
    /// The largest message the provider sends without the caller's buffer
    /// (`tx_attr->inject_size`, 0 when unknown).
    pub fn inject_size(&self) -> usize {
        // SAFETY: tx_attr is NULL or valid for the info's life.
        unsafe { self.raw.tx_attr.as_ref() }.map_or(0, |a| a.inject_size)
    }
    /// `domain_attr->data_progress` and `control_progress`.
    pub fn progress(&self) -> (sys::fi_progress, sys::fi_progress) {
        let d = self.domain_attr();
        #[cfg(fi_progress_in_union)]
        // SAFETY: both members of the union are the same enum (`progress` is the new name).
        let data = unsafe { d.__bindgen_anon_1.data_progress };
        #[cfg(not(fi_progress_in_union))]
        let data = d.data_progress;
        (data, d.control_progress)
    }
    /// Whether peers on other hosts cannot reach this entry: its domain is a loopback
    /// interface, or its source address a loopback address.
    pub fn loopback(&self, sysfs: &crate::nic::Sysfs) -> bool {
        sysfs.is_loopback(&self.domain())
            || self
                .src_socket_address()
                .is_some_and(|a| a.ip().is_loopback())
    }
    /// `domain_attr->threading`.
    pub fn threading(&self) -> sys::fi_threading {
        self.domain_attr().threading
    }
    /// How many pieces one receive may have (`rx_attr->iov_limit`, 1 when unknown).
    pub fn rx_iov_limit(&self) -> usize {
        // SAFETY: rx_attr is NULL or valid for the info's life.
        unsafe { self.raw.rx_attr.as_ref() }.map_or(1, |a| a.iov_limit.max(1))
    }
    /// Link speed in bits per second, when the provider reports a NIC.
    pub fn link_speed_bps(&self) -> Option<u64> {
        // SAFETY: nic and its attribute pointers are either NULL or valid for the info's life.
        unsafe {
            let nic = self.raw.nic.as_ref()?;
            let link = nic.link_attr.as_ref()?;
            (link.speed > 0).then_some(link.speed as u64)
        }
    }
    /// The NIC's PCI address (`dddd:bb:dd.f`), when the provider reports one.
    pub fn pci_address(&self) -> Option<String> {
        // SAFETY: as in link_speed_bps; the union is read as PCI only when bus_type says so.
        unsafe {
            let nic = self.raw.nic.as_ref()?;
            let bus = nic.bus_attr.as_ref()?;
            if bus.bus_type != sys::FI_BUS_PCI {
                return None;
            }
            let pci = bus.attr.pci;
            Some(format!(
                "{:04x}:{:02x}:{:02x}.{:x}",
                pci.domain_id, pci.bus_id, pci.device_id, pci.function_id
            ))
        }
    }
    /// The source address, when it is an IP socket address (`FI_SOCKADDR_IN`/`_IN6`).
    pub fn src_socket_address(&self) -> Option<std::net::SocketAddr> {
        if self.raw.src_addr.is_null() {
            return None;
        }
        // SAFETY: src_addr points to src_addrlen bytes libfabric owns for the info's life.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.raw.src_addr.cast::<u8>(), self.raw.src_addrlen)
        };
        socket_address(bytes)
    }
    /// The source address, when it is a string (`FI_ADDR_STR`, as shm uses).
    pub fn src_addr_str(&self) -> Option<String> {
        if self.raw.addr_format != sys::FI_ADDR_STR || self.raw.src_addr.is_null() {
            return None;
        }
        Some(owned_str(self.raw.src_addr.cast()))
    }
    /// A copy of this entry with another string source address (`FI_ADDR_STR` providers).
    pub fn with_src_addr_str(&self, addr: &str) -> Result<OwnedInfo> {
        let owned = self.to_owned()?;
        let text = std::ffi::CString::new(addr)
            .map_err(|_| Error::Internal(format!("address {addr:?} holds a NUL")))?;
        // SAFETY: strdup returns a malloc'd copy (or NULL), which fi_freeinfo later frees.
        let copy = unsafe { libc::strdup(text.as_ptr()) };
        if copy.is_null() {
            return Err(Error::Internal("strdup failed: out of memory".into()));
        }
        let raw = owned.list.head;
        // SAFETY: raw is the single entry this OwnedInfo owns; its old src_addr came from
        // libfabric's allocator (malloc) and nothing else points to it.
        unsafe {
            libc::free((*raw).src_addr);
            (*raw).src_addr = copy.cast();
            (*raw).src_addrlen = addr.len() + 1;
        }
        Ok(owned)
    }
    /// A copy of this entry that says the caller passes a descriptor with every buffer
    /// (`FI_MR_LOCAL` added to its mr_mode, `local`), or does not.
    pub fn with_local_mr(&self, local: bool) -> Result<OwnedInfo> {
        let owned = self.to_owned()?;
        // SAFETY: the entry is the single one this OwnedInfo owns, with the domain_attr
        // fi_dupinfo copied (non-null: fi_getinfo entries always carry one).
        unsafe {
            let attr = (*owned.list.head).domain_attr;
            if attr.is_null() {
                return Err(Error::Internal("an fi_info without domain_attr".into()));
            }
            match local {
                true => (*attr).mr_mode |= sys::FI_MR_LOCAL as i32,
                false => (*attr).mr_mode &= !(sys::FI_MR_LOCAL as i32),
            }
        }
        Ok(owned)
    }
    /// A copy of this one entry that outlives the list.
    pub fn to_owned(&self) -> Result<OwnedInfo> {
        // SAFETY: fi_dupinfo deep-copies one fi_info (not its `next` chain) and returns NULL
        // only on allocation failure.
        let dup = unsafe { sys::fi_dupinfo(self.raw) };
        if dup.is_null() {
            return Err(Error::Internal("fi_dupinfo failed: out of memory".into()));
        }
        // SAFETY: dup is a fresh single-entry copy; cut any chain so Drop frees only it.
        unsafe { (*dup).next = ptr::null_mut() };
        Ok(OwnedInfo {
            list: InfoList { head: dup },
        })
    }
}

/// One owned `fi_info` entry.
pub struct OwnedInfo {
    list: InfoList,
}

impl OwnedInfo {
    pub fn info(&self) -> Info<'_> {
        Info {
            raw: self.list.iter().next().map(|i| i.raw).expect("one entry"),
        }
    }
}
