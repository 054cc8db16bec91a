//! The tag layout that keeps every comm's traffic apart on a shared data endpoint.
//!
//! ```text
//! bit  B-1 … 16        15 … 0
//!      comm id          sequence
//! ```
//! `B` is the number of tag bits the provider offers (`mem_tag_format`, 64 when it does not
//! say). The comm id is chosen by the receiving endpoint, so it is unique there; the sequence
//! number counts a comm's posts, so the n-th send of a comm can only match the n-th receive:
//! NCCL's posting order, whatever order the provider matches in. 16 sequence bits cover far
//! more than the 32 requests a comm may have outstanding. Control messages travel on
//! endpoints of their own (see `control`).

const SEQ_BITS: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tags {
    id_mask: u64,
}

impl Tags {
    /// Layout for a provider's `mem_tag_format`.
    pub fn new(mem_tag_format: u64) -> Self {
        let bits = if mem_tag_format == 0 {
            64
        } else {
            64 - mem_tag_format.leading_zeros()
        };
        let bits = bits.max(SEQ_BITS + 8);
        Tags {
            id_mask: (1u64 << (bits - SEQ_BITS)) - 1,
        }
    }
    pub fn id_mask(&self) -> u64 {
        self.id_mask
    }
    /// The sequence bits of a data tag.
    pub fn seq_mask(&self) -> u64 {
        (1 << SEQ_BITS) - 1
    }
    pub fn data(&self, id: u64, seq: u64) -> u64 {
        ((id & self.id_mask) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_width_layout() {
        let t = Tags::new(0xaaaa_aaaa_aaaa_aaaa);
        assert_eq!(t.id_mask(), (1 << 48) - 1);
        assert_eq!(t.data(3, 5), (3 << 16) | 5);
        assert_eq!(
            t.data(3, 0x1_0005),
            t.data(3, 5),
            "sequence wraps within its field"
        );
    }

    #[test]
    fn narrow_providers_keep_fields_inside_their_bits() {
        let t = Tags::new(0x0000_0000_ffff_ffff);
        let tag = t.data(u64::MAX, u64::MAX);
        assert_eq!(tag >> 32, 0, "{tag:#x}");
        assert_eq!(Tags::new(0), Tags::new(u64::MAX));
    }

    #[test]
    fn comms_never_collide() {
        let t = Tags::new(0);
        let mut seen = std::collections::HashSet::new();
        for id in 1..50 {
            for seq in 0..40 {
                assert!(seen.insert(t.data(id, seq)));
            }
        }
    }
}
