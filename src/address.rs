//! What a peer's address must look like before libfabric sees it.
//!
//! `fi_av_insert` takes no length: a provider reads as many bytes as its address format says
//! (a whole `sockaddr_in` for tcp, a NUL-terminated name for shm). An address from NCCL's
//! handle or from a control message is therefore accepted only when it has exactly the shape
//! of this endpoint's own address:
//!
//! | format            | accepted                                                        |
//! |-------------------|-----------------------------------------------------------------|
//! | `FI_SOCKADDR_IN`  | 16 bytes, family `AF_INET`, port not 0                          |
//! | `FI_SOCKADDR_IN6` | 28 bytes, family `AF_INET6`, port not 0                         |
//! | `FI_SOCKADDR`     | either of the two above                                         |
//! | `FI_ADDR_STR`     | printable text, NUL-terminated inside the bytes (only NULs after), the same scheme (`fi_shm://` …) |
//! | any other         | exactly as long as this endpoint's own address                  |

use crate::error::{Error, Result};
use crate::sys;

const SOCKADDR_IN: usize = std::mem::size_of::<libc::sockaddr_in>();
const SOCKADDR_IN6: usize = std::mem::size_of::<libc::sockaddr_in6>();
/// Longest address string accepted (shm names are far shorter).
const MAX_STR: usize = 256;

/// The shape of the addresses an endpoint can take, learnt from its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    format: u32,
    /// Length of this endpoint's own address.
    len: usize,
    /// For string addresses, the scheme of this endpoint's own (`fi_shm://`), if any.
    scheme: Vec<u8>,
}

impl Shape {
    /// The shape of addresses like `local`, of libfabric address format `format`.
    pub fn of(format: u32, local: &[u8]) -> Shape {
        let text = local.split(|&b| b == 0).next().unwrap_or_default();
        let scheme = match text.windows(3).position(|w| w == b"://") {
            Some(at) if format == sys::FI_ADDR_STR => text[..at + 3].to_vec(),
            _ => Vec::new(),
        };
        Shape {
            format,
            len: local.len(),
            scheme,
        }
    }

    /// `Ok` when `addr` is an address of this shape; otherwise why not.
    pub fn check(&self, addr: &[u8]) -> Result<()> {
        self.why_not(addr).map_or(Ok(()), |why| {
            Err(Error::InvalidArgument(format!(
                "a peer address of {} bytes ({}) is not an address of this provider: {why}",
                addr.len(),
                crate::fabric::address_text(&addr[..addr.len().min(64)])
            )))
        })
    }

    fn why_not(&self, addr: &[u8]) -> Option<String> {
        match self.format {
            sys::FI_SOCKADDR_IN => sockaddr(addr, &[(libc::AF_INET, SOCKADDR_IN)]),
            sys::FI_SOCKADDR_IN6 => sockaddr(addr, &[(libc::AF_INET6, SOCKADDR_IN6)]),
            sys::FI_SOCKADDR => sockaddr(
                addr,
                &[(libc::AF_INET, SOCKADDR_IN), (libc::AF_INET6, SOCKADDR_IN6)],
            ),
            sys::FI_ADDR_STR => self.string(addr),
            _ if addr.len() != self.len => Some(format!(
                "this provider's addresses are {} bytes long",
                self.len
            )),
            _ => None,
        }
    }

    fn string(&self, addr: &[u8]) -> Option<String> {
        let Some(end) = addr.iter().position(|&b| b == 0) else {
            return Some("not NUL-terminated".into());
        };
        let (text, rest) = addr.split_at(end);
        if text.is_empty() || text.len() > MAX_STR {
            return Some(format!("a name of {} characters", text.len()));
        }
        if !text.iter().all(u8::is_ascii_graphic) {
            return Some("not printable text".into());
        }
        if rest.iter().any(|&b| b != 0) {
            return Some("bytes after its terminating NUL".into());
        }
        if !text.starts_with(&self.scheme) {
            return Some(format!(
                "not a {} address",
                String::from_utf8_lossy(&self.scheme)
            ));
        }
        None
    }
}

/// Checks a socket address against the (family, length) pairs allowed.
fn sockaddr(addr: &[u8], allowed: &[(i32, usize)]) -> Option<String> {
    let family = addr
        .get(..2)
        .map(|f| i32::from(u16::from_ne_bytes([f[0], f[1]])));
    let Some(&(_, len)) = allowed.iter().find(|(f, _)| Some(*f) == family) else {
        return Some(format!("address family {family:?}"));
    };
    if addr.len() != len {
        return Some(format!("socket addresses of its family are {len} bytes"));
    }
    if addr[2..4] == [0, 0] {
        return Some("port 0".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inet(port: u16) -> Vec<u8> {
        let mut a = vec![0u8; SOCKADDR_IN];
        a[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        a[2..4].copy_from_slice(&port.to_be_bytes());
        a[4..8].copy_from_slice(&[127, 0, 0, 1]);
        a
    }

    #[test]
    fn socket_addresses_must_be_whole() {
        let shape = Shape::of(sys::FI_SOCKADDR_IN, &inet(5000));
        assert!(shape.check(&inet(6000)).is_ok());
        assert!(shape.check(&inet(6000)[..12]).is_err(), "12 bytes");
        let mut long = inet(6000);
        long.push(0);
        assert!(shape.check(&long).is_err());
        assert!(shape.check(&inet(0)).is_err(), "port 0");
        let mut six = vec![0u8; SOCKADDR_IN6];
        six[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        six[3] = 1;
        assert!(shape.check(&six).is_err(), "IPv6 to an IPv4 endpoint");
        assert!(Shape::of(sys::FI_SOCKADDR, &inet(1)).check(&six).is_ok());
        assert!(shape.check(&[]).is_err());
    }

    #[test]
    fn shm_names_must_be_terminated_text_of_the_same_scheme() {
        let shape = Shape::of(sys::FI_ADDR_STR, b"fi_shm://1234-abcd\0");
        assert!(shape.check(b"fi_shm://99-1\0").is_ok());
        assert!(shape.check(b"fi_shm://99-1\0\0\0").is_ok());
        assert!(shape.check(b"fi_shm://99-1").is_err(), "no NUL");
        assert!(shape.check(b"fi_shm://99\x01\0").is_err());
        assert!(shape.check(b"fi_shm://9\0junk").is_err());
        assert!(shape.check(b"fi_sockets://1:2\0").is_err());
        assert!(shape.check(b"\0").is_err());
        let long = [b"fi_shm://".as_slice(), &[b'x'; 300], b"\0"].concat();
        assert!(shape.check(&long).is_err());
    }

    #[test]
    fn other_formats_must_match_the_local_length() {
        let shape = Shape::of(sys::FI_SOCKADDR_IB, &[1; 48]);
        assert!(shape.check(&[7; 48]).is_ok());
        assert!(shape.check(&[7; 47]).is_err());
    }
}
