//! The connection handle NCCL carries between ranks, and the control messages the control
//! plane exchanges (see `control`).
//!
//! ```text
//! listen  : handle  {listen token, control nonce, owner host/pid, control address}
//! connect : CONNECT {listen token, conn id, sender host/pid, sender control + data address,
//!                    piece size offered, the sender's further flows} ──▶
//! accept  : ◀── ACK {conn id, comm id, receiver host/pid, receiver data address, piece size,
//!                    the receiver's further flows with their comm ids}
//!           ◀── NACK {conn id, reason}   (no such listen comm, or already connected)
//! liveness: PING {token, reply address} ──▶   ◀── PONG {token}
//! ```
//! Every record is versioned and checksummed; a bad one is an error, never a crash.
//!
//! The record format (header, fields, checks) is `record.rs`; the connection handle
//! `handle.rs`; the control messages `message.rs`; the piece size and further flows
//! fields, and how two peers agree on a piece size, `pieces.rs`.

mod handle;
mod message;
mod pieces;
mod record;

pub use handle::Handle;
pub use message::Message;
pub use pieces::{agreed_piece, flows_field, piece_field, MAX_FURTHER_FLOWS, MIN_PIECE};
pub use record::{
    seal, Kind, Record, HANDLE_ADDR_MAX, MAGIC, MAX_ADDR, MAX_FIELDS, MSG_SIZE, VERSION,
};

/// Which process, on which host: named in log lines about a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Identity {
    /// Hash of the boot id and pid namespace.
    pub host: u64,
    pub pid: u32,
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Identity {
    /// This process, read from /proc once per process (a forked child reads again).
    pub fn current() -> Self {
        static CACHED: std::sync::Mutex<Option<Identity>> = std::sync::Mutex::new(None);
        let pid = std::process::id();
        let mut cached = CACHED.lock().unwrap_or_else(|e| e.into_inner());
        match *cached {
            Some(id) if id.pid == pid => id,
            _ => {
                let id = Self::read(pid);
                *cached = Some(id);
                id
            }
        }
    }

    fn read(pid: u32) -> Self {
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let ns = std::fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut seed = boot;
        seed.extend_from_slice(ns.as_bytes());
        Identity {
            host: fnv1a(&seed),
            pid,
        }
    }
    /// Whether `other` is a process on this host (same boot, same pid namespace).
    pub fn same_host(&self, other: &Identity) -> bool {
        self.host == other.host && self.host != 0
    }
    /// `pid N on this host` / `pid N on another host`, as seen from `self`.
    pub fn describe(&self, other: &Identity) -> String {
        if self.same_host(other) {
            format!("pid {} on this host", other.pid)
        } else {
            format!("pid {} on another host", other.pid)
        }
    }
}
