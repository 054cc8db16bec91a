//! The tag layout that keeps every comm's traffic apart on a shared data endpoint, and the
//! buffers of a grouped receive apart within a comm.
//!
//! ```text
//! bit  B-1 … 32      31 … 12          11       10 … 9       8 … 0
//!      comm id       NCCL's tag       later    piece        sequence
//! ```
//! `B` is the number of tag bits the provider offers (`mem_tag_format`, 64 when it does not
//! say). The comm id is drawn at random by the receiving lane, unique there. NCCL's tag (the
//! sending rank) chooses the buffer of a grouped receive; the sequence number counts a comm's
//! posts *per NCCL tag*, so the n-th send with tag t matches the n-th receive buffer with tag
//! t, whatever the order in which the provider delivers and whether the receive groups
//! several buffers. 9 sequence bits cover twice the 256 sends (32 requests × 8 buffers) a
//! comm may have outstanding per tag. A message sent in pieces (see `comm`) has the same
//! sequence number in every piece: its first piece has the `later` bit clear and says in the
//! piece bits how many pieces there are (less one); every later piece has the bit set and
//! its index in the piece bits. A provider with fewer than 64 bits gives up
//! bits of NCCL's tag first (tags that then fold onto each other still match in order), then
//! of the comm id. Control messages travel on endpoints of their own (see `control`).

/// Bits below NCCL's tag: the piece fields and the sequence.
const SEQ_BITS: u32 = 12;
/// The sequence proper.
const COUNT_BITS: u32 = 9;
/// Most pieces one message may be sent in.
pub const MAX_PIECES: usize = 4;
/// The piece field: a first piece's count less one, or a later piece's index.
const PIECE_SHIFT: u32 = COUNT_BITS;
const PIECE_MASK: u64 = (MAX_PIECES as u64 - 1) << PIECE_SHIFT;
const LATER: u64 = 1 << (COUNT_BITS + 2);
const NCCL_TAG_BITS: u32 = 20;
/// Fewest bits the comm id keeps.
const MIN_ID_BITS: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tags {
    tag_bits: u32,
    id_mask: u64,
}

/// Tag bits a provider must offer: the sequence and the fewest comm id bits.
pub const MIN_TAG_BITS: u32 = SEQ_BITS + MIN_ID_BITS;

/// The tag bits `mem_tag_format` offers (64 when it says nothing).
pub fn offered_bits(mem_tag_format: u64) -> u32 {
    match mem_tag_format {
        0 => 64,
        f => 64 - f.leading_zeros(),
    }
}

/// Why a provider's tags cannot carry the layout, if they cannot.
pub fn too_few_bits(mem_tag_format: u64) -> Option<String> {
    let bits = offered_bits(mem_tag_format);
    (bits < MIN_TAG_BITS).then(|| {
        format!(
            "its tags have {bits} bits (mem_tag_format {mem_tag_format:#x}); the plugin needs at \
             least {MIN_TAG_BITS} ({SEQ_BITS} for the sequence, {MIN_ID_BITS} for the comm id)"
        )
    })
}

impl Tags {
    /// Layout for a provider's `mem_tag_format` (one [`too_few_bits`] accepts).
    pub fn new(mem_tag_format: u64) -> Self {
        let bits = offered_bits(mem_tag_format).max(MIN_TAG_BITS);
        let tag_bits = NCCL_TAG_BITS.min(bits - SEQ_BITS - MIN_ID_BITS);
        let id_bits = bits - SEQ_BITS - tag_bits;
        Tags {
            tag_bits,
            id_mask: if id_bits >= 64 {
                u64::MAX
            } else {
                (1u64 << id_bits) - 1
            },
        }
    }
    pub fn id_mask(&self) -> u64 {
        self.id_mask
    }
    /// The bits below the comm id: what a sink for all of a comm's messages ignores.
    pub fn below_id(&self) -> u64 {
        (1u64 << (SEQ_BITS + self.tag_bits)) - 1
    }
    /// NCCL's tag as it goes into the tag bits (folded if it does not fit).
    pub fn nccl_tag(&self, tag: i32) -> u64 {
        u64::from(tag as u32) & ((1u64 << self.tag_bits) - 1)
    }
    /// The tag of the `seq`-th message with NCCL tag `nccl_tag` (as [`Tags::nccl_tag`]
    /// gives it) of comm `id`.
    pub fn data(&self, id: u64, nccl_tag: u64, seq: u64) -> u64 {
        ((id & self.id_mask) << (SEQ_BITS + self.tag_bits))
            | ((nccl_tag & ((1u64 << self.tag_bits) - 1)) << SEQ_BITS)
            | (seq & ((1 << COUNT_BITS) - 1))
    }
    /// The tag of piece `index` of a message of `pieces` pieces whose [`Tags::data`] tag is
    /// `tag`.
    pub fn piece(&self, tag: u64, index: usize, pieces: usize) -> u64 {
        debug_assert!(index < pieces && pieces <= MAX_PIECES);
        match index {
            0 => tag | (((pieces as u64 - 1) << PIECE_SHIFT) & PIECE_MASK),
            i => tag | LATER | (((i as u64) << PIECE_SHIFT) & PIECE_MASK),
        }
    }
    /// The bits a receive of a first piece ignores (the count).
    pub fn first_piece_ignores(&self) -> u64 {
        PIECE_MASK
    }
    /// The tag of the message a first piece's tag belongs to (as [`Tags::data`] gave it).
    pub fn whole(&self, first: u64) -> u64 {
        first & !(PIECE_MASK | LATER)
    }
    /// How many pieces a message has, from the tag its first piece arrived with.
    pub fn pieces_of(&self, first: u64) -> usize {
        ((first & PIECE_MASK) >> PIECE_SHIFT) as usize + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_tag_bits_are_refused_with_the_reason() {
        assert_eq!(offered_bits(0), 64);
        assert_eq!(offered_bits(0x000f_ffff), 20);
        assert!(too_few_bits(0x000f_ffff).is_none());
        let why = too_few_bits(0x0000_ffff).expect("16 bits are too few");
        assert!(
            why.contains("16 bits") && why.contains("at least 20"),
            "{why}"
        );
        assert!(too_few_bits(0).is_none());
    }

    #[test]
    fn full_width_layout() {
        let t = Tags::new(0xaaaa_aaaa_aaaa_aaaa);
        assert_eq!(t.id_mask(), (1 << 32) - 1);
        assert_eq!(t.data(3, 7, 5), (3 << 32) | (7 << 12) | 5);
        assert_eq!(
            t.data(3, 7, 0x205),
            t.data(3, 7, 5),
            "sequence wraps within its field"
        );
        assert_eq!(t.below_id(), (1 << 32) - 1);
        assert_eq!(t.nccl_tag(-1), (1 << 20) - 1, "folded into 20 bits");
    }

    #[test]
    fn narrow_providers_keep_fields_inside_their_bits() {
        let t = Tags::new(0x0000_0000_ffff_ffff);
        let tag = t.data(u64::MAX, u64::MAX, u64::MAX);
        assert_eq!(tag >> 32, 0, "{tag:#x}");
        assert_eq!(t.id_mask(), (1 << 8) - 1);
        assert_eq!(Tags::new(0), Tags::new(u64::MAX));
    }

    #[test]
    fn pieces_are_apart_from_each_other_and_from_other_messages() {
        let t = Tags::new(0);
        let mut seen = std::collections::HashSet::new();
        for seq in 0..8 {
            let tag = t.data(5, 3, seq);
            assert_eq!(t.piece(tag, 0, 1), tag, "a whole message keeps its tag");
            for n in 2..=MAX_PIECES {
                let first = t.piece(tag, 0, n);
                assert_eq!(first & !t.first_piece_ignores(), tag);
                assert_eq!(t.pieces_of(first), n);
                assert_eq!(t.whole(first), tag);
                assert!(first & !t.below_id() == tag & !t.below_id(), "same comm");
            }
            for i in 1..MAX_PIECES {
                let later = t.piece(tag, i, MAX_PIECES);
                assert_eq!(later & !t.below_id(), tag & !t.below_id(), "same comm");
                assert_ne!(later & !t.first_piece_ignores(), tag, "no first piece");
                assert!(seen.insert(later));
            }
            assert!(seen.insert(tag));
        }
    }

    #[test]
    fn comms_and_nccl_tags_never_collide() {
        let t = Tags::new(0);
        let mut seen = std::collections::HashSet::new();
        for id in 1..20 {
            for nccl in 0..8 {
                for seq in 0..40 {
                    assert!(seen.insert(t.data(id, t.nccl_tag(nccl), seq)));
                }
            }
        }
    }
}
