//! The record every handle and control message is: a versioned, checksummed header and up
//! to [`MAX_FIELDS`] byte fields, written and read with every check.

use super::{fnv1a, Identity};
use crate::error::{Error, Result};
use crate::nccl::NET_HANDLE_MAXSIZE;

pub const MAGIC: u32 = 0x4e46_4142; // "NFAB"
pub const VERSION: u8 = 8;

const HEADER: usize = 40;
/// Longest address a record field may carry: the longest endpoint name of any provider
/// (ucx: 1024 bytes).
pub const MAX_ADDR: usize = 1024;
/// Most byte fields a record has.
pub const MAX_FIELDS: usize = 4;
/// Size of a control message buffer: the header and the most fields, each of the longest
/// address. A message goes out only as long as its record ([`Record::encoded_len`]).
pub const MSG_SIZE: usize = HEADER + MAX_FIELDS * (2 + MAX_ADDR);
/// Longest endpoint name NCCL's connection handle can carry (one field after the header).
pub const HANDLE_ADDR_MAX: usize = NET_HANDLE_MAXSIZE - HEADER - 2;

/// Record kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Handle = 1,
    Connect = 2,
    Ack = 3,
    Nack = 4,
    Ping = 5,
    Pong = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Handle,
            2 => Kind::Connect,
            3 => Kind::Ack,
            4 => Kind::Nack,
            5 => Kind::Ping,
            6 => Kind::Pong,
            _ => return None,
        })
    }
}

/// One record: two numbers, the sender, and up to [`MAX_FIELDS`] byte fields.
///
/// Layout (little endian): magic u32 @0, version u8 @4, kind u8 @5, field count u8 @6,
/// a u64 @8, b u64 @16, host u64 @24, pid u32 @32, check u32 @36, then each field as a
/// u16 length and its bytes. The checksum covers the header (check zeroed) and the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub a: u64,
    pub b: u64,
    pub who: Identity,
    pub fields: Vec<Vec<u8>>,
}

fn checksum(buf: &[u8]) -> u32 {
    let mut h = fnv1a(&buf[..36]);
    h ^= fnv1a(&buf[40..]).rotate_left(17);
    (h ^ (h >> 32)) as u32
}

/// Recomputes the checksum of an encoded record in place (for tools and tests that craft
/// records field by field).
pub fn seal(buf: &mut [u8]) {
    if buf.len() >= HEADER {
        buf[36..40].fill(0);
        let check = checksum(buf);
        buf[36..40].copy_from_slice(&check.to_le_bytes());
    }
}

impl Record {
    /// Bytes the record takes written out.
    pub fn encoded_len(&self) -> usize {
        HEADER + self.fields.iter().map(|f| 2 + f.len()).sum::<usize>()
    }

    /// Writes the record into `out` (zero-filled first); the checksum covers all of `out`.
    pub fn write(&self, out: &mut [u8]) -> Result<()> {
        let body = self.encoded_len() - HEADER;
        if HEADER + body > out.len()
            || self.fields.len() > MAX_FIELDS
            || self.fields.iter().any(|f| f.len() > MAX_ADDR)
        {
            return Err(Error::Internal(format!(
                "a {:?} record of {} bytes does not fit its {}-byte buffer",
                self.kind,
                HEADER + body,
                out.len()
            )));
        }
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = VERSION;
        out[5] = self.kind as u8;
        out[6] = self.fields.len() as u8;
        out[8..16].copy_from_slice(&self.a.to_le_bytes());
        out[16..24].copy_from_slice(&self.b.to_le_bytes());
        out[24..32].copy_from_slice(&self.who.host.to_le_bytes());
        out[32..36].copy_from_slice(&self.who.pid.to_le_bytes());
        let mut at = HEADER;
        for f in &self.fields {
            out[at..at + 2].copy_from_slice(&(f.len() as u16).to_le_bytes());
            out[at + 2..at + 2 + f.len()].copy_from_slice(f);
            at += 2 + f.len();
        }
        let check = checksum(out);
        out[36..40].copy_from_slice(&check.to_le_bytes());
        Ok(())
    }

    /// Reads a record; `what` names it in errors.
    pub fn read(buf: &[u8], what: &str) -> Result<Record> {
        let bad = |why: String| Error::InvalidArgument(format!("malformed {what}: {why}"));
        if buf.len() < HEADER {
            return Err(bad(format!("{} bytes, need at least {HEADER}", buf.len())));
        }
        let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4"));
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(bad(format!(
                "magic {magic:#010x}, expected {MAGIC:#010x} (not made by nccl-net-fabric, or zeroed)"
            )));
        }
        if buf[4] != VERSION {
            return Err(bad(format!(
                "version {}, this plugin speaks {VERSION}: run the same plugin on every rank",
                buf[4]
            )));
        }
        let kind = Kind::from_u8(buf[5]).ok_or_else(|| bad(format!("record kind {}", buf[5])))?;
        let count = usize::from(buf[6]);
        if count > MAX_FIELDS {
            return Err(bad(format!("{count} fields")));
        }
        if u32_at(36) != checksum(buf) {
            return Err(bad("checksum mismatch (corrupted in transit)".into()));
        }
        let mut fields = Vec::with_capacity(count);
        let mut at = HEADER;
        for i in 0..count {
            let len = buf
                .get(at..at + 2)
                .map(|l| usize::from(u16::from_le_bytes([l[0], l[1]])))
                .ok_or_else(|| bad(format!("field {i} starts past the end")))?;
            let field = buf
                .get(at + 2..at + 2 + len)
                .filter(|_| len <= MAX_ADDR)
                .ok_or_else(|| bad(format!("field {i} of {len} bytes does not fit")))?;
            fields.push(field.to_vec());
            at += 2 + len;
        }
        Ok(Record {
            kind,
            a: u64_at(8),
            b: u64_at(16),
            who: Identity {
                host: u64_at(24),
                pid: u32_at(32),
            },
            fields,
        })
    }

    /// Field `i`, which a record of this kind must have and which must not be empty.
    pub fn field(&self, i: usize, what: &str) -> Result<&[u8]> {
        self.fields
            .get(i)
            .filter(|f| !f.is_empty())
            .map(Vec::as_slice)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "malformed {what}: {:?} without field {i}",
                    self.kind
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_keep_their_kind() {
        let r = Record {
            kind: Kind::Connect,
            a: 3,
            b: 9,
            who: Identity { host: 1, pid: 2 },
            fields: vec![vec![9; 120], vec![8; 30]],
        };
        let mut buf = [0u8; MSG_SIZE];
        r.write(&mut buf).unwrap();
        assert_eq!(Record::read(&buf, "message").unwrap(), r);
        let mut lying = buf;
        lying[HEADER] = 0xff; // first field claims 255+ bytes; checksum catches it first
        assert!(Record::read(&lying, "message").is_err());
        assert!(r.field(2, "CONNECT").is_err());
    }
}
