//! Sinks: receives a driver keeps posted for a closed comm, taking in and dropping the
//! messages its peer sent (or sends yet) that no receive of the comm will take.

use super::{Driver, Owned, Owner, Post, Transfer};
use crate::op::{Op, Status};
use crate::sys;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages a closed receiving comm's sink takes in and drops: messages its peer sent (or
/// sends yet) that no receive of the comm will take. Left alone they would stay in the
/// provider (shm keeps large unexpected messages in buffers it shares with every comm
/// between the same two endpoints, and stops moving data when they run out). NCCL keeps at
/// most 32 requests per comm in flight.
pub const SINK_MESSAGES: u32 = 2 * crate::nccl::NET_MAX_REQUESTS as u32;

/// Which messages a sink takes in, and for how long: posting a receive that matches a message
/// left by a connection that died crashes 2.1 tcp;ofi_rxm (`rxm_handle_rx_buf`), so a sink
/// stops as soon as its comm's peer is known gone.
pub struct SinkSpec {
    /// Only from this source, like the comm's receives.
    pub src: sys::fi_addr_t,
    pub tag: u64,
    pub ignore: u64,
    pub alive: Box<dyn Fn() -> bool + Send>,
}

/// A receive that takes in and drops a closed comm's messages.
pub(super) struct Sink {
    pub(super) op: Arc<SinkOp>,
    pub(super) spec: SinkSpec,
    pub(super) left: u32,
    /// When it was last posted; one that took nothing in for [`SINK_LIFETIME`] is cancelled
    /// (a posted receive costs every later match on the endpoint a little).
    pub(super) posted_at: Instant,
    /// Ends at its next completion: cancelled as soon as it is posted (it may still be
    /// waiting to be posted when told).
    pub(super) expiring: bool,
    /// Its cancellation was asked for.
    pub(super) cancelled: bool,
}

/// Sinks one endpoint keeps at most (the oldest is cancelled for a new one).
pub(super) const MAX_SINKS: usize = 32;

/// How long a sink waits for a closed comm's stragglers.
pub(super) const SINK_LIFETIME: Duration =
    Duration::from_millis(if cfg!(test) { 200 } else { 5000 });

#[derive(Default)]
pub(super) struct SinkOp {
    op: Op,
}

impl Owned for SinkOp {
    fn is_sink(&self) -> bool {
        true
    }
}

pub(super) fn is_sink(owner: &Owner) -> bool {
    owner.is_sink()
}

impl Driver {
    /// Leaves a sink for a closed comm's messages still to come.
    pub(super) fn add_sink(&mut self, spec: SinkSpec) {
        // Communicators come and go on a lingering lane: the oldest sinks give way rather
        // than pile up.
        if self.sinks.len() >= MAX_SINKS {
            self.expire_oldest_sink();
        }
        let sink = Sink {
            op: Arc::default(),
            spec,
            left: SINK_MESSAGES,
            posted_at: Instant::now(),
            expiring: false,
            cancelled: false,
        };
        self.post_sink(&sink);
        self.sinks.push(sink);
        self.sink_activity = Instant::now();
    }

    pub(super) fn post_sink(&mut self, sink: &Sink) {
        sink.op.op.mark_queued();
        self.waiting.push_back(Post {
            op: &sink.op.op,
            owner: sink.op.clone(),
            // Nothing of NCCL's: the whole message goes to the overflow area.
            transfer: Transfer::Recv {
                buf: std::ptr::null_mut(),
                len: 0,
                desc: std::ptr::null_mut(),
                src: sink.spec.src,
                tag: sink.spec.tag,
                ignore: sink.spec.ignore,
                overflow: true,
            },
        });
    }

    /// Ends the oldest sink that is not ending already (see [`Sink::expiring`]).
    pub(super) fn expire_oldest_sink(&mut self) {
        if let Some(s) = self
            .sinks
            .iter_mut()
            .filter(|s| !s.expiring)
            .min_by_key(|s| s.posted_at)
        {
            s.expiring = true;
        }
        self.renew_sinks();
    }

    /// Posts again each sink that took in a message, while it has messages left; cancels
    /// one that waited [`SINK_LIFETIME`] for nothing (its cancellation ends it).
    pub(super) fn renew_sinks(&mut self) {
        let mut sinks = std::mem::take(&mut self.sinks);
        sinks.retain_mut(|s| {
            let status = s.op.op.status();
            if !status.finished() {
                s.expiring |= s.posted_at.elapsed() > SINK_LIFETIME;
                if status == Status::Posted && s.expiring && !s.cancelled {
                    s.cancelled = true;
                    let _ = self.queue.cancel(s.op.op.context() as usize);
                }
                return true;
            }
            self.sink_activity = Instant::now();
            s.left -= 1;
            if s.left == 0 || s.expiring || !(s.spec.alive)() {
                return false;
            }
            s.posted_at = Instant::now();
            self.post_sink(s);
            true
        });
        self.sinks = sinks;
    }
}
