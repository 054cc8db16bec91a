//! The tag layout that keeps every comm's traffic apart on a shared data endpoint, and the
//! buffers of a grouped receive apart within a comm.
//!
//! ```text
//! bit  B-1 … 39      38 … 19          18 … 10        9         8 … 0
//!      comm id       NCCL's tag       layout         later     sequence
//! ```
//! `B` is the number of tag bits the provider offers (`mem_tag_format`, 64 when it does not
//! say). The comm id is drawn at random by the receiving lane, unique there (a comm with
//! several flows has an id on each). NCCL's tag (the sending rank) chooses the buffer of a
//! grouped receive; the sequence number counts a comm's posts *per NCCL tag*, so the n-th
//! send with tag t matches the n-th receive buffer with tag t, whatever the order in which
//! the provider delivers and whether the receive groups several buffers. 9 sequence bits
//! cover twice the 256 sends (32 requests × 8 buffers) a comm may have outstanding per tag.
//!
//! A message sent in pieces (see `comm`) starts with a header: an empty message with the
//! `later` bit clear whose layout field gives the piece size (4 KiB × 2^e, 4 bits) and the
//! count less one (5 bits); a whole message has layout 0. Each piece has the `later` bit set
//! and its index in the layout field, and the sequence number of its header. A receive's
//! first operation ignores the layout bits, so it takes a whole message or a header alike.
//! A provider with fewer than 64 bits gives up bits of NCCL's tag first (tags that then fold
//! onto each other still match in order), then of the comm id. Control messages travel on
//! endpoints of their own (see `control`).

/// Bits below NCCL's tag: the layout, the `later` bit and the sequence.
const SEQ_BITS: u32 = 19;
/// The sequence proper.
const COUNT_BITS: u32 = 9;
const LATER: u64 = 1 << COUNT_BITS;
const LAYOUT_SHIFT: u32 = COUNT_BITS + 1;
/// A header's count field (pieces less one), or a piece's index.
const COUNT_FIELD: u32 = 5;
/// A header's piece size field: 4 KiB shifted by this many bits.
const SIZE_FIELD: u32 = 4;
const LAYOUT_MASK: u64 = ((1 << (COUNT_FIELD + SIZE_FIELD)) - 1) << LAYOUT_SHIFT;
/// Most pieces one message may be sent in.
pub const MAX_PIECES: usize = 1 << COUNT_FIELD;
/// Most flows a comm has: the first, for whole messages and headers, and one per piece.
pub const MAX_FLOWS: usize = MAX_PIECES + 1;
/// The smallest piece size a header can name; every piece size is this times a power of two.
pub const PIECE_UNIT: usize = 4096;
/// The largest piece size a header can name.
pub const MAX_PIECE: usize = PIECE_UNIT << ((1 << SIZE_FIELD) - 1);
const NCCL_TAG_BITS: u32 = 20;
/// Fewest bits the comm id keeps.
const MIN_ID_BITS: u32 = 8;

/// How a message is cut: `count` pieces of `size` bytes, the last taking the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub count: usize,
    pub size: usize,
}

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
             least {MIN_TAG_BITS} ({SEQ_BITS} for the sequence and a long message's \
             layout, {MIN_ID_BITS} for the comm id)"
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
    /// The tag of the header of a message cut as `layout` (`size` a power of two from
    /// [`PIECE_UNIT`] to [`MAX_PIECE`], `count` from 2 to [`MAX_PIECES`]), whose
    /// [`Tags::data`] tag is `tag`.
    pub fn header(&self, tag: u64, layout: Layout) -> u64 {
        debug_assert!((2..=MAX_PIECES).contains(&layout.count));
        debug_assert!(layout.size.is_power_of_two() && layout.size >= PIECE_UNIT);
        let e = (layout.size / PIECE_UNIT).trailing_zeros() as u64;
        let field = (e << COUNT_FIELD) | (layout.count as u64 - 1);
        tag | ((field << LAYOUT_SHIFT) & LAYOUT_MASK)
    }
    /// The tag of piece `index` of the message whose [`Tags::data`] tag is `tag`.
    pub fn piece(&self, tag: u64, index: usize) -> u64 {
        debug_assert!(index < MAX_PIECES);
        tag | LATER | (((index as u64) << LAYOUT_SHIFT) & LAYOUT_MASK)
    }
    /// The bits a message's first receive ignores (a header's layout).
    pub fn first_ignores(&self) -> u64 {
        LAYOUT_MASK
    }
    /// How the message whose first part arrived with tag `first` is cut: `None` for a whole
    /// message.
    pub fn layout_of(&self, first: u64) -> Option<Layout> {
        let field = (first & LAYOUT_MASK) >> LAYOUT_SHIFT;
        (field != 0).then(|| Layout {
            count: (field & ((1 << COUNT_FIELD) - 1)) as usize + 1,
            size: PIECE_UNIT << (field >> COUNT_FIELD),
        })
    }
    /// The sequence number of the message whose first part arrived with tag `first`.
    pub fn seq_of(&self, first: u64) -> u64 {
        first & ((1 << COUNT_BITS) - 1)
    }
    /// The [`Tags::data`] tag of the message whose first part arrived with tag `first`.
    pub fn whole(&self, first: u64) -> u64 {
        first & !(LAYOUT_MASK | LATER)
    }
    /// The same tag for comm `id`: a piece that travels on another flow of the comm (see
    /// `comm`) carries the id the receiving lane there chose.
    pub fn with_id(&self, tag: u64, id: u64) -> u64 {
        (tag & self.below_id()) | ((id & self.id_mask) << (SEQ_BITS + self.tag_bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_tag_bits_are_refused_with_the_reason() {
        assert_eq!(offered_bits(0), 64);
        assert_eq!(offered_bits(0x000f_ffff), 20);
        assert!(too_few_bits(0x07ff_ffff).is_none());
        let why = too_few_bits(0x000f_ffff).expect("20 bits are too few");
        assert!(
            why.contains("20 bits") && why.contains("at least 27"),
            "{why}"
        );
        assert!(too_few_bits(0).is_none());
    }

    #[test]
    fn full_width_layout() {
        let t = Tags::new(0xaaaa_aaaa_aaaa_aaaa);
        assert_eq!(t.id_mask(), (1 << 25) - 1);
        assert_eq!(t.data(3, 7, 5), (3 << 39) | (7 << 19) | 5);
        assert_eq!(
            t.data(3, 7, 0x205),
            t.data(3, 7, 5),
            "sequence wraps within its field"
        );
        assert_eq!(t.below_id(), (1 << 39) - 1);
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
    fn headers_name_their_layout_and_pieces_are_apart_from_everything() {
        let t = Tags::new(0);
        let mut seen = std::collections::HashSet::new();
        for seq in 0..8 {
            let tag = t.data(5, 3, seq);
            assert_eq!(t.layout_of(tag), None, "a whole message keeps its tag");
            assert!(seen.insert(tag));
            for count in 2..=MAX_PIECES {
                for size in [PIECE_UNIT, 1 << 20, MAX_PIECE] {
                    let layout = Layout { count, size };
                    let header = t.header(tag, layout);
                    assert_eq!(
                        header & !t.first_ignores(),
                        tag,
                        "the first receive takes it"
                    );
                    assert_eq!(t.layout_of(header), Some(layout));
                    assert_eq!(t.whole(header), tag);
                    assert!(header & !t.below_id() == tag & !t.below_id(), "same comm");
                }
            }
            for i in 0..MAX_PIECES {
                let piece = t.piece(tag, i);
                assert_ne!(piece & !t.first_ignores(), tag, "no first receive takes it");
                assert_eq!(t.whole(piece), tag);
                let elsewhere = t.with_id(piece, 9);
                assert_eq!(elsewhere, t.piece(t.data(9, 3, seq), i));
                assert_eq!(t.with_id(elsewhere, 5), piece, "only the id changes");
                assert!(seen.insert(piece));
            }
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
