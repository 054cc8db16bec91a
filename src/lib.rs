//! nccl-net-fabric: an NCCL network plugin that carries NCCL's inter-node traffic over
//! libfabric, and says which provider it picked and why.
//!
//! Layers, from NCCL inwards:
//! - [`exports`]: the `ncclNetPlugin_v8` table and the C entry points (panic boundary).
//! - [`plugin`]: state decided once at `init` (settings, provider decision, devices).
//! - [`provider`] (pure policy) fed by [`discover`] (fi_getinfo passes and probe endpoints).
//! - [`connection`] and [`handshake`]: listen/connect/accept state machines and wire records.
//! - [`comm`], [`op`], [`tags`], [`mr`]: the data path.
//! - [`endpoint`], [`fabric`], [`sys`]: libfabric itself.
//! - [`host`]: the NCCL side of the ABI, for the demo, the tests and the benchmarks.

pub mod comm;
pub mod connection;
pub mod discover;
pub mod endpoint;
pub mod error;
pub mod exports;
pub mod fabric;
pub mod handoff;
pub mod handshake;
pub mod host;
pub mod log;
pub mod mr;
pub mod nccl;
pub mod op;
pub mod plugin;
pub mod provider;
pub mod settings;
pub mod sys;
pub mod tags;
