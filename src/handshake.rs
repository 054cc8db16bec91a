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

use crate::address::Shape;
use crate::error::{Error, Result};
use crate::nccl::NET_HANDLE_MAXSIZE;

pub const MAGIC: u32 = 0x4e46_4142; // "NFAB"
pub const VERSION: u8 = 7;

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

/// A piece size as a record field (see `comm`: how long messages are split).
pub fn piece_field(bytes: u64) -> Vec<u8> {
    bytes.to_le_bytes().to_vec()
}

/// A comm's flows after its first (see `comm`: pieces spread over them), as a record field:
/// per flow its comm id (0 in a CONNECT, where the receiver has not chosen them yet), the
/// length of its endpoint's address (u16) and the address. As many as fit one field; the
/// second value says how many that is (the comm lets go of the rest).
pub fn flows_field(flows: &[(u64, Vec<u8>)]) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut taken = 0;
    for (id, addr) in flows.iter().take(MAX_FURTHER_FLOWS) {
        let Ok(len) = u16::try_from(addr.len()) else {
            break;
        };
        if out.len() + 10 + addr.len() > MAX_ADDR {
            break;
        }
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(addr);
        taken += 1;
    }
    (out, taken)
}

/// Most flows after its first that a comm's pieces spread over.
pub const MAX_FURTHER_FLOWS: usize = crate::tags::MAX_PIECES - 1;

/// Reads a [`flows_field`], every address held to `shape`.
fn read_flows(field: &[u8], shape: &Shape, what: &str) -> Result<Vec<(u64, Vec<u8>)>> {
    let bad = |why: String| Error::InvalidArgument(format!("malformed {what}: {why}"));
    let mut flows = Vec::new();
    let mut rest = field;
    while !rest.is_empty() {
        if flows.len() == MAX_FURTHER_FLOWS {
            return Err(bad(format!("more than {MAX_FURTHER_FLOWS} further flows")));
        }
        let (head, tail) = rest
            .split_at_checked(10)
            .ok_or_else(|| bad("a further flow cut short".into()))?;
        let id = u64::from_le_bytes(head[..8].try_into().expect("8"));
        let len = usize::from(u16::from_le_bytes([head[8], head[9]]));
        let (addr, tail) = tail
            .split_at_checked(len)
            .ok_or_else(|| bad(format!("a further flow's address of {len} bytes cut short")))?;
        shape
            .check(addr)
            .map_err(|e| bad(format!("a further flow: {e}")))?;
        flows.push((id, addr.to_vec()));
        rest = tail;
    }
    Ok(flows)
}

/// Smallest piece size used: below it messages go whole (pieces of a few bytes only cost).
pub const MIN_PIECE: u64 = crate::tags::PIECE_UNIT as u64;

/// The piece size two peers use: the smaller of what each offers, none if either offers
/// none or less than [`MIN_PIECE`].
pub fn agreed_piece(mine: u64, theirs: u64) -> u64 {
    match mine.min(theirs) {
        p if p < MIN_PIECE => 0,
        p => p,
    }
}

/// A control message, read and checked: every address in it has the shape of this
/// provider's addresses (see `address`), so it can go to libfabric as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// To listen comm `token`: connect `conn`, answer to `reply_to` (the sender's control
    /// endpoint); its data arrives from `data`.
    Connect {
        token: u64,
        conn: u64,
        who: Identity,
        reply_to: Vec<u8>,
        data: Vec<u8>,
        /// The piece size the connector offers (0: none; a peer without the field).
        piece: u64,
        /// The connector's further sending flows (ids 0), if it offers to spread pieces.
        flows: Vec<(u64, Vec<u8>)>,
    },
    /// Connect `conn` accepted: send to comm `id` at `data`, in pieces of `piece` bytes,
    /// pieces after the first also over the further flows `flows` (each with its comm id).
    Ack {
        conn: u64,
        id: u64,
        who: Identity,
        data: Vec<u8>,
        piece: u64,
        flows: Vec<(u64, Vec<u8>)>,
    },
    /// Connect `conn` refused, and why.
    Nack {
        conn: u64,
        why: String,
    },
    /// A liveness probe: answer `token` to `reply_to`.
    Ping {
        token: u64,
        reply_to: Vec<u8>,
    },
    Pong {
        token: u64,
    },
}

impl Message {
    /// Reads and checks a control message; any flaw is an `InvalidArgument` saying which.
    /// Control endpoints' addresses must have the shape `control`, data endpoints' the
    /// shape `data` (the same where both live on one provider).
    pub fn parse(bytes: &[u8], control: &Shape, data: &Shape) -> Result<Message> {
        let r = Record::read(bytes, "control message")?;
        let what = format!("{:?}", r.kind);
        let address = |i: usize, shape: &Shape| -> Result<Vec<u8>> {
            let a = r.field(i, &what)?;
            shape
                .check(a)
                .map_err(|e| Error::InvalidArgument(format!("malformed {what}: {e}")))?;
            Ok(a.to_vec())
        };
        // A field a peer may leave out (0 then).
        let number = |i: usize| -> Result<u64> {
            match r.fields.get(i) {
                None => Ok(0),
                Some(f) => <[u8; 8]>::try_from(f.as_slice())
                    .map(u64::from_le_bytes)
                    .map_err(|_| {
                        Error::InvalidArgument(format!(
                            "malformed {what}: field {i} has {} bytes, not 8",
                            f.len()
                        ))
                    }),
            }
        };
        let flows = |i: usize| -> Result<Vec<(u64, Vec<u8>)>> {
            r.fields
                .get(i)
                .map_or(Ok(Vec::new()), |f| read_flows(f, data, &what))
        };
        Ok(match r.kind {
            Kind::Connect => Message::Connect {
                token: r.a,
                conn: r.b,
                who: r.who,
                reply_to: address(0, control)?,
                data: address(1, data)?,
                piece: number(2)?,
                flows: flows(3)?,
            },
            Kind::Ack => Message::Ack {
                conn: r.a,
                id: r.b,
                who: r.who,
                data: address(0, data)?,
                piece: number(1)?,
                flows: flows(2)?,
            },
            Kind::Nack => Message::Nack {
                conn: r.a,
                why: r
                    .fields
                    .first()
                    .map(|f| {
                        String::from_utf8_lossy(f)
                            .chars()
                            .filter(|c| !c.is_control())
                            .take(160)
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            Kind::Ping => Message::Ping {
                token: r.a,
                reply_to: address(0, control)?,
            },
            Kind::Pong => Message::Pong { token: r.a },
            Kind::Handle => {
                return Err(Error::InvalidArgument(
                    "malformed control message: a connection handle".into(),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_need_both_ends_and_a_sensible_size() {
        assert_eq!(agreed_piece(1 << 20, 1 << 19), 1 << 19);
        assert_eq!(agreed_piece(1 << 20, 0), 0);
        assert_eq!(agreed_piece(0, 1 << 20), 0);
        assert_eq!(
            agreed_piece(1 << 20, 1),
            0,
            "pieces of a byte are not worth it"
        );
        assert_eq!(agreed_piece(1 << 20, u64::MAX), 1 << 20);
        assert_eq!(agreed_piece(MIN_PIECE, MIN_PIECE), MIN_PIECE);
    }

    #[test]
    fn further_flows_round_trip_and_are_checked() {
        use crate::address::Shape;
        let shape = Shape::of(crate::sys::FI_FORMAT_UNSPEC, &[1; 16]);
        let flows = vec![(7u64, vec![1u8; 16]), (9, vec![2; 16])];
        let (field, n) = flows_field(&flows);
        assert_eq!(n, 2);
        assert_eq!(read_flows(&field, &shape, "ACK").unwrap(), flows);
        assert_eq!(read_flows(&[], &shape, "ACK").unwrap(), vec![]);
        let cut = read_flows(&field[..field.len() - 1], &shape, "ACK").unwrap_err();
        assert!(cut.to_string().contains("cut short"), "{cut}");
        let (odd, _) = flows_field(&[(1, vec![1; 15])]);
        assert!(read_flows(&odd, &shape, "ACK").is_err(), "another shape");
        // A forged field with one flow too many is refused; this end never writes one.
        let (mut many, n) = flows_field(&vec![(1, vec![1; 16]); MAX_FURTHER_FLOWS + 1]);
        assert_eq!(n, MAX_FURTHER_FLOWS, "no more than a comm may have");
        let extra = many[..26].to_vec();
        many.extend_from_slice(&extra);
        let e = read_flows(&many, &shape, "ACK").unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        // Only as many as fit one field go (long names: fewer flows).
        let (field, n) = flows_field(&vec![(1, vec![0; 400]); 4]);
        assert_eq!(n, 2);
        assert!(field.len() <= MAX_ADDR);
        assert_eq!(
            flows_field(&[(1, vec![0; MAX_ADDR])]).1,
            0,
            "too long for a field"
        );
    }

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

    #[test]
    fn a_connect_carries_a_long_data_name_beside_a_short_control_address() {
        use crate::address::Shape;
        let control = Shape::of(crate::sys::FI_FORMAT_UNSPEC, &[1; 16]);
        let data = Shape::of(crate::sys::FI_FORMAT_UNSPEC, &[2; MAX_ADDR]);
        let r = Record {
            kind: Kind::Connect,
            a: 1,
            b: 2,
            who: Identity { host: 1, pid: 2 },
            fields: vec![vec![1; 16], vec![2; MAX_ADDR]],
        };
        let mut buf = vec![0u8; r.encoded_len()];
        assert!(buf.len() <= MSG_SIZE);
        r.write(&mut buf).unwrap();
        match Message::parse(&buf, &control, &data).unwrap() {
            Message::Connect { reply_to, data, .. } => {
                assert_eq!(reply_to.len(), 16);
                assert_eq!(data.len(), MAX_ADDR);
            }
            m => panic!("{m:?}"),
        }
        // Each field is held to its own shape: a control address where the data name goes
        // (or the other way round) is refused.
        let err = Message::parse(&buf, &data, &control)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an address of this provider"), "{err}");
        let mut full = r.clone();
        full.fields.push(vec![3; MAX_ADDR]);
        full.fields.push(vec![4; MAX_ADDR]);
        full.fields[0] = vec![3; MAX_ADDR];
        assert_eq!(
            full.encoded_len(),
            MSG_SIZE,
            "the largest record fills the buffer"
        );
    }
}
