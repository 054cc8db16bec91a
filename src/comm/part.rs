//! One buffer of a request: its operations, where they stand, and, for a receive in pieces,
//! how the pieces' receives go out once its header arrived.

use super::posting::span;
use super::{Comm, Direction, MAX_FLOWS};
use crate::driver::{Owned, Post, Transfer};
use crate::op::{Op, Status};
use crate::sys;
use crate::tags::Layout;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// One buffer's operations.
pub(super) struct Part {
    /// The whole message or the header (a receive: over the whole buffer).
    pub(super) op: Op,
    /// The pieces, piece `j` in `pieces[j]` (none on a comm that sends whole messages).
    pub(super) pieces: Box<[Op]>,
    /// Pieces in use (0: a whole message).
    pub(super) used: AtomicUsize,
    /// The flow its first piece travels on (see [`Comm::first_flow`]).
    pub(super) first: AtomicUsize,
    /// A receive's pieces were handed to the drivers (after its header arrived), or never
    /// will be (sealed: the request failed or its comm closed first).
    pub(super) settled: AtomicBool,
    /// Held while settling or sealing: the driver that completed the header and NCCL's
    /// thread may both try (see [`Part::settle_once`]).
    pub(super) settle_lock: Mutex<()>,
    /// Bytes posted (send size or receive buffer size).
    pub(super) posted: AtomicUsize,
    /// Where a receive's pieces go: its buffer, descriptors and kind.
    pub(super) buf: AtomicPtr<c_void>,
    pub(super) descs: [AtomicPtr<c_void>; MAX_FLOWS],
    pub(super) host: AtomicBool,
    /// A profiler's event handle for it (see `exports`), NULL if none.
    pub(super) event: AtomicPtr<c_void>,
}

impl Owned for Comm {
    /// A receive's header arrived: its pieces go to their flows' drivers now, from the
    /// driver's thread, rather than at NCCL's next `test` (a receiver that makes no call
    /// meanwhile would hold the sender's pieces back).
    fn completed(&self, op: &Op) {
        if self.dir != Direction::Recv || self.piece() == 0 || op.status() != Status::Done(0) {
            return;
        }
        let Some(layout) = self.lane().tags.layout_of(op.tag()) else {
            return;
        };
        let part = self
            .requests
            .iter()
            .flat_map(|r| r.parts.iter())
            .find(|p| std::ptr::eq(&p.op, op));
        if let Some(part) = part.filter(|p| layout.count <= p.pieces.len()) {
            part.settle_once(self, layout, false);
        }
    }
}

/// Where one buffer of a request stands.
pub(super) enum Outcome<'a> {
    Busy,
    /// Bytes it holds.
    Done(usize),
    /// This operation failed.
    Failed(&'a Op),
    /// The sender's message, of this many bytes (where known), is longer than the receive.
    Longer(Option<usize>),
    Malformed(String),
}

impl Part {
    /// The operations in use: the first, and the pieces.
    pub(super) fn ops(&self) -> impl Iterator<Item = &Op> {
        let used = self.used.load(Ordering::Relaxed).min(self.pieces.len());
        std::iter::once(&self.op).chain(&self.pieces[..used])
    }

    pub(super) fn all_ops(&self) -> impl Iterator<Item = &Op> {
        std::iter::once(&self.op).chain(self.pieces.iter())
    }

    /// Where a message in pieces stands, for a stall WARN (`None`: not in pieces).
    pub(super) fn progress(&self) -> Option<String> {
        let used = self.used.load(Ordering::Relaxed).min(self.pieces.len());
        if used == 0 {
            return None;
        }
        let state = |o: &Op| match o.status() {
            Status::Idle => 'i',
            Status::Queued => 'q',
            Status::Posted => 'p',
            Status::Done(_) => 'd',
            Status::Failed => 'f',
        };
        let pieces: String = self.pieces[..used].iter().map(state).collect();
        Some(format!(
            " (header {}, pieces {pieces}: d done, p with the provider, q queued)",
            state(&self.op)
        ))
    }

    /// The first piece of it not finished while another is, if any.
    pub(super) fn straggler(&self) -> Option<usize> {
        let used = self.used.load(Ordering::Relaxed).min(self.pieces.len());
        let pieces = &self.pieces[..used];
        let finished = |o: &Op| o.status().finished();
        match pieces.iter().any(finished) {
            true => pieces.iter().position(|o| !finished(o)),
            false => None,
        }
    }

    /// How a received message is cut, from the tag its first part arrived with (`None`: a
    /// whole message, or a comm that takes whole messages only).
    pub(super) fn layout(&self, comm: &Comm) -> Option<Layout> {
        match (comm.piece(), comm.dir) {
            (0, _) | (_, Direction::Send) => None,
            _ => comm.lane().tags.layout_of(self.op.tag()),
        }
    }

    pub(super) fn outcome(&self, comm: &Comm) -> Outcome<'_> {
        let failed = |o: &&Op| o.status() == Status::Failed;
        if comm.dir == Direction::Send {
            if let Some(op) = self.ops().find(failed) {
                return Outcome::Failed(op);
            }
            if !self.ops().all(|o| o.status().finished()) {
                return Outcome::Busy;
            }
            return Outcome::Done(self.posted.load(Ordering::Relaxed));
        }
        let header = match self.op.status() {
            Status::Done(len) => len,
            Status::Failed => return Outcome::Failed(&self.op),
            _ => return Outcome::Busy,
        };
        let Some(layout) = self.layout(comm) else {
            return Outcome::Done(header);
        };
        if header != 0 {
            return Outcome::Malformed(format!("its header carries {header} bytes"));
        }
        if layout.count > self.pieces.len() {
            return Outcome::Malformed(format!(
                "its header names {} pieces; this comm takes {} at most",
                layout.count,
                self.pieces.len()
            ));
        }
        self.settle_once(comm, layout, false);
        if !self.ops().all(|o| o.status().finished()) {
            return Outcome::Busy;
        }
        let posted = self.posted.load(Ordering::Relaxed);
        // What arrived, what was sent (`None` once a piece's size is unknown: a last piece
        // past the buffer's end that the provider reported without its length), and whether
        // the message was longer than the buffer.
        let (mut got, mut sent, mut longer) = (0, Some(0), false);
        for (j, op) in self.pieces[..layout.count].iter().enumerate() {
            let room = span(posted, layout, j).1;
            let last = j + 1 == layout.count;
            // Every piece but the last is of the layout's size.
            let nominal = (!last).then_some(layout.size);
            match op.status() {
                Status::Done(len)
                    if (!last && len == layout.size)
                        || (last && len >= 1 && len <= layout.size) =>
                {
                    got += len;
                    sent = sent.map(|s| s + len);
                }
                // Cut short at the buffer's end, where the provider reports a receive that
                // overflowed complete with its buffer's length (quirks: truncation unseen).
                Status::Done(len) if len == room && nominal.map_or(true, |n| room < n) => {
                    longer = true;
                    sent = sent.zip(nominal).map(|(s, n)| s + n);
                }
                Status::Done(len) => {
                    return Outcome::Malformed(format!(
                        "piece {j} of {} has {len} bytes, not the {} its header named",
                        layout.count, layout.size
                    ));
                }
                _ => match op.failure() {
                    Some(f) if f.err.unsigned_abs() == sys::FI_ETRUNC => {
                        longer = true;
                        sent = sent.map(|s| s + room + f.olen);
                    }
                    _ => return Outcome::Failed(op),
                },
            }
        }
        match longer {
            true => Outcome::Longer(sent),
            false => Outcome::Done(got),
        }
    }

    /// Once its header arrived: hands each piece's receive to the driver of the flow it
    /// travels on, at its offset in the buffer, or (`drain`, or past the buffer's end) as an
    /// empty receive into the overflow area; once per request. (An error here is the
    /// endpoint's, which the next `test` reports.)
    ///
    /// The driver whose endpoint completed the header calls it at once (see `Owned for
    /// Comm`), so the pieces move whether or not NCCL calls `test` meanwhile; `test` calls it
    /// too, and the first one settles.
    pub(super) fn settle_once(&self, comm: &Comm, layout: Layout, drain: bool) {
        let _settling = self.settle_lock.lock();
        // A header naming more pieces than the comm takes is malformed (see `outcome`): it
        // is sealed, no piece of it received.
        if self.settled.swap(true, Ordering::AcqRel) || layout.count > self.pieces.len() {
            return;
        }
        let Some(owner) = comm.owner() else {
            return;
        };
        let posted = self.posted.load(Ordering::Relaxed);
        let base = comm.lane().tags.whole(self.op.tag());
        let data = self.buf.load(Ordering::Relaxed);
        let host = self.host.load(Ordering::Relaxed);
        let first = comm.first_flow(comm.lane().tags.seq_of(self.op.tag()), layout.count);
        self.first.store(first, Ordering::Relaxed);
        self.used.store(layout.count, Ordering::Relaxed);
        for (j, op) in self.pieces[..layout.count].iter().enumerate() {
            let k = comm.wire_of(first, j);
            let wire = &comm.wires[k];
            let (off, room) = span(posted, layout, j);
            let (buf, len, desc, overflow) = match drain || room == 0 {
                true => (std::ptr::null_mut(), 0, std::ptr::null_mut(), true),
                // SAFETY: `off` lies within the buffer (room > 0).
                false => (
                    unsafe { data.cast::<u8>().add(off) }.cast(),
                    room,
                    self.descs[k].load(Ordering::Relaxed),
                    host,
                ),
            };
            op.mark_queued();
            let _ = wire.lane.enqueue(Post {
                op,
                owner: owner.clone(),
                transfer: Transfer::Recv {
                    buf,
                    len,
                    desc,
                    src: wire.source(),
                    tag: wire
                        .lane
                        .tags
                        .piece(wire.lane.tags.with_id(base, wire.id), j),
                    ignore: 0,
                    overflow,
                },
            });
        }
    }

    /// No piece of it is handed to the drivers from now on (its request failed, or its comm
    /// closed): a header that arrives later leaves its pieces to the sinks.
    pub(super) fn seal(&self) {
        let _settling = self.settle_lock.lock();
        self.settled.store(true, Ordering::Release);
    }

    /// A failed receive gives up its pieces (no message will fill them now).
    pub(super) fn let_go(&self, comm: &Comm) {
        if comm.dir == Direction::Recv {
            for (j, op) in self.ops().skip(1).enumerate() {
                if !op.status().finished() {
                    let k = comm.wire_of(self.first.load(Ordering::Relaxed), j);
                    let _ = comm.wires[k].lane.cancel(op);
                }
            }
        }
    }
}
