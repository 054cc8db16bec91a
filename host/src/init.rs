//! `init` and `finalize` (a context per communicator from v11), `devices`, and
//! `getProperties` copied out of each version's struct.

use crate::error::{check, CallResult};
use crate::nccl::{self, NetV10, NetV9};
use crate::{PluginLib, Ptr, Table};
use std::ffi::{c_int, CStr};
use std::ptr;

extern "C" {
    /// NCCL-style logger from `host_logger.c`.
    fn nccl_net_fabric_host_logger(
        level: c_int,
        flags: std::ffi::c_ulong,
        file: *const std::ffi::c_char,
        line: c_int,
        fmt: *const std::ffi::c_char,
        ...
    );
}

/// Device properties, copied out of the plugin's struct.
#[derive(Debug, Clone)]
pub struct Properties {
    pub name: String,
    pub pci_path: Option<String>,
    pub guid: u64,
    pub ptr_support: i32,
    pub reg_is_global: i32,
    pub speed: i32,
    pub port: i32,
    pub latency: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub net_device_type: i32,
    pub net_device_version: i32,
    /// What v9 and later add (None before).
    pub newer: Option<Newer>,
}

/// Properties fields of later versions.
#[derive(Debug, Clone, Default)]
pub struct Newer {
    pub max_p2p_bytes: usize,
    /// v12 only (0 before).
    pub rail_id: i16,
    pub plane_id: i16,
}

impl PluginLib {
    fn logger(with_logger: bool) -> nccl::Logger {
        match with_logger {
            true => Some(nccl_net_fabric_host_logger),
            false => None,
        }
    }

    /// `init` with an NCCL-style stderr logger (`with_logger`) or NULL. A v11+ table gets a
    /// context, kept for `listen` and `connect` (see [`PluginLib::init_v11`]).
    pub fn init(&self, with_logger: bool) -> CallResult<()> {
        let logger = Self::logger(with_logger);
        // SAFETY: calling the plugin's init as NCCL does.
        unsafe {
            match self.table {
                Table::V6(t) => check("init", (t.init)(logger)),
                Table::V7(t) => check("init", (t.init)(logger)),
                Table::V8(t) => check("init", (t.init)(logger)),
                Table::V9(t) => check("init", (t.init)(logger)),
                Table::V10(t) => check("init", (t.init)(logger, self.profiler)),
                Table::V11(_) | Table::V12(_) => {
                    let ctx = self.init_v11(0x6e66_6162, with_logger)?;
                    *self.ctx.lock() = ctx;
                    Ok(())
                }
            }
        }
    }

    /// A v11+ table's per-communicator `init`, as NCCL 2.28+ calls it: returns the context.
    pub fn init_v11(&self, comm_id: u64, with_logger: bool) -> CallResult<Ptr> {
        let logger = Self::logger(with_logger);
        let mut ctx = ptr::null_mut();
        let cfg = ptr::null_mut();
        // SAFETY: calling the plugin's v11+ init as NCCL does, with an out-pointer.
        let r = unsafe {
            match self.table {
                Table::V11(t) => (t.init)(&mut ctx, comm_id, cfg, logger, self.profiler),
                Table::V12(t) => (t.init)(&mut ctx, comm_id, cfg, logger, self.profiler),
                _ => -1,
            }
        };
        check("init(v11+)", r)?;
        Ok(Ptr(ctx))
    }

    /// A v11+ table's `finalize` for a context `init_v11` returned.
    pub fn finalize_v11(&self, ctx: Ptr) -> CallResult<()> {
        // SAFETY: ctx came from init_v11 and is finalized once.
        let r = unsafe {
            match self.table {
                Table::V11(t) => (t.finalize)(ctx.0),
                Table::V12(t) => (t.finalize)(ctx.0),
                _ => -1,
            }
        };
        check("finalize(v11+)", r)
    }

    /// `finalize` of the context [`PluginLib::init`] made (v11+; nothing before).
    pub fn finalize(&self) -> CallResult<()> {
        let ctx = std::mem::replace(&mut *self.ctx.lock(), Ptr(ptr::null_mut()));
        match self.version {
            11.. => self.finalize_v11(ctx),
            _ => Ok(()),
        }
    }

    pub fn devices(&self) -> CallResult<i32> {
        let mut n = 0;
        let f = match self.table {
            Table::V6(t) => t.devices,
            Table::V7(t) => t.devices,
            Table::V8(t) => t.devices,
            Table::V9(t) => t.devices,
            Table::V10(t) => t.devices,
            Table::V11(t) => t.devices,
            Table::V12(t) => t.devices,
        };
        // SAFETY: n is a valid int out-pointer.
        check("devices", unsafe { f(&mut n) })?;
        Ok(n)
    }

    pub fn properties(&self, dev: i32) -> CallResult<Properties> {
        /// Calls getProperties with a zeroed struct of the table's type.
        fn get<T>(f: unsafe extern "C" fn(c_int, *mut T) -> c_int, dev: i32) -> CallResult<T> {
            // SAFETY: every properties struct is plain data; zeroed is valid to overwrite.
            let mut p: T = unsafe { std::mem::zeroed() };
            // SAFETY: p is a valid out-struct of the table's type.
            check("getProperties", unsafe { f(dev, &mut p) })?;
            Ok(p)
        }
        let text = |s: *mut std::ffi::c_char| {
            // SAFETY: the plugin returns NUL-terminated strings it keeps alive, or NULL.
            (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
        };
        macro_rules! common {
            ($p:ident, $rig:expr, $ndt:expr, $ndv:expr, $newer:expr) => {
                Properties {
                    name: text($p.name).unwrap_or_default(),
                    pci_path: text($p.pci_path),
                    guid: $p.guid,
                    ptr_support: $p.ptr_support,
                    reg_is_global: $rig,
                    speed: $p.speed,
                    port: $p.port,
                    latency: $p.latency,
                    max_comms: $p.max_comms,
                    max_recvs: $p.max_recvs,
                    net_device_type: $ndt,
                    net_device_version: $ndv,
                    newer: $newer,
                }
            };
        }
        let newer = |max_p2p_bytes| {
            Some(Newer {
                max_p2p_bytes,
                ..Newer::default()
            })
        };
        Ok(match self.table {
            Table::V6(t) => {
                let p = get(t.get_properties, dev)?;
                common!(p, 0, 0, 0, None)
            }
            Table::V7(t) => {
                let p = get(t.get_properties, dev)?;
                common!(p, 0, p.net_device_type, p.net_device_version, None)
            }
            Table::V8(t) => {
                let p = get(t.get_properties, dev)?;
                common!(
                    p,
                    p.reg_is_global,
                    p.net_device_type,
                    p.net_device_version,
                    None
                )
            }
            // v9 and v10 share their properties layout.
            Table::V9(&NetV9 {
                get_properties: f, ..
            })
            | Table::V10(&NetV10 {
                get_properties: f, ..
            }) => {
                let p = get(f, dev)?;
                let n = newer(p.max_p2p_bytes);
                common!(
                    p,
                    p.reg_is_global,
                    p.net_device_type,
                    p.net_device_version,
                    n
                )
            }
            Table::V11(t) => {
                let p = get(t.get_properties, dev)?;
                let n = newer(p.max_p2p_bytes);
                common!(
                    p,
                    p.reg_is_global,
                    p.net_device_type,
                    p.net_device_version,
                    n
                )
            }
            Table::V12(t) => {
                let p = get(t.get_properties, dev)?;
                let n = Some(Newer {
                    max_p2p_bytes: p.max_p2p_bytes,
                    rail_id: p.rail_id,
                    plane_id: p.plane_id,
                });
                common!(
                    p,
                    p.reg_is_global,
                    p.net_device_type,
                    p.net_device_version,
                    n
                )
            }
        })
    }
}
