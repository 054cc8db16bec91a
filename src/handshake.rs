//! The connection handle NCCL carries between ranks, and the two control messages that
//! establish a comm pair over an RDM endpoint.
//!
//! ```text
//! listen   : handle = {magic, version, listener address, listen id, endpoint nonce, host, pid, check}
//! connect  : CONNECT {listen id, nonce, sender id, sender host/pid, sender address} ──▶ listener
//! accept   : ◀── ACK {sender id, receiver host/pid}
//! ```
//! Data then flows sender → receiver with tags made from the listen id (see `tags`).
//! Every record is versioned and checksummed; a bad one is an error, never a crash.

use crate::error::{Error, Result};
use crate::nccl::NET_HANDLE_MAXSIZE;

pub const MAGIC: u32 = 0x4e46_4142; // "NFAB"
pub const VERSION: u8 = 1;

const HANDLE_HEADER: usize = 40;
/// Longest endpoint address a handle can carry.
pub const MAX_ADDR: usize = NET_HANDLE_MAXSIZE - HANDLE_HEADER;
/// Size of a CONNECT/ACK message buffer.
pub const MSG_SIZE: usize = 64 + 256;

/// Which process, on which host: lets a peer on the same host notice when we exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Identity {
    /// Hash of the boot id and pid namespace: equal means `pid` can be checked locally.
    pub host: u64,
    pub pid: u32,
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Identity {
    pub fn current() -> Self {
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let ns = std::fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut seed = boot;
        seed.extend_from_slice(ns.as_bytes());
        Identity {
            host: fnv1a(&seed),
            pid: std::process::id(),
        }
    }
    /// Whether `other` is a process on this host (same boot, same pid namespace).
    pub fn same_host(&self, other: &Identity) -> bool {
        self.host == other.host && self.host != 0
    }
}

/// Whether a process of this host (and pid namespace) still exists.
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks whether the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// What `listen` publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    pub listen_id: u64,
    pub nonce: u64,
    pub owner: Identity,
    pub addr: Vec<u8>,
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}
fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// Layout (little endian): magic u32 @0, version u8 @4, kind u8 @5, addr_len u16 @6,
/// id u64 @8, nonce u64 @16, host u64 @24, pid u32 @32, check u32 @36, address @40.
fn encode(buf: &mut [u8], kind: u8, id: u64, nonce: u64, who: Identity, addr: &[u8]) {
    buf.fill(0);
    put(buf, 0, &MAGIC.to_le_bytes());
    buf[4] = VERSION;
    buf[5] = kind;
    put(buf, 6, &(addr.len() as u16).to_le_bytes());
    put(buf, 8, &id.to_le_bytes());
    put(buf, 16, &nonce.to_le_bytes());
    put(buf, 24, &who.host.to_le_bytes());
    put(buf, 32, &who.pid.to_le_bytes());
    put(buf, HANDLE_HEADER, addr);
    let check = checksum(buf, HANDLE_HEADER + addr.len());
    put(buf, 36, &check.to_le_bytes());
}

fn checksum(buf: &[u8], len: usize) -> u32 {
    let mut copy = buf[..len].to_vec();
    copy[36..40].fill(0);
    let h = fnv1a(&copy);
    (h ^ (h >> 32)) as u32
}

struct Decoded {
    kind: u8,
    id: u64,
    nonce: u64,
    who: Identity,
    addr: Vec<u8>,
}

fn decode(buf: &[u8], what: &str) -> Result<Decoded> {
    let bad = |why: String| Error::InvalidArgument(format!("malformed {what}: {why}"));
    if buf.len() < HANDLE_HEADER {
        return Err(bad(format!(
            "{} bytes, need at least {HANDLE_HEADER}",
            buf.len()
        )));
    }
    let magic = u32_at(buf, 0);
    if magic != MAGIC {
        return Err(bad(format!(
            "magic {magic:#010x}, expected {MAGIC:#010x} (not made by nccl-net-fabric's listen, or zeroed)"
        )));
    }
    if buf[4] != VERSION {
        return Err(bad(format!(
            "version {}, this plugin speaks {VERSION}: run the same plugin on every rank",
            buf[4]
        )));
    }
    let addr_len = usize::from(u16::from_le_bytes([buf[6], buf[7]]));
    if addr_len == 0 || HANDLE_HEADER + addr_len > buf.len() {
        return Err(bad(format!("address length {addr_len} does not fit")));
    }
    let check = u32_at(buf, 36);
    if check != checksum(buf, HANDLE_HEADER + addr_len) {
        return Err(bad("checksum mismatch (corrupted in transit)".into()));
    }
    Ok(Decoded {
        kind: buf[5],
        id: u64_at(buf, 8),
        nonce: u64_at(buf, 16),
        who: Identity {
            host: u64_at(buf, 24),
            pid: u32_at(buf, 32),
        },
        addr: buf[HANDLE_HEADER..HANDLE_HEADER + addr_len].to_vec(),
    })
}

const KIND_HANDLE: u8 = 1;
const KIND_CONNECT: u8 = 2;
const KIND_ACK: u8 = 3;

impl Handle {
    pub fn write(&self, out: &mut [u8; NET_HANDLE_MAXSIZE]) -> Result<()> {
        if self.addr.len() > MAX_ADDR {
            return Err(Error::Internal(format!(
                "endpoint address of {} bytes does not fit NCCL's {NET_HANDLE_MAXSIZE}-byte handle",
                self.addr.len()
            )));
        }
        encode(
            out,
            KIND_HANDLE,
            self.listen_id,
            self.nonce,
            self.owner,
            &self.addr,
        );
        Ok(())
    }
    pub fn read(buf: &[u8; NET_HANDLE_MAXSIZE]) -> Result<Self> {
        let d = decode(buf, "connection handle")?;
        if d.kind != KIND_HANDLE {
            return Err(Error::InvalidArgument(format!(
                "malformed connection handle: record kind {}",
                d.kind
            )));
        }
        Ok(Handle {
            listen_id: d.id,
            nonce: d.nonce,
            owner: d.who,
            addr: d.addr,
        })
    }
}

/// CONNECT: sent by `connect` to the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// The listener's nonce, echoed from the handle.
    pub nonce: u64,
    /// The id the sender receives its ACK on.
    pub sender_id: u64,
    pub sender: Identity,
    pub sender_addr: Vec<u8>,
}

/// ACK: the listener's answer to CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub nonce: u64,
    pub receiver: Identity,
}

impl Connect {
    pub fn write(&self, out: &mut [u8; MSG_SIZE]) {
        encode(
            out,
            KIND_CONNECT,
            self.sender_id,
            self.nonce,
            self.sender,
            &self.sender_addr,
        );
    }
    pub fn read(buf: &[u8]) -> Result<Self> {
        let d = decode(buf, "CONNECT message")?;
        if d.kind != KIND_CONNECT {
            return Err(Error::Remote(format!(
                "expected CONNECT, got record kind {}",
                d.kind
            )));
        }
        Ok(Connect {
            nonce: d.nonce,
            sender_id: d.id,
            sender: d.who,
            sender_addr: d.addr,
        })
    }
}

impl Ack {
    pub fn write(&self, out: &mut [u8; MSG_SIZE]) {
        // An ACK carries no address; one zero byte keeps the record format uniform.
        encode(out, KIND_ACK, 0, self.nonce, self.receiver, &[0]);
    }
    pub fn read(buf: &[u8]) -> Result<Self> {
        let d = decode(buf, "ACK message")?;
        if d.kind != KIND_ACK {
            return Err(Error::Remote(format!(
                "expected ACK, got record kind {}",
                d.kind
            )));
        }
        Ok(Ack {
            nonce: d.nonce,
            receiver: d.who,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Handle {
        Handle {
            listen_id: 7,
            nonce: 0xdead_beef,
            owner: Identity {
                host: 42,
                pid: 1234,
            },
            addr: vec![1, 2, 3, 4, 5],
        }
    }

    #[test]
    fn handle_round_trips() {
        let mut buf = [0u8; NET_HANDLE_MAXSIZE];
        sample().write(&mut buf).unwrap();
        assert_eq!(Handle::read(&buf).unwrap(), sample());
    }

    #[test]
    fn zeroed_and_corrupted_handles_are_rejected() {
        let zero = [0u8; NET_HANDLE_MAXSIZE];
        assert!(Handle::read(&zero)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut buf = [0u8; NET_HANDLE_MAXSIZE];
        sample().write(&mut buf).unwrap();
        for i in [8usize, 20, 33, 41] {
            let mut bad = buf;
            bad[i] ^= 0x40;
            assert!(
                Handle::read(&bad)
                    .unwrap_err()
                    .to_string()
                    .contains("checksum"),
                "byte {i}"
            );
        }
        let mut v = buf;
        v[4] = 9;
        assert!(Handle::read(&v)
            .unwrap_err()
            .to_string()
            .contains("version"));
        let mut l = buf;
        l[6] = 200;
        assert!(Handle::read(&l).unwrap_err().to_string().contains("length"));
    }

    #[test]
    fn too_long_address_is_refused() {
        let mut h = sample();
        h.addr = vec![0; MAX_ADDR + 1];
        assert!(h.write(&mut [0u8; NET_HANDLE_MAXSIZE]).is_err());
    }

    #[test]
    fn messages_round_trip_and_do_not_pass_for_each_other() {
        let c = Connect {
            nonce: 3,
            sender_id: 9,
            sender: Identity { host: 1, pid: 2 },
            sender_addr: vec![9; 200],
        };
        let mut buf = [0u8; MSG_SIZE];
        c.write(&mut buf);
        assert_eq!(Connect::read(&buf).unwrap(), c);
        assert!(Ack::read(&buf).is_err());
        let a = Ack {
            nonce: 3,
            receiver: Identity { host: 1, pid: 5 },
        };
        a.write(&mut buf);
        assert_eq!(Ack::read(&buf).unwrap(), a);
    }
}
