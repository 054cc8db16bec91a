//! The piece size and further flows fields of CONNECT and ACK, and the piece size two
//! peers agree on.

use super::record::MAX_ADDR;
use crate::address::Shape;
use crate::error::{Error, Result};

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
pub const MAX_FURTHER_FLOWS: usize = crate::tags::MAX_FLOWS - 1;

/// Reads a [`flows_field`], every address held to `shape`.
pub(super) fn read_flows(field: &[u8], shape: &Shape, what: &str) -> Result<Vec<(u64, Vec<u8>)>> {
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
}
