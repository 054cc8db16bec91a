//! Owning wrappers for `fi_info` lists, fabrics and domains.
//!
//! Every object closes itself on drop (logging, never panicking, on failure) and keeps its
//! parent alive through an `Arc`, so a handle given to NCCL never outlives what it needs.
//!
//! What `fi_getinfo` is asked and answers is `info.rs`; fabrics and domains `domain.rs`;
//! here are libfabric's versions, registration keys, addresses in words and closing a fid.

use crate::error::Error;
use crate::sys;
use std::sync::atomic::{AtomicU64, Ordering};

mod domain;
mod info;

pub use domain::{Domain, Fabric};
pub use info::{Hints, Info, InfoList, OwnedInfo};

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
