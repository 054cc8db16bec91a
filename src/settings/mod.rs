//! Every `NCCL_FABRIC_*` environment variable, in one declarative table, parsed once.
//!
//! docs/settings.md's table is generated from [`TABLE`] (`nccl-net-fabric settings`) and a
//! test checks the two agree.
//!
//! The table itself is `table.rs`; reading the environment into [`Settings`] is `parse.rs`;
//! sizing what was left to the plugin for the devices in use, and the line that says so,
//! is `sizing.rs`.

use crate::sizing::Cpus;
use std::time::Duration;

mod parse;
mod sizing;
mod table;

pub use parse::{current, Current};
pub use table::{
    markdown_table, unknown_in_env, unknown_names, Kind, Setting, ALLOW_TCP_RDM, CLOSE_TIMEOUT_MS,
    CONNECT_TIMEOUT_MS, CONTROL_PROVIDER, DOMAINS, ENDPOINTS, EXCLUDE_DOMAINS, FLOWS, HMEM, LANES,
    LINGER_MS, LOG, MAX_RECVS, MERGE, PEER_TIMEOUT_MS, PIECE_BYTES, PROGRESS_SPIN_US,
    PROGRESS_THREAD, PROVIDER, SPEED_MBPS, STALL_WARN_MS, TABLE, THREADS, TIMES,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HmemMode {
    Auto,
    Require,
    Off,
    Force,
}

impl HmemMode {
    /// The value as a user writes it.
    pub fn name(self) -> &'static str {
        match self {
            HmemMode::Auto => "auto",
            HmemMode::Require => "require",
            HmemMode::Off => "off",
            HmemMode::Force => "force",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointSharing {
    /// Per provider: [`EndpointSharing::PerComm`] for local-only providers, else per device.
    Auto,
    PerDevice,
    PerComm,
}

/// The parsed settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub hmem: HmemMode,
    pub providers: Vec<String>,
    /// `NCCL_FABRIC_CONTROL_PROVIDER` (see `control_domain`).
    pub control_providers: Vec<String>,
    pub domains: Vec<String>,
    pub exclude_domains: Vec<String>,
    pub endpoints: EndpointSharing,
    pub connect_timeout_ms: u64,
    pub close_timeout_ms: u64,
    pub linger_ms: u64,
    pub peer_timeout_ms: u64,
    pub max_recvs: u64,
    /// Piece size of long messages (0: whole messages), before the peers agree.
    pub piece_bytes: u64,
    /// `NCCL_FABRIC_PIECE_BYTES` was not set: devices whose lanes NCCL's calls drive send
    /// whole messages (see `plugin`).
    pub pieces_auto: bool,
    /// Whether requests are timed (see `times`).
    pub times: bool,
    pub stall_warn_ms: u64,
    pub speed_mbps: u64,
    pub allow_native_tcp: bool,
    /// libfabric's `FI_OFI_RXM_USE_RNDV_WRITE` as libfabric reads it: rxm sends long
    /// messages by writing into the receiver's buffer (see `quirks::rxm_write_refusal`).
    pub rxm_rndv_write: bool,
    /// One device over every NIC (`NCCL_FABRIC_MERGE`).
    pub merge: bool,
    pub progress_thread: bool,
    /// With progress threads, NCCL's calls take turns on their comms' lanes too
    /// (`NCCL_FABRIC_PROGRESS_THREAD=both`).
    pub calls_help: bool,
    /// With progress threads, NCCL's calls post operations of at most this many bytes
    /// themselves when the lane is free (0: never).
    pub inline_post_bytes: usize,
    /// How long a progress thread with nothing to do spins before it sleeps on the
    /// provider's wait object (`None`: never).
    pub progress_spin: Option<Duration>,
    /// `NCCL_FABRIC_PROGRESS_SPIN_US` was not set: `size_for_devices` picks it.
    pub spin_auto: bool,
    /// Shared endpoints per device and role (at least 1; with `lanes_auto`, at least each
    /// device's flows too).
    pub lanes: usize,
    /// Whether `lanes` and `progress_thread` were left to the plugin (see
    /// [`sizing_for`](crate::sizing::sizing_for)).
    pub lanes_auto: bool,
    pub threads_auto: bool,
    /// Flows per comm (`NCCL_FABRIC_FLOWS`; 0: by each device's speed, see [`flows_for`](crate::sizing::flows_for)).
    pub flows: usize,
    /// Progress threads per device (with `progress_thread`).
    pub threads: usize,
    /// Whether `threads` was left to the plugin.
    pub thread_count_auto: bool,
    /// The devices in use `auto` sized for (1 until [`Settings::size_for_devices`]).
    pub devices: usize,
    /// The CPUs `auto` sized lanes and threads for.
    pub cpus: Cpus,
}

impl Default for Settings {
    fn default() -> Self {
        Self::from_lookup(|_| None).expect("defaults parse")
    }
}

/// Whether `name` matches a pattern list entry (`eth0`, or a prefix `eth*`).
pub fn matches_pattern(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}
