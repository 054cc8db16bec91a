//! The control messages (CONNECT, ACK, NACK, PING, PONG), read and checked.

use super::pieces::read_flows;
use super::record::{Kind, Record};
use super::Identity;
use crate::address::Shape;
use crate::error::{Error, Result};

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
    use crate::handshake::{MAX_ADDR, MSG_SIZE};

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
