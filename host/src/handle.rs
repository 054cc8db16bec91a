//! The plugin's handles as the host holds them: the opaque pointers it hands out, and a
//! listen handle as hex.

use crate::nccl::NET_HANDLE_MAXSIZE;
use std::ffi::c_void;

/// Opaque pointers the plugin hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr(pub *mut c_void);
// SAFETY: these are opaque tokens the plugin lets NCCL use from any of its threads.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

/// Hex for passing a handle through a pipe or an environment variable.
pub fn handle_to_hex(h: &[u8; NET_HANDLE_MAXSIZE]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn handle_from_hex(s: &str) -> Option<[u8; NET_HANDLE_MAXSIZE]> {
    let s = s.trim();
    if s.len() != NET_HANDLE_MAXSIZE * 2 {
        return None;
    }
    let mut out = [0u8; NET_HANDLE_MAXSIZE];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}
