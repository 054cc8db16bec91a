//! One NCCL device: a domain of the chosen provider, what `getProperties` reports for it,
//! and what it owns: its lanes (data endpoints), its control endpoint and its connects in
//! progress. Every lock here is the device's own and is never held across a libfabric call,
//! except the one that opens the control endpoint (once per device).

use crate::control::{ConnectSlot, Control, Liveness};
use crate::error::Result;
use crate::fabric::Domain;
use crate::handshake::Handle;
use crate::lane::{Lane, LanePool, Opening};
use crate::provider::Candidate;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest message NCCL may hand a v11 `isend`/`irecv`: `test` reports sizes as `int`.
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;
/// Comms NCCL may open per device.
pub const MAX_COMMS: i32 = 65_536;

/// What `getProperties` reports for a device, version-free.
#[derive(Debug, Clone)]
pub struct Properties {
    pub name: CString,
    pub pci_path: Option<CString>,
    pub guid: u64,
    pub ptr_support: i32,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    /// Buffers one receive may group (`NCCL_FABRIC_MAX_RECVS`).
    pub max_recvs: i32,
    /// The largest message: the provider's `max_msg_size`, at most [`MAX_MESSAGE_BYTES`]
    /// (NCCL is told from v9 on: `maxP2pBytes`, `maxCollBytes`).
    pub max_message: usize,
}

/// A connect in progress (its steps are in `connection`). Dropping it gives back what it
/// holds: its lanes, and its place in the control endpoint's table of answers awaited.
pub struct Connecting {
    pub handle: Handle,
    /// Random: the id the listener's answer names.
    pub conn: u64,
    /// Its sending lanes once acquired: its own first, then those its pieces may spread
    /// over.
    pub lanes: Vec<Arc<Lane>>,
    /// Its sending lanes being opened off NCCL's calls, while they are.
    pub opening: Option<Arc<Opening>>,
    pub control: Option<Arc<Control>>,
    pub slot: Arc<ConnectSlot>,
    /// When the CONNECT went out: the timeout counts from then (opening this side's
    /// endpoint is not waiting for the peer).
    pub sent: Option<Instant>,
    /// Whether the listener's address was checked for a refusal (see
    /// `quirks::refused`).
    pub checked: bool,
}

impl Drop for Connecting {
    fn drop(&mut self) {
        if let Some(c) = &self.control {
            c.forget_connect(self.conn);
        }
        for lane in self.lanes.drain(..) {
            lane.release_user();
        }
    }
}

/// A connect in progress and when NCCL last called for it.
pub struct ConnectEntry {
    pub state: Mutex<Connecting>,
    pub last_call: Mutex<Instant>,
}

/// One NCCL device.
pub struct Device {
    pub index: usize,
    pub domain: Arc<Domain>,
    pub props: Properties,
    pub candidate: Candidate,
    pub lanes: Arc<LanePool>,
    /// With GPU buffers allowed, every endpoint must answer setopt as the probe did.
    pub expected_answer: Option<i32>,
    /// The piece size its comms offer their peers (0: whole messages; see `comm`), decided
    /// at init from the setting and the provider.
    pub piece: u64,
    /// How many flows its comms ask for (see `comm`), decided at init.
    pub flows: usize,
    /// What NCCL's registrations on this device said about GPU buffers.
    pub buffers: crate::gdr::BufferReport,
    liveness: Liveness,
    /// Where the control endpoint lives when not on `domain` (see `control_domain`): its
    /// domain and the domain's name.
    control_home: Option<(Arc<Domain>, String)>,
    control: Mutex<Option<Arc<Control>>>,
    /// Connects in progress, by the handle's (token, nonce).
    pub connects: Mutex<HashMap<(u64, u64), Arc<ConnectEntry>>>,
}

impl Device {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: usize,
        domain: Arc<Domain>,
        props: Properties,
        candidate: Candidate,
        lanes: Arc<LanePool>,
        expected_answer: Option<i32>,
        piece: u64,
        flows: usize,
        liveness: Liveness,
        control_home: Option<(Arc<Domain>, String)>,
    ) -> Self {
        let buffers = crate::gdr::BufferReport::new(
            index,
            props.ptr_support & crate::nccl::PTR_CUDA != 0,
            props
                .pci_path
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned()),
            crate::quirks::stages_gpu_memory(
                &candidate.provider,
                crate::nic::Sysfs::default().has_rdma_devices(),
            ),
        );
        Device {
            buffers,
            index,
            domain,
            props,
            candidate,
            lanes,
            expected_answer,
            piece,
            flows,
            liveness,
            control_home,
            control: Mutex::new(None),
            connects: Mutex::new(HashMap::new()),
        }
    }

    /// The device's control endpoint, opened on first use.
    pub fn control(&self) -> Result<Arc<Control>> {
        let mut c = self.control.lock();
        if let Some(c) = &*c {
            return Ok(c.clone());
        }
        let opened = match &self.control_home {
            // Another provider: it carries no GPU buffers, and the data endpoints it
            // introduces have the data provider's addresses.
            Some((domain, name)) => Control::open(
                domain,
                None,
                self.liveness,
                &format!("{name} for dev {}", self.index),
                self.candidate.names.as_ref().map(|n| n.shape.clone()),
            )?,
            // The data domain, where its buffers need no registration.
            None => Control::open(
                &self.domain.unclaimed()?,
                self.expected_answer,
                self.liveness,
                &self.candidate.domain,
                None,
            )?,
        };
        *c = Some(opened.clone());
        Ok(opened)
    }

    /// Drops connects NCCL stopped calling for: `idle` after their last call.
    pub fn reclaim_connects(&self, idle: Duration) -> usize {
        let now = Instant::now();
        let mut gone = Vec::new();
        self.connects.lock().retain(|_, e| {
            let keep = now.duration_since(*e.last_call.lock()) < idle;
            if !keep {
                gone.push(e.clone());
            }
            keep
        });
        for e in &gone {
            tracing::debug!(
                "reclaimed an abandoned connect to listen token {:#x} (no call for {} ms)",
                e.state.lock().handle.token,
                idle.as_millis()
            );
        }
        gone.len()
    }
}
