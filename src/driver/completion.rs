//! A driver's reading of its completion queue: each completion recorded in its operation,
//! messages from strangers dropped, errors without an operation counted and reported.

use super::{Driver, InFlight, Post, Transfer};
use crate::endpoint::{Event, Failure};
use crate::error::Result;
use crate::sys;
use std::sync::atomic::Ordering;

/// Completion batches read per turn before returning.
const POLL_ROUNDS: usize = 8;

impl Driver {
    pub(super) fn read_completions(&mut self) -> Result<usize> {
        let mut total = 0;
        for _ in 0..POLL_ROUNDS {
            let mut events = std::mem::take(&mut self.events);
            events.clear();
            let n = self.queue.poll(&mut events)?;
            for e in events.drain(..) {
                self.settle(e);
            }
            self.events = events;
            total += n;
            if n < crate::endpoint::CQ_BATCH {
                break;
            }
        }
        Ok(total)
    }

    /// Records one completion in its operation, and lets go of the operation's owner.
    pub(super) fn settle(&mut self, e: Event) {
        let context = match &e {
            Event::Done { context, .. } => *context,
            Event::Failed(f) => f.context,
        };
        if context.is_null() {
            if let Event::Failed(f) = &e {
                self.stray_error(f);
            }
            return;
        }
        let Some(entry) = self.in_flight.remove(&(context as usize)) else {
            tracing::warn!(
                "{}: the provider completed an operation this endpoint did not post \
                 (context {context:p}); ignored",
                self.label
            );
            return;
        };
        // SAFETY: the op lives in `entry.owner`, which is dropped only after this.
        let op = unsafe { &*entry.op };
        if let (
            Event::Done {
                len,
                src: Some(src),
                ..
            },
            Transfer::Recv { src: from, .. },
        ) = (&e, entry.transfer)
        {
            if from != sys::ADDR_UNSPEC && *src != from {
                return self.drop_strangers_message(entry, *len, *src);
            }
        }
        match e {
            Event::Done { len, tag, .. } => match entry.posted {
                Some(posted) if len > posted => {
                    crate::overflow::release(len - posted);
                    op.fail_tagged(
                        sys::FI_ETRUNC as i32,
                        len - posted,
                        tag,
                        "message longer than the receive".into(),
                    );
                }
                _ => op.complete(len, tag),
            },
            Event::Failed(f) => op.fail(f),
        }
        entry.owner.completed(op);
        drop(entry.owner);
    }

    /// A receive bound to its peer took a message from someone else (a provider that does
    /// not enforce `FI_DIRECTED_RECV` for senders missing from the address vector, like
    /// libfabric 1.17 shm): the message is dropped and the receive posted again, unseen by
    /// NCCL, whose buffer the real message then fills.
    fn drop_strangers_message(&mut self, entry: InFlight, len: usize, src: sys::fi_addr_t) {
        if let Some(posted) = entry.posted.filter(|&p| len > p) {
            crate::overflow::release(len - posted);
        }
        if let Some(held) = self.strangers.allow() {
            tracing::warn!(
                "{}: dropped a message of {len} bytes from an endpoint that is not the comm's \
                 peer (fi_addr {src:#x}){}; the receive waits for its peer. Something other \
                 than this job's ranks is sending here: see docs/faults.md, Security model",
                self.label,
                match held {
                    0 => String::new(),
                    n => format!(" ({n} more since the last warning)"),
                }
            );
        }
        // SAFETY: as in settle: the op lives in its owner, which stays with the post.
        unsafe { &*entry.op }.mark_queued();
        self.waiting.push_front(Post {
            op: entry.op,
            owner: entry.owner,
            transfer: entry.transfer,
        });
    }

    /// An error entry the provider wrote without an operation: an error of the endpoint
    /// itself (rxm writes these when a connection fails, shm when a peer's remote access
    /// fails). It cannot be tied to a comm; users are told to check their peers now.
    fn stray_error(&mut self, f: &Failure) {
        let n = self.health.stray_errors.fetch_add(1, Ordering::AcqRel);
        if n.is_power_of_two() || n == 0 {
            tracing::warn!(
                "{}: the provider reported an error not tied to any operation: {} (err {}, \
                 provider err {}); comms waiting on this endpoint check their peers now \
                 ({} such error(s) so far)",
                self.label,
                if f.text.is_empty() {
                    crate::error::fi_strerror(f.err.abs())
                } else {
                    f.text.clone()
                },
                f.err,
                f.prov_errno,
                n + 1
            );
        }
    }
}
