//! Posting a comm's sends and receives: how a message is cut into pieces, the buffers NCCL
//! passes with their descriptors, and the registrations a comm makes itself or keeps while
//! it lives.

use super::{first_seen, Comm, Direction, Request, MAX_FLOWS, MAX_RECVS};
use crate::control::now_ms;
use crate::driver::{Owner, Post, Transfer};
use crate::error::{Error, Result};
use crate::lane::Lane;
use crate::op::{Op, Status};
use crate::opaque::request;
use crate::tags::{Layout, MAX_PIECE, MAX_PIECES, PIECE_UNIT};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A registration's descriptor per flow of its comm (see [`Wire`](super::Wire)).
pub type Descs = [*mut c_void; MAX_FLOWS];

/// No registration.
pub const NO_DESCS: Descs = [std::ptr::null_mut(); MAX_FLOWS];

/// One buffer of a send or (grouped) receive, as NCCL passes it.
#[derive(Debug, Clone, Copy)]
pub struct Buffer {
    pub data: *mut c_void,
    pub len: usize,
    /// The registration's descriptor on each of the comm's flows, or NULLs.
    pub descs: Descs,
    /// For a send on a comm whose domains claim `FI_MR_LOCAL`: its registration (see
    /// [`Registered`]), read only while the send is posted.
    pub starts: Option<*const dyn Registered>,
    /// Host memory (a receive into GPU memory gets no overflow area: providers may take
    /// every piece of a receive to be of the first piece's kind).
    pub host: bool,
    /// NCCL's tag: which send a buffer of a grouped receive takes.
    pub tag: i32,
}

/// A registration as a comm on domains that claim `FI_MR_LOCAL` uses it (see
/// `quirks::claim_local_mr`). rxm over tcp, trusted with the plugin's descriptors, tells the
/// peer to read a long message from offset 0 of the registration its descriptor names (tcp's
/// registrations take offsets, not addresses), so a send that does not begin where its
/// registration begins needs one that does; and the peer may still read a send after NCCL
/// closed the comm and deregistered the buffer, so the comm keeps what its sends used until
/// the provider has let go of them.
pub trait Registered: Send + Sync {
    /// The descriptor on each of the comm's flows.
    fn descs(&self) -> Descs;
    /// The descriptor, on flow `flow`, of a registration that begins at `addr` (inside this
    /// one) and reaches to its end.
    fn desc_at(&self, flow: usize, addr: *mut c_void) -> Result<*mut c_void>;
    /// What keeps its registrations open (not its lanes: that ends with deregistration).
    fn keep(&self) -> Keep;
}

/// How a message of `len` bytes is cut on a comm whose smallest piece is `piece` (0: whole
/// messages) and that cuts into `most` pieces at most: `None` for a whole message. Every
/// piece but the last is of one power-of-two size, at least `piece` and large enough that
/// `most` pieces hold the message; the last takes the rest.
pub fn cut(len: usize, piece: usize, most: usize) -> Option<Layout> {
    if piece == 0 || most < 2 || len <= piece {
        return None;
    }
    let size = piece
        .max(len.div_ceil(most))
        .max(PIECE_UNIT)
        .checked_next_power_of_two()?
        .min(MAX_PIECE);
    let count = len.div_ceil(size);
    (2..=MAX_PIECES.min(most))
        .contains(&count)
        .then_some(Layout { count, size })
}

/// A registration a comm made itself: address, length, the registration.
pub(super) type Adhoc = (usize, usize, Arc<dyn Registered>);

/// Something a comm keeps while it lives (a registration of a layer above).
pub type Keep = Arc<dyn std::any::Any + Send + Sync>;

/// Most buffers a comm registers itself for posts without an mhandle.
pub const MAX_ADHOC: usize = 1024;

/// Offset and length of piece `j` of a message of `len` bytes cut as `layout`.
pub(super) fn span(len: usize, layout: Layout, j: usize) -> (usize, usize) {
    let off = j * layout.size;
    (off, layout.size.min(len.saturating_sub(off)))
}

impl Comm {
    /// Whether its buffers need descriptors the caller may not have given: its domains
    /// claim `FI_MR_LOCAL` (see `quirks::claim_local_mr`).
    pub fn needs_descs(&self) -> bool {
        self.needs_descs
    }

    /// The registration this comm made itself of `len` bytes at `data`, made now by
    /// `register` if there is none (at most [`MAX_ADHOC`]).
    pub fn adhoc(
        &self,
        data: usize,
        len: usize,
        register: impl FnOnce() -> Result<Arc<dyn Registered>>,
    ) -> Result<Arc<dyn Registered>> {
        let mut adhoc = self.adhoc.lock();
        if let Some((_, _, r)) = adhoc.iter().find(|(d, l, _)| (*d, *l) == (data, len)) {
            return Ok(r.clone());
        }
        if adhoc.len() >= MAX_ADHOC {
            return Err(Error::InvalidArgument(format!(
                "{MAX_ADHOC} buffers posted without an mhandle on this comm: register buffers \
                 with regMr and pass their mhandles"
            )));
        }
        let r = register()?;
        adhoc.push((data, len, r.clone()));
        Ok(r)
    }

    /// Keeps a registration a send used while this comm lives (once each).
    pub(super) fn keep(&self, r: Keep) {
        let mut kept = self.kept.lock();
        let same = |k: &Keep| std::ptr::addr_eq(Arc::as_ptr(k), Arc::as_ptr(&r));
        if !kept.iter().any(same) {
            kept.push(r);
        }
    }

    /// A free request slot: not held by NCCL, and none of its operations in the
    /// provider's hands (those of a failed request finish after it was reported).
    fn claim(&self) -> Option<&Request> {
        let r = self.requests.iter().find(|r| {
            // NCCL's own first: a comm streaming holds most of its slots, each of many
            // operations (a part per grouped buffer, a piece per flow).
            // (Acquire: what its last post and `release` wrote, `n` among it, is seen.)
            if r.held.load(Ordering::Acquire) {
                return false;
            }
            let busy = |o: &Op| matches!(o.status(), Status::Queued | Status::Posted);
            if r.parts_in_use().iter().any(|p| p.all_ops().any(busy)) {
                return false;
            }
            r.held
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        for p in r.parts_in_use() {
            p.all_ops().for_each(Op::reset);
        }
        Some(r)
    }

    /// Posts a send (one buffer) or a receive (one buffer, or several grouped: each takes
    /// the send with its NCCL tag). `Ok(None)`: all request slots are taken, or the provider
    /// refused for now; NCCL calls again. Once the first operation is taken the others (a
    /// send's pieces, a grouped receive's further buffers) are handed to the drivers, which
    /// post them on their next turn.
    ///
    /// # Safety
    /// Each buffer must be valid for its length (readable for a send, writable for a
    /// receive) until `test` reports the request done, and its `descs` NULLs or the
    /// descriptors of a registration made on this comm (one per flow).
    pub unsafe fn post(self: &Arc<Self>, bufs: &[Buffer]) -> Result<Option<*mut c_void>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("the comm is closed".into()));
        }
        let most = self.requests[0].parts.len();
        if bufs.is_empty() || bufs.len() > most {
            return Err(Error::InvalidArgument(format!(
                "a {} of {} buffers; this comm takes 1 to {most} (maxRecvs)",
                self.what(),
                bufs.len()
            )));
        }
        if let Some(why) = self.peer.liveness.dead() {
            return Err(self.peer_lost(why));
        }
        self.health_check()?;
        let Some(req) = self.claim() else {
            return Ok(None);
        };
        let generation = req
            .generation
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1);
        let mut seqs = self.next_seq.lock();
        // Each buffer's NCCL tag and sequence number, and the last sequence number each NCCL
        // tag would use (no allocation: this runs for every send and receive).
        let mut keys = [(0u64, 0u64); MAX_RECVS];
        let mut taken = [(0u64, 0u64); MAX_RECVS];
        let mut distinct = 0;
        for (i, b) in bufs.iter().enumerate() {
            let key = self.lane().tags.nccl_tag(b.tag);
            let seq = match taken[..distinct].iter_mut().find(|(k, _)| *k == key) {
                Some((_, s)) => {
                    *s += 1;
                    *s
                }
                None => {
                    let s = seqs.get(&key).copied().unwrap_or(0);
                    taken[distinct] = (key, s);
                    distinct += 1;
                    s
                }
            };
            keys[i] = (key, seq);
        }
        let owner = self.clone() as Owner;
        let first = self.wires.first().expect("a comm has a flow");
        // How this send is cut, read once: the header and the pieces must agree.
        let piece = match self.dir {
            Direction::Send => self.pace.piece(),
            Direction::Recv => self.piece(),
        };
        // The first operation of buffer `i`: a whole message or header for a send, the
        // receive over the whole buffer for a receive.
        let first_of = |i: usize, whole_desc: &dyn Fn(&Buffer) -> *mut c_void| {
            let (b, part) = (&bufs[i], &req.parts[i]);
            let (key, seq) = keys[i];
            let tag = first.tag(key, seq);
            let transfer = match self.dir {
                Direction::Send => match cut(b.len, piece, self.most) {
                    None => Transfer::Send {
                        buf: b.data,
                        len: b.len,
                        desc: whole_desc(b),
                        dest: first.addr,
                        tag,
                    },
                    Some(layout) => Transfer::Send {
                        buf: b.data,
                        len: 0,
                        desc: b.descs[0],
                        dest: first.addr,
                        tag: first.lane.tags.header(tag, layout),
                    },
                },
                Direction::Recv => Transfer::Recv {
                    buf: b.data,
                    len: b.len,
                    desc: b.descs[0],
                    src: first.source(),
                    tag,
                    ignore: match self.piece() {
                        0 => 0,
                        _ => first.lane.tags.first_ignores(),
                    },
                    overflow: b.host,
                },
            };
            Post {
                op: &part.op,
                owner: owner.clone(),
                transfer,
            }
        };
        req.n.store(bufs.len(), Ordering::Relaxed);
        req.posted_at_ms.store(now_ms(), Ordering::Relaxed);
        req.posted_at
            .store(crate::times::stamp(), Ordering::Relaxed);
        req.stall_reported.store(false, Ordering::Relaxed);
        req.straggling_since.store(0, Ordering::Relaxed);
        // Every operation is marked queued before the first can complete (claim() looks at
        // all).
        let mut layouts = [None; MAX_RECVS];
        for (i, (b, part)) in bufs.iter().zip(req.parts.iter()).enumerate() {
            part.posted.store(b.len, Ordering::Relaxed);
            part.settled.store(false, Ordering::Relaxed);
            part.buf.store(b.data, Ordering::Relaxed);
            for (d, &desc) in part.descs.iter().zip(&b.descs) {
                d.store(desc, Ordering::Relaxed);
            }
            part.host.store(b.host, Ordering::Relaxed);
            part.op.mark_queued();
            let layout = match self.dir {
                Direction::Send => cut(b.len, piece, self.most),
                Direction::Recv => None,
            };
            let count = layout.map_or(0, |l| l.count);
            part.used.store(count, Ordering::Relaxed);
            part.first
                .store(self.first_flow(keys[i].1, count), Ordering::Relaxed);
            part.pieces[..count].iter().for_each(Op::mark_queued);
            layouts[i] = layout;
        }
        let (paced, whole) = match self.dir {
            Direction::Send => self
                .pace
                .times(bufs[0].len, layouts[0].map(|l| l.size))
                .unwrap_or((0, false)),
            Direction::Recv => (0, false),
        };
        req.paced.store(paced, Ordering::Relaxed);
        req.paced_whole.store(whole, Ordering::Relaxed);
        if paced > 0 {
            req.paced_len.store(bufs[0].len, Ordering::Relaxed);
            req.posted_at_us
                .store(crate::pace::now_us(), Ordering::Relaxed);
        }
        // A send's descriptors: of registrations beginning where the message and each of
        // its pieces begin, where the comm's domains need that (see `Registered`).
        let mut send_descs = [std::ptr::null_mut(); MAX_PIECES + 1];
        if let (Direction::Send, Some(starts)) = (self.dir, bufs[0].starts) {
            let (b, part) = (&bufs[0], &req.parts[0]);
            let start = part.first.load(Ordering::Relaxed);
            // SAFETY: per the caller, `starts` is the buffer's registration, alive while it
            // is posted.
            let starts = unsafe { &*starts };
            self.keep(starts.keep());
            let found = match layouts[0] {
                None => starts.desc_at(0, b.data).map(|d| send_descs[0] = d),
                Some(layout) => (0..layout.count).try_for_each(|j| {
                    let (off, _) = span(b.len, layout, j);
                    // SAFETY: `off` lies within the buffer (see `span`).
                    let at = unsafe { b.data.cast::<u8>().add(off) }.cast();
                    send_descs[j + 1] = starts.desc_at(self.wire_of(start, j), at)?;
                    Ok(())
                }),
            };
            if let Err(e) = found {
                req.withdraw();
                return Err(e);
            }
        }
        let whole_desc = |b: &Buffer| match b.starts {
            Some(_) => send_descs[0],
            None => b.descs[0],
        };
        match self.lane().submit(first_of(0, &whole_desc)) {
            Ok(None) => {
                for &(key, last) in &taken[..distinct] {
                    seqs.insert(key, last.wrapping_add(1));
                }
                // The request is NCCL's now: an endpoint that failed meanwhile is reported
                // by its `test`, which then gives the slot back.
                let hand = |lane: &Lane, post: Post| {
                    if let Err(e) = lane.enqueue(post) {
                        tracing::debug!("an operation handed to a failed endpoint: {e}");
                    }
                };
                for i in 1..bufs.len() {
                    hand(self.lane(), first_of(i, &whole_desc));
                }
                if let (Some(layout), Direction::Send) = (layouts[0], self.dir) {
                    let (b, part) = (&bufs[0], &req.parts[0]);
                    let (key, seq) = keys[0];
                    let start = part.first.load(Ordering::Relaxed);
                    for j in 0..layout.count {
                        let k = self.wire_of(start, j);
                        let wire = &self.wires[k];
                        let (off, len) = span(b.len, layout, j);
                        hand(
                            &wire.lane,
                            Post {
                                op: &part.pieces[j],
                                owner: owner.clone(),
                                transfer: Transfer::Send {
                                    // SAFETY: `off` lies within the buffer (see `span`).
                                    buf: unsafe { b.data.cast::<u8>().add(off) }.cast(),
                                    len,
                                    desc: match b.starts {
                                        Some(_) => send_descs[j + 1],
                                        None => b.descs[k],
                                    },
                                    dest: wire.addr,
                                    tag: wire.lane.tags.piece(wire.tag(key, seq), j),
                                },
                            },
                        );
                    }
                }
                self.refused_since.store(0, Ordering::Relaxed);
                Ok(Some(request::pack(req, generation)))
            }
            Ok(Some(_not_now)) => {
                // The provider said EAGAIN: NCCL calls again with the same buffers. What
                // the provider waits for may be progress on another lane (shm connects to a
                // peer of this process only once that peer's endpoint progresses), or a peer
                // that died with its queues full.
                req.withdraw();
                drop(seqs);
                self.lane().drive_neighbours();
                let now = now_ms();
                let since = first_seen(&self.refused_since, now);
                self.check_peer(Duration::from_millis(now - since))?;
                Ok(None)
            }
            Err(e) => {
                req.withdraw();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_into_a_piece_per_flow_of_a_power_of_two() {
        let k = 1 << 10;
        // Whole: no pieces agreed, one piece's worth, or too short.
        assert_eq!(cut(8 << 20, 0, 16), None);
        assert_eq!(cut(256 * k, 256 * k, 16), None);
        assert_eq!(cut(8 << 20, 256 * k, 1), None);
        // 8 MiB over 16 flows: 16 pieces of 512 KiB.
        assert_eq!(
            cut(8 << 20, 256 * k, 16),
            Some(Layout {
                count: 16,
                size: 512 * k
            })
        );
        // 1 MiB: never below the smallest piece.
        assert_eq!(
            cut(1 << 20, 256 * k, 16),
            Some(Layout {
                count: 4,
                size: 256 * k
            })
        );
        // 5 MiB: 10 pieces of 512 KiB (a power of two holding a sixteenth).
        assert_eq!(
            cut(5 << 20, 256 * k, 16),
            Some(Layout {
                count: 10,
                size: 512 * k
            })
        );
        // One byte over the smallest piece: two pieces.
        assert_eq!(
            cut(256 * k + 1, 256 * k, 16),
            Some(Layout {
                count: 2,
                size: 256 * k
            })
        );
        // A smallest piece that is no power of two rounds up.
        assert_eq!(
            cut(1 << 20, 300 * k, 4),
            Some(Layout {
                count: 2,
                size: 512 * k
            })
        );
        // Past what 32 of the largest pieces hold: whole.
        assert_eq!(cut(3 << 40, 256 * k, 32), None);
        assert_eq!(
            cut(4 << 30, 256 * k, 32),
            Some(Layout {
                count: 32,
                size: MAX_PIECE
            })
        );
        for len in [4097, 65_537, 1 << 20, (1 << 30) + 3, 3 << 32] {
            for most in [2, 4, 7, 16, 32] {
                for piece in [4096, 65_536, 1 << 20] {
                    let Some(l) = cut(len, piece, most) else {
                        assert!(
                            len <= piece || len > MAX_PIECE * most,
                            "{len} {piece} {most}"
                        );
                        continue;
                    };
                    assert!(l.size.is_power_of_two() && l.size >= piece);
                    assert!((2..=most).contains(&l.count), "{l:?}");
                    assert!(l.size * (l.count - 1) < len && len <= l.size * l.count);
                }
            }
        }
    }

    #[test]
    fn pieces_span_the_message_and_stop_at_the_buffer_end() {
        let l = Layout {
            count: 3,
            size: 4096,
        };
        assert_eq!(span(10_000, l, 0), (0, 4096));
        assert_eq!(span(10_000, l, 2), (8192, 10_000 - 8192));
        // A buffer shorter than the message: the piece past its end has no room.
        assert_eq!(span(5000, l, 1), (4096, 904));
        assert_eq!(span(5000, l, 2), (8192, 0));
    }
}
