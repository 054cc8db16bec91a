//! The NCCL side of the ABI: loads a plugin `.so` the way NCCL does (`dlopen` with
//! `RTLD_NOW|RTLD_LOCAL`, then `ncclNetPlugin_vN`) and calls through that table, adapting
//! to each version's argument types as NCCL's own adapters do.
//!
//! Used by the demo, the tests and the benchmarks, so they exercise exactly what NCCL
//! exercises. Calls return the plugin's `ncclResult_t` as a [`CallError`] when it is not
//! success; waits take a deadline so nothing built on this can hang.
//!
//! A crate of its own so that none of it ships inside the plugin library.
//!
//! Opening the library and what its table offers is in `load`; `init`, `devices` and
//! properties in `init`; `listen`, `connect`, `accept` and closing in `connect`;
//! registrations, sends, receives and `test` in `transfer`; the calls that retry until a
//! deadline in `deadline`; results in `error`; handles in `handle`.

/// NCCL's net plugin ABI (the tables and their types): the plugin's own source file.
#[path = "../../src/nccl.rs"]
pub mod nccl;

mod connect;
mod deadline;
mod error;
mod handle;
mod init;
mod load;
mod transfer;

pub use deadline::until;
pub use error::{CallError, CallResult};
pub use handle::{handle_from_hex, handle_to_hex, Ptr};
pub use init::{Newer, Properties};
pub use transfer::RecvBuffer;

use crate::nccl::{NetV10, NetV11, NetV12, NetV6, NetV7, NetV8, NetV9, ProfilerFn};
use parking_lot::Mutex;
use std::ffi::c_void;

/// The entry points every version has with the same signature.
struct Shared {
    dereg_mr: nccl::DeregMrFn,
    test: nccl::TestFn,
    close_send: nccl::CloseFn,
    close_recv: nccl::CloseFn,
    close_listen: nccl::CloseFn,
}

/// One version's table.
#[derive(Clone, Copy)]
enum Table {
    V6(&'static NetV6),
    V7(&'static NetV7),
    V8(&'static NetV8),
    V9(&'static NetV9),
    V10(&'static NetV10),
    V11(&'static NetV11),
    V12(&'static NetV12),
}

/// Table versions this host speaks, oldest first.
pub const VERSIONS: [u32; 7] = [6, 7, 8, 9, 10, 11, 12];

/// A loaded plugin, called through one version's table.
pub struct PluginLib {
    handle: *mut c_void,
    table: Table,
    pub version: u32,
    /// The profiler callback passed at init (v10+).
    profiler: ProfilerFn,
    /// The context of the last v11+ `init` (passed to listen and connect).
    ctx: Mutex<Ptr>,
}

// SAFETY: the library handle and the immutable table may be used from any thread.
unsafe impl Send for PluginLib {}
// SAFETY: as above.
unsafe impl Sync for PluginLib {}

impl Drop for PluginLib {
    fn drop(&mut self) {
        // The plugin may have threads or memory NCCL would have closed first; keep it loaded
        // like a long-running host would.
        let _ = self.handle;
    }
}

impl PluginLib {
    fn shared(&self) -> Shared {
        macro_rules! s {
            ($t:expr) => {
                Shared {
                    dereg_mr: $t.dereg_mr,
                    test: $t.test,
                    close_send: $t.close_send,
                    close_recv: $t.close_recv,
                    close_listen: $t.close_listen,
                }
            };
        }
        match self.table {
            Table::V6(t) => s!(t),
            Table::V7(t) => s!(t),
            Table::V8(t) => s!(t),
            Table::V9(t) => s!(t),
            Table::V10(t) => s!(t),
            Table::V11(t) => s!(t),
            Table::V12(t) => s!(t),
        }
    }
}
