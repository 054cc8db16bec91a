//! A tagged `FI_EP_RDM` endpoint, in two parts:
//!
//! - [`Endpoint`], shared (`Arc`): the address vector, the endpoint's own address and
//!   what was learnt opening it. Any thread may insert peers or bind registrations.
//! - [`Queue`], owned by exactly one driver (it is `Send` but not `Sync`, and not `Clone`):
//!   posting, cancelling and reading the completion queue. Whoever holds the `Queue` is the
//!   only reader of the completion queue, by construction.
//!
//! `FI_OPT_CUDA_API_PERMITTED=false` is set on every endpoint before `fi_enable`, and the
//! answer is kept: it is the evidence the provider policy decides on.
//!
//! Opening and enabling an endpoint is `open.rs`; peer addresses and the address vector
//! `peers.rs`; what is posted on a queue (tagged sends and receives, cancels, the queue's
//! backpressure) `posting.rs`; reading its completion queue `completion.rs`.

use crate::address::Shape;
use crate::fabric::{close_fid, Domain};
use crate::sys;
use parking_lot::Mutex;
use std::sync::Arc;

mod completion;
mod open;
mod peers;
mod posting;

pub use completion::{Event, Failure};
pub use peers::check_peer_address;
use peers::OPEN_HERE;
use posting::Backpressure;

/// Entries read from the completion queue per `fi_cq_read`.
pub const CQ_BATCH: usize = 32;
const CQ_SIZE: usize = 4096;
const AV_SIZE: usize = 64;

/// Return value of `fi_setopt(FI_OPT_CUDA_API_PERMITTED=false)`: 0 or a negative errno.
pub type SetoptAnswer = i32;

/// The shared part of an endpoint.
pub struct Endpoint {
    av: *mut sys::fid_av,
    /// The endpoint's fid, for binding registrations (`FI_MR_ENDPOINT`); valid while the
    /// [`Queue`] is open, which every holder of a registration ensures.
    ep_fid: *mut sys::fid,
    /// The answer to `FI_OPT_CUDA_API_PERMITTED=false` on this endpoint.
    pub cuda_api_answer: SetoptAnswer,
    /// This endpoint's address (`fi_getname`).
    pub name: Vec<u8>,
    /// What peer addresses must look like.
    pub shape: Shape,
    /// Whether receives name their source (`FI_DIRECTED_RECV`).
    pub directed: bool,
    /// Whether completions say who sent a message (`FI_SOURCE`).
    pub source: bool,
    pub provider: String,
    /// Whether receives may carry the overflow area as a second piece (the provider takes two
    /// pieces, and needs no descriptor for host memory or has the area registered), and if
    /// so the area's descriptor in this endpoint's domain (0: none needed).
    pub overflow: Option<usize>,
    pub max_msg_size: usize,
    pub domain: Arc<Domain>,
    /// Sending queues of this process that must close after this endpoint (see
    /// `quirks::sender_waits_for_receiver`); dropped once this endpoint is closed.
    close_after: Mutex<Vec<Retired>>,
}

// SAFETY: the plugin asks for FI_THREAD_SAFE, so the provider serialises concurrent calls on
// the address vector itself; the pointers are only closed from Drop, when no user is left.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

/// A queue given up by its driver, with the owners of what it still had in flight: the
/// queue closes first (fields drop in order), then the owners' memory goes.
pub struct Retired {
    pub queue: Queue,
    pub keep: Vec<Box<dyn Send + Sync>>,
}

/// The driver's part of an endpoint: the endpoint and its completion queue.
pub struct Queue {
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    /// The completion queue's wait object (an fd that polls readable when there is progress
    /// to make), where the provider has one that tells all.
    wait_fd: Option<std::os::fd::RawFd>,
    fabric: *mut sys::fid_fabric,
    shared: Arc<Endpoint>,
    backpressure: Backpressure,
    /// The device's turn lock, where its endpoints must progress one at a time.
    serial: Option<Arc<Mutex<()>>>,
}

// SAFETY: a Queue moves between threads (a lane's progress thread, the control thread) but is
// used by one at a time: it is not Sync and not Clone.
unsafe impl Send for Queue {}

impl Endpoint {
    /// The endpoint's fid, for binding memory registrations (`FI_MR_ENDPOINT`).
    pub fn fid(&self) -> *mut sys::fid {
        self.ep_fid
    }

    /// Keeps `sender` open until this endpoint has closed.
    pub fn close_before(&self, sender: Retired) {
        self.close_after.lock().push(sender);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        close_fid("address vector", self.av.cast());
        // Sending queues that waited for this endpoint close now (their Drop).
        self.close_after.get_mut().clear();
    }
}

impl Queue {
    /// The lock a driver holds for its turn, if this provider's endpoints of one device must
    /// not progress at the same time (see `quirks::serial_progress`).
    pub fn serial(&self) -> Option<Arc<Mutex<()>>> {
        self.serial.clone()
    }
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.shared
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let name = &self.shared.name;
        OPEN_HERE.lock().retain(|a| a != name);
        // The endpoint first (it holds bindings to the queue and the address vector).
        close_fid("endpoint", self.ep.cast());
        close_fid("completion queue", self.cq.cast());
    }
}
