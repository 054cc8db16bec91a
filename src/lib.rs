//! nccl-net-fabric: an NCCL network plugin that carries NCCL's inter-node traffic over
//! libfabric, and says which provider it picked and why.
//!
//! Layers, from NCCL inwards (each module uses only those below it):
//! - [`exports`]: the `ncclNetPlugin_v8`/`_v11` tables and the C entry points (panic
//!   boundary); [`opaque`] checks every pointer NCCL hands back.
//! - [`connection`] (listen/connect/accept state machines), [`comm`] (comms and requests),
//!   [`mr`] (registrations).
//! - [`plugin`]: state decided once at `init`; [`device`]: one NCCL device, owning its lanes,
//!   its control endpoint and its connects in progress.
//! - [`control`]: the control plane (handshake, liveness, endpoints left to finish);
//!   [`control_domain`]: where a device's control endpoint lives (on the data domain, or on
//!   a provider with short names when the data provider's do not fit NCCL's handle).
//! - [`lane`] (data endpoints and who drives them), [`progress`] (progress threads),
//!   [`driver`] (the one reader of an endpoint's queue), [`op`], [`tags`], [`overflow`].
//! - [`provider`] (pure policy) fed by [`discover`]; [`quirks`] (what particular providers
//!   need); [`handshake`] (wire records); [`settings`]; [`sizing`] (threads, lanes and
//!   flows from the CPUs and the device's speed); [`pace`] (how finely a send comm cuts its
//!   messages, from how fast its flows move).
//! - [`endpoint`], [`fabric`], [`sys`]: libfabric itself; [`address`]: what a peer address
//!   must look like before libfabric sees it; [`nic`]: what the kernel says about the
//!   interface behind a domain (loopback, PCI device, speed); [`wake`]: sleeping on file
//!   descriptors (a progress thread's provider fd and its bell); [`times`]: where requests
//!   spend their time, when asked.
//!
//! The NCCL side of the ABI, which the tool, the tests and the benchmarks drive the plugin
//! through, is the separate crate `nccl-net-host` (`host/`), kept out of the shipped library.

pub mod address;
pub mod comm;
pub mod connection;
pub mod control;
pub mod control_domain;
pub mod device;
pub mod discover;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod exports;
pub mod fabric;
pub mod gdr;
pub mod handshake;
pub mod lane;
pub mod log;
pub mod mr;
pub mod nccl;
pub mod nic;
pub mod op;
pub mod opaque;
pub mod overflow;
pub mod pace;
pub mod plugin;
pub mod progress;
pub mod provider;
pub mod quirks;
pub mod random;
pub mod settings;
pub mod sizing;
pub mod sys;
pub mod tags;
pub mod times;
pub mod wake;
