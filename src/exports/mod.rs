//! The C ABI: one table per NCCL net API version, `ncclNetPlugin_v6` … `ncclNetPlugin_v12`
//! (NCCL looks up the newest it knows), over one version-free API written against the
//! newest types (sizes `size_t`, a context per communicator, profiler handles).
//!
//! This module is that API: each function checks NCCL's pointers and calls `plugin`,
//! `connection`, `comm` and `mr`. The version modules hold the tables, whose entries are
//! adapters of a few lines (type widths, arguments a version lacks, its properties layout),
//! each inside `boundary()`, which turns an error into its `ncclResult_t` plus one WARN
//! line, and a panic into `ncclInternalError`: nothing unwinds into NCCL. Entry points every
//! version shares unchanged are defined once, in the files below.
//!
//! The boundary and the out-pointer check are in `boundary`; `init`, `finalize`, `devices`
//! and `getProperties` in `init`; `listen`, `connect`, `accept` and closing in `connect`;
//! registrations and the descriptors they give operations in `registration`; `isend`,
//! `irecv`, `iflush` and `test` in `transfer`; profiler events in `profiler`; each
//! version's properties layout in `props`.

mod boundary;
mod connect;
mod init;
mod profiler;
mod props;
mod registration;
mod transfer;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

pub(crate) use boundary::boundary;
pub(crate) use connect::{accept, close_listen, close_recv, close_send, connect, listen};
pub(crate) use init::{devices, finalize, init, init_context, properties, set_net_attr};
pub(crate) use registration::{dereg_mr, get_device_mr, reg_mr, reg_mr_dma_buf};
pub(crate) use transfer::{byte_count, iflush, irecv, irecv_consumed, isend, test, Lengths};

/// The name every table carries (what `NCCL_NET=Fabric` selects).
pub(crate) const NAME: &std::ffi::CStr = c"Fabric";
