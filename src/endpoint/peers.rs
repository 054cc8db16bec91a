//! Peer addresses: which an endpoint may be given, and entering them into its address
//! vector.

use super::Endpoint;
use crate::address::Shape;
use crate::error::{Error, Result};
use crate::sys;
use parking_lot::Mutex;
use std::ptr;

/// Addresses of this process's endpoints whose queue is open now (see
/// `quirks::names_this_process`). Locked only to look up, add or remove an address.
pub(super) static OPEN_HERE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Refuses a peer address that is not of `shape` (see `address`), or that names an endpoint
/// of this process that is not open: sending there hangs some providers (libfabric 2.1 shm).
pub fn check_peer_address(shape: &Shape, provider: &str, addr: &[u8]) -> Result<()> {
    shape.check(addr)?;
    if crate::quirks::names_this_process(provider, addr)
        && !OPEN_HERE.lock().iter().any(|a| a == addr)
    {
        return Err(Error::InvalidArgument(format!(
            "the address {} names an endpoint of this process that is not open (a stale or \
             forged handle)",
            crate::fabric::address_text(addr)
        )));
    }
    Ok(())
}

impl Endpoint {
    /// Refuses a peer address this endpoint must not be given (see [`check_peer_address`]).
    pub fn check_peer(&self, addr: &[u8]) -> Result<()> {
        check_peer_address(&self.shape, &self.provider, addr)
    }

    /// Inserts a peer address, checked with [`Endpoint::check_peer`] first; returns its
    /// `fi_addr_t`.
    pub fn insert(&self, addr: &[u8]) -> Result<sys::fi_addr_t> {
        self.check_peer(addr)?;
        let mut out: sys::fi_addr_t = 0;
        // SAFETY: av is open; addr was just checked to hold exactly one address of the
        // provider's format and length (NUL-terminated for string formats), so the provider
        // reads inside it.
        let n = unsafe {
            sys::fi_av_insert(
                self.av,
                addr.as_ptr().cast(),
                1,
                &mut out,
                0,
                ptr::null_mut(),
            )
        };
        if n != 1 {
            return Err(if n < 0 {
                Error::fabric("fi_av_insert", n)
            } else {
                Error::InvalidArgument("fi_av_insert rejected the peer address".into())
            });
        }
        Ok(out)
    }
}
