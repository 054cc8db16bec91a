//! A driver's posting: what waits goes to the provider oldest first, a destination that
//! answers EAGAIN held back for the rest of the round; an NCCL call's post goes straight to
//! the provider where nothing else waits.

use super::{Driver, InFlight, Post, Transfer};
use crate::error::{Error, Result};
use crate::sys;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::c_void;

impl Driver {
    /// Posts what waits, oldest first. A destination (or the receive side) that answers
    /// EAGAIN is skipped for the rest of the round, so one full peer does not hold back the
    /// others.
    pub(super) fn post_waiting(&mut self) -> usize {
        if self.waiting.is_empty() {
            return 0;
        }
        let mut posted = 0;
        let mut blocked_dests: Vec<sys::fi_addr_t> = Vec::new();
        let mut receives_blocked = false;
        let mut kept = VecDeque::new();
        while let Some(p) = self.waiting.pop_front() {
            let blocked = match &p.transfer {
                Transfer::Send { dest, .. } => blocked_dests.contains(dest),
                Transfer::Recv { .. } => receives_blocked,
            };
            if blocked {
                kept.push_back(p);
                continue;
            }
            match self.hand_over(p) {
                Some(p) => {
                    match &p.transfer {
                        Transfer::Send { dest, .. } => blocked_dests.push(*dest),
                        Transfer::Recv { .. } => receives_blocked = true,
                    }
                    kept.push_back(p);
                }
                None => posted += 1,
            }
        }
        self.waiting = kept;
        posted
    }

    /// Posts one operation now, on behalf of an NCCL call (lanes driven by NCCL's calls).
    /// What others handed in goes first (posting order is matching order); with nothing
    /// handed in the post goes straight to the provider and completions wait for the next
    /// turn (NCCL's `test` drives one). If the provider says EAGAIN, a turn of progress and
    /// one more try; then the operation comes back, so NCCL calls again as it does for any
    /// "not now".
    pub fn post_now(&mut self, p: Post) -> Result<Option<Post>> {
        if !self.inbox.is_empty() || !self.waiting.is_empty() {
            self.turn()?;
        } else if let Some(e) = self.health.broken() {
            return Err(Error::Remote(e.to_string()));
        }
        match self.hand_over(p) {
            None => Ok(None),
            Some(p) => {
                self.turn()?;
                Ok(self.hand_over(p))
            }
        }
    }

    /// Posts one operation now on behalf of an NCCL call, on a lane that a progress thread
    /// drives: straight to the provider when nothing handed in before it waits (posting
    /// order is matching order), else behind what waits. Its completion, and a post the
    /// provider refuses for now, are the thread's (which [`Health`](super::Health) tells
    /// that the lane has work).
    ///
    /// A sibling endpoint's turn in progress where endpoints take turns
    /// (`quirks::serial_progress`) sends the post to the inbox too: the call waits for
    /// nobody.
    pub fn post_inline(&mut self, p: Post) -> Result<()> {
        self.health.check()?;
        let serial = self.queue.serial();
        let turn = serial.as_deref().map(Mutex::try_lock);
        if matches!(turn, Some(None)) || !self.inbox.is_empty() || !self.waiting.is_empty() {
            self.inbox.push(super::Command::Post(p));
            return Ok(());
        }
        match self.hand_over(p) {
            Some(p) => self.waiting.push_back(p),
            None => {
                self.by_calls.total += 1;
                self.by_calls.unseen += 1;
            }
        }
        self.tell_in_flight();
        Ok(())
    }

    /// Hands one operation to the provider. `Some(p)` back: it said EAGAIN. A refused
    /// operation is failed with the provider's error (its owner hears it from `test`).
    fn hand_over(&mut self, p: Post) -> Option<Post> {
        match self.post(&p) {
            Ok(Some(capacity)) => {
                // SAFETY: as in take_commands.
                let op = unsafe { &*p.op };
                op.mark_posted();
                self.in_flight.insert(
                    op.context() as usize,
                    InFlight {
                        op: p.op,
                        owner: p.owner,
                        posted: capacity,
                        transfer: p.transfer,
                    },
                );
                None
            }
            Ok(None) => Some(p),
            Err(e) => {
                let code = match &e {
                    Error::Fabric { code, .. } => *code,
                    _ => libc::EIO,
                };
                // SAFETY: as in take_commands.
                unsafe { &*p.op }.fail_with(code, 0, e.to_string());
                None
            }
        }
    }

    /// Hands one operation to the provider: `Ok(Some(posted))` when taken (`posted`: NCCL's
    /// bytes of a receive), `Ok(None)` for EAGAIN.
    fn post(&mut self, p: &Post) -> Result<Option<Option<usize>>> {
        // SAFETY: the op lives in its owner, held by `p`.
        let ctx = unsafe { &*p.op }.context();
        match p.transfer {
            Transfer::Send {
                buf,
                len,
                desc,
                dest,
                tag,
            } => {
                // SAFETY: the owner keeps buffer, descriptor and op alive until completion
                // (or until the queue is closed, which happens before the owner is dropped).
                let taken = unsafe { self.queue.send(buf, len, desc, dest, tag, ctx)? };
                Ok(taken.then_some(None))
            }
            Transfer::Recv {
                buf,
                len,
                desc,
                src,
                tag,
                ignore,
                overflow,
            } => {
                let ep = self.queue.endpoint();
                let overflow = (ep.overflow.is_some() && overflow)
                    .then(|| crate::overflow::for_receive(len, ep.max_msg_size))
                    .flatten();
                let mut iov = [
                    libc::iovec {
                        iov_base: buf,
                        iov_len: len,
                    },
                    libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    },
                ];
                let area_desc = ep.overflow.unwrap_or(0) as *mut c_void;
                let mut descs = [desc, area_desc];
                let pieces = match overflow {
                    // Nothing of NCCL's (a sink): the area alone, not after an empty piece
                    // (shm 1.17's segmented copies stall on a receive that starts with one).
                    Some((area, room)) if len == 0 => {
                        iov[0] = libc::iovec {
                            iov_base: area.cast(),
                            iov_len: room,
                        };
                        descs[0] = area_desc;
                        1
                    }
                    Some((area, room)) => {
                        iov[1] = libc::iovec {
                            iov_base: area.cast(),
                            iov_len: room,
                        };
                        2
                    }
                    None => 1,
                };
                // SAFETY: as for sends; the overflow area is mapped for the process's life.
                let taken = unsafe {
                    self.queue
                        .recv(&iov[..pieces], &mut descs[..pieces], src, tag, ignore, ctx)?
                };
                Ok(taken.then_some(Some(len)))
            }
        }
    }
}
