//! Owning wrappers for `fi_info` lists, fabrics and domains.
//!
//! Every object closes itself on drop (logging, never panicking, on failure) and keeps its
//! parent alive through an `Arc`, so a handle given to NCCL never outlives what it needs.

use crate::error::{check, Error, Result};
use crate::sys;
use std::ffi::c_void;
use std::ffi::{c_char, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Keys requested when the provider does not pick them (process-wide, never repeated: tcp,
/// rxm and shm fail a repeated one with -FI_ENOKEY).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A memory registration key no other registration of this process asked for.
pub fn unique_key() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The libfabric version the running library reports (`fi_version()`).
pub fn runtime_version() -> u32 {
    // SAFETY: fi_version takes no arguments and only returns a constant.
    unsafe { sys::fi_version() }
}

/// The libfabric version of the headers this crate was built against.
pub const HEADER_VERSION: u32 = fi_version(sys::FI_MAJOR_VERSION, sys::FI_MINOR_VERSION);

pub fn version_string(v: u32) -> String {
    format!("{}.{}", v >> 16, v & 0xffff)
}

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
    raw: &'a sys::fi_info,
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

/// An endpoint address in words: `127.0.0.1:4567` or `[::1]:4567` for socket addresses, the
/// text of a string address (`fi_shm://…`), else hex.
pub fn address_text(addr: &[u8]) -> String {
    if let Some(sa) = socket_address(addr) {
        return sa.to_string();
    }
    let text = addr.strip_suffix(&[0]).unwrap_or(addr);
    if !text.is_empty() && text.iter().all(|b| b.is_ascii_graphic()) {
        String::from_utf8_lossy(text).into_owned()
    } else {
        addr.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A `sockaddr_in` or `sockaddr_in6` address as a socket address; `None` for anything else.
pub fn socket_address(addr: &[u8]) -> Option<std::net::SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*addr.first()?, *addr.get(1)?]));
    let port = u16::from_be_bytes([*addr.get(2)?, *addr.get(3)?]);
    match (family, addr.len()) {
        (libc::AF_INET, 16) => {
            let ip = std::net::Ipv4Addr::new(addr[4], addr[5], addr[6], addr[7]);
            Some((ip, port).into())
        }
        (libc::AF_INET6, 28) => {
            let octets: [u8; 16] = addr[8..24].try_into().ok()?;
            Some((std::net::Ipv6Addr::from(octets), port).into())
        }
        _ => None,
    }
}

/// Closes a fid (every `fid_*` struct starts with its `struct fid`), logging, never
/// panicking, on failure.
pub(crate) fn close_fid(what: &str, fid: *mut sys::fid) {
    if fid.is_null() {
        return;
    }
    // SAFETY: fid belongs to an object this crate opened and closes exactly once (from Drop).
    let ret = unsafe { sys::fi_close(fid) };
    if ret != 0 {
        tracing::warn!(
            "closing the {what} failed: {}",
            Error::fabric("fi_close", ret)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::address_text;

    #[test]
    fn addresses_in_words() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&4567u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(address_text(&v4), "127.0.0.1:4567");
        let mut v6 = vec![0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&80u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(address_text(&v6), "[::1]:80");
        assert_eq!(address_text(b"fi_shm://12-ab:0:2\0"), "fi_shm://12-ab:0:2");
        assert_eq!(address_text(&[0xff, 0x00, 0x01]), "ff0001");
    }
}
