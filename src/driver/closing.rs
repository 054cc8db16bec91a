//! A driver winding down: an endpoint nobody uses any more cancels what is left (sinks last)
//! and closes once nothing is posted, keeping the owners of whatever the provider still
//! holds alive until the endpoint is closed.

use super::sinks::is_sink;
use super::Driver;
use crate::endpoint::Retired;
use std::sync::Weak;
use std::time::Duration;

impl Driver {
    /// Nothing at all in the provider's hands or waiting for it.
    pub fn empty(&self) -> bool {
        self.inbox.is_empty() && self.waiting.is_empty() && self.in_flight.is_empty()
    }

    /// One round for an endpoint nobody uses any more: once only sinks are left and they have
    /// taken nothing in for `quiet`, they are cancelled too. Returns whether the endpoint is
    /// [`Driver::empty`], so it can close (2.1 tcp;ofi_rxm cannot close the domain of an
    /// endpoint closed with operations still posted).
    pub fn wind_down(&mut self, quiet: Duration) -> bool {
        let _ = self.turn();
        if !self.sinks.is_empty() && self.idle() && self.sink_activity.elapsed() >= quiet {
            self.cancel_all(true);
            let _ = self.turn();
        }
        self.empty()
    }

    /// Cancels what is still in flight or waiting (its owners are gone): all of it, or all
    /// but the sinks, which go on taking in stragglers, so that a peer's sends to closed
    /// comms finish rather than being dropped with the endpoint (2.1 tcp;ofi_rxm cannot
    /// close a domain whose endpoint closed with unfinished sends).
    pub fn cancel_all(&mut self, sinks_too: bool) {
        if sinks_too {
            self.sinks.clear();
        }
        let contexts: Vec<usize> = self
            .in_flight
            .iter()
            .filter(|(_, f)| sinks_too || !is_sink(&f.owner))
            .map(|(&c, _)| c)
            .collect();
        for c in contexts {
            let _ = self.queue.cancel(c);
        }
        self.waiting.retain(|p| {
            if !sinks_too && is_sink(&p.owner) {
                return true;
            }
            // SAFETY: as in take_commands.
            unsafe { &*p.op }.fail_with(libc::ECANCELED, 0, "endpoint closed".into());
            false
        });
    }

    /// Closes the endpoint (or, for a sender whose receiver in this process is still open,
    /// leaves it to that receiver to close after itself), then lets go of the owners of
    /// whatever was still in flight.
    pub fn finish(mut self) {
        if self.by_calls.total > 0 {
            tracing::debug!(
                "{}: NCCL's calls posted {} operation(s) themselves",
                self.label,
                self.by_calls.total
            );
        }
        let _ = self.take_commands();
        for p in self.waiting.drain(..) {
            // SAFETY: as in take_commands.
            unsafe { &*p.op }.fail_with(libc::ECANCELED, 0, "endpoint closed".into());
        }
        if !self.in_flight.is_empty() {
            tracing::debug!(
                "{}: closing with {} operation(s) still in the provider's hands",
                self.label,
                self.in_flight.len()
            );
        }
        let keep: Vec<Box<dyn Send + Sync>> = self
            .in_flight
            .drain()
            .map(|(_, f)| Box::new(f.owner) as Box<dyn Send + Sync>)
            .collect();
        let retired = Retired {
            queue: self.queue,
            keep,
        };
        match self.close_after.iter().find_map(Weak::upgrade) {
            Some(receiver) => receiver.close_before(retired),
            None => drop(retired),
        }
    }
}
