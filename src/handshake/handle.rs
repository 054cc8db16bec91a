//! The connection handle `listen` publishes, which NCCL carries between ranks.

use super::record::{Kind, Record};
use super::Identity;
use crate::error::{Error, Result};
use crate::nccl::NET_HANDLE_MAXSIZE;

/// What `listen` publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    /// Random: which listen comm of the owner's process.
    pub token: u64,
    /// Random per control endpoint: tells this process's own handles apart.
    pub nonce: u64,
    pub owner: Identity,
    /// The owner's control endpoint.
    pub addr: Vec<u8>,
}

impl Handle {
    pub fn write(&self, out: &mut [u8; NET_HANDLE_MAXSIZE]) -> Result<()> {
        Record {
            kind: Kind::Handle,
            a: self.token,
            b: self.nonce,
            who: self.owner,
            fields: vec![self.addr.clone()],
        }
        .write(out)
    }
    pub fn read(buf: &[u8; NET_HANDLE_MAXSIZE]) -> Result<Self> {
        const WHAT: &str = "connection handle";
        let r = Record::read(buf, WHAT)?;
        if r.kind != Kind::Handle {
            return Err(Error::InvalidArgument(format!(
                "malformed {WHAT}: a {:?} record",
                r.kind
            )));
        }
        Ok(Handle {
            token: r.a,
            nonce: r.b,
            owner: r.who,
            addr: r.field(0, WHAT)?.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{HANDLE_ADDR_MAX, MAX_ADDR};

    fn sample() -> Handle {
        Handle {
            token: 0x1234_5678_9abc_def0,
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
        let longest = Handle {
            token: 1,
            nonce: 2,
            owner: Identity::default(),
            addr: vec![7; HANDLE_ADDR_MAX],
        };
        assert!(longest.write(&mut [0u8; NET_HANDLE_MAXSIZE]).is_ok());
        let too_long = Handle {
            addr: vec![7; HANDLE_ADDR_MAX + 1],
            ..longest
        };
        assert!(too_long.write(&mut [0u8; NET_HANDLE_MAXSIZE]).is_err());
        assert!(Handle::read(&zero)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut buf = [0u8; NET_HANDLE_MAXSIZE];
        sample().write(&mut buf).unwrap();
        for i in [8usize, 20, 33, 43, 100] {
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
    }

    #[test]
    fn oversized_fields_are_refused() {
        let mut h = sample();
        h.addr = vec![0; MAX_ADDR + 1];
        assert!(h.write(&mut [0u8; NET_HANDLE_MAXSIZE]).is_err());
        h.addr = vec![7; 100];
        assert!(
            h.write(&mut [0u8; NET_HANDLE_MAXSIZE]).is_err(),
            "40 + 2 + 100 > 128"
        );
    }
}
