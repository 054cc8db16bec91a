//! The NCCL side of the ABI: loads a plugin `.so` the way NCCL does (`dlopen` with
//! `RTLD_NOW|RTLD_LOCAL`, then `ncclNetPlugin_vN`) and calls through that table, adapting
//! to each version's argument types as NCCL's own adapters do.
//!
//! Used by the demo, the tests and the benchmarks, so they exercise exactly what NCCL
//! exercises. Calls return the plugin's `ncclResult_t` as a [`CallError`] when it is not
//! success; waits take a deadline so nothing built on this can hang.
//!
//! A crate of its own so that none of it ships inside the plugin library.

/// NCCL's net plugin ABI (the tables and their types): the plugin's own source file.
#[path = "../../src/nccl.rs"]
pub mod nccl;

use crate::nccl::{
    NetV10, NetV11, NetV12, NetV6, NetV7, NetV8, NetV9, ProfilerFn, NET_HANDLE_MAXSIZE,
};
use parking_lot::Mutex;
use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;
use std::time::Instant;

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

/// A call that did not return `ncclSuccess`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallError {
    pub call: &'static str,
    /// The raw `ncclResult_t`, or -1 for a deadline passed in a helper.
    pub code: c_int,
}

impl CallError {
    pub fn result(&self) -> Option<nccl::NcclResult> {
        nccl::NcclResult::from_raw(self.code)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.result() {
            Some(r) => write!(f, "{} returned {r:?} ({})", self.call, self.code),
            None if self.code == -1 => write!(f, "{}: deadline passed", self.call),
            None => write!(f, "{} returned {}", self.call, self.code),
        }
    }
}

impl std::error::Error for CallError {}

pub type CallResult<T> = Result<T, CallError>;

fn check(call: &'static str, code: c_int) -> CallResult<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(CallError { call, code })
    }
}

/// Opaque pointers the plugin hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr(pub *mut c_void);
// SAFETY: these are opaque tokens the plugin lets NCCL use from any of its threads.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

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

/// One buffer of an [`PluginLib::irecv_group`].
#[derive(Debug, Clone, Copy)]
pub struct RecvBuffer {
    pub data: *mut c_void,
    pub size: usize,
    pub tag: i32,
    pub mhandle: Ptr,
    pub phandle: Ptr,
}

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
    /// Where the plugin may be, relative to the running executable, in order: built by
    /// cargo beside it (target/<profile>/, its deps/, or the one above deps/), installed by `scripts/install.sh`
    /// (PREFIX/bin → PREFIX/lib), or by the Debian package (/usr/lib/<triplet>).
    pub fn default_candidates() -> Vec<PathBuf> {
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        let up = dir.parent().map(Path::to_path_buf).unwrap_or_default();
        vec![
            // cargo keeps the newest build in deps/ (the copy beside it may be older).
            dir.join("deps/libnccl_net_fabric.so"),
            dir.join("libnccl_net_fabric.so"),
            up.join("libnccl_net_fabric.so"),
            up.join("lib/libnccl-net-fabric.so"),
            up.join(format!(
                "lib/{}-linux-gnu/libnccl-net-fabric.so",
                std::env::consts::ARCH
            )),
        ]
    }

    /// The first of [`PluginLib::default_candidates`] that exists; `Err`: none does, with
    /// every place looked at.
    pub fn find() -> Result<PathBuf, Vec<PathBuf>> {
        let all = Self::default_candidates();
        match all.iter().find(|p| p.exists()) {
            Some(p) => Ok(p.clone()),
            None => Err(all),
        }
    }

    /// [`PluginLib::find`]'s answer, else the first candidate.
    pub fn default_path() -> PathBuf {
        Self::find().unwrap_or_else(|all| all[0].clone())
    }

    /// `dlopen(path, RTLD_NOW|RTLD_LOCAL)` and `dlsym("ncclNetPlugin_v8")`.
    pub fn open(path: &Path) -> Result<Self, String> {
        Self::open_version(path, 8)
    }

    /// `dlopen(path, RTLD_NOW|RTLD_LOCAL)` and `dlsym("ncclNetPlugin_v<version>")`, as NCCL
    /// does.
    pub fn open_version(path: &Path, version: u32) -> Result<Self, String> {
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: dlopen with a NUL-terminated path; failure is reported through dlerror.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("dlopen({}) failed: {}", path.display(), dlerror()));
        }
        let name = CString::new(format!("ncclNetPlugin_v{version}")).expect("no NUL");
        // SAFETY: handle is a live library handle; the symbol name is NUL-terminated.
        let sym = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if sym.is_null() {
            return Err(format!(
                "{} has no {}: {}",
                path.display(),
                name.to_string_lossy(),
                dlerror()
            ));
        }
        // SAFETY: the symbol is the plugin's immutable table of that version, alive while
        // the library is loaded (until `close`, or for good: see Drop).
        let table = unsafe {
            match version {
                6 => Table::V6(&*sym.cast()),
                7 => Table::V7(&*sym.cast()),
                8 => Table::V8(&*sym.cast()),
                9 => Table::V9(&*sym.cast()),
                10 => Table::V10(&*sym.cast()),
                11 => Table::V11(&*sym.cast()),
                12 => Table::V12(&*sym.cast()),
                v => return Err(format!("no table version {v} in this host")),
            }
        };
        Ok(PluginLib {
            handle,
            table,
            version,
            profiler: None,
            ctx: Mutex::new(Ptr(ptr::null_mut())),
        })
    }

    /// `dlclose`, as NCCL 2.28+ does when its last communicator is gone. The plugin must
    /// have been finalized; nothing of it may be used afterwards.
    pub fn close(self) -> CallResult<()> {
        // SAFETY: the handle came from dlopen and is closed once (Drop does not close).
        let r = unsafe { libc::dlclose(self.handle) };
        check("dlclose", r)
    }

    /// The profiler callback `init` passes from now on (v10+ tables).
    pub fn with_profiler(mut self, f: ProfilerFn) -> Self {
        self.profiler = f;
        self
    }

    /// Looks up any symbol (for checking what the library exports).
    pub fn symbol(&self, name: &str) -> bool {
        let Ok(c) = CString::new(name) else {
            return false;
        };
        // SAFETY: live handle, NUL-terminated name.
        !unsafe { libc::dlsym(self.handle, c.as_ptr()) }.is_null()
    }

    /// Whether the table offers `regMrDmaBuf`, `getDeviceMr` and `irecvConsumed` (what the
    /// demo reports).
    pub fn optional_entries(&self) -> (bool, bool, bool) {
        match self.table {
            Table::V6(t) => (t.reg_mr_dma_buf.is_some(), false, false),
            Table::V7(t) => (
                t.reg_mr_dma_buf.is_some(),
                t.get_device_mr.is_some(),
                t.irecv_consumed.is_some(),
            ),
            Table::V8(t) => (
                t.reg_mr_dma_buf.is_some(),
                t.get_device_mr.is_some(),
                t.irecv_consumed.is_some(),
            ),
            Table::V9(t) => (
                t.reg_mr_dma_buf.is_some(),
                t.get_device_mr.is_some(),
                t.irecv_consumed.is_some(),
            ),
            Table::V10(t) => (
                t.reg_mr_dma_buf.is_some(),
                t.get_device_mr.is_some(),
                t.irecv_consumed.is_some(),
            ),
            Table::V11(t) => (
                t.reg_mr_dma_buf.is_some(),
                t.get_device_mr.is_some(),
                t.irecv_consumed.is_some(),
            ),
            Table::V12(t) => (
                t.reg_mr_dma_buf.is_some(),
                t.get_device_mr.is_some(),
                t.irecv_consumed.is_some(),
            ),
        }
    }

    pub fn name(&self) -> String {
        let name = match self.table {
            Table::V6(t) => t.name,
            Table::V7(t) => t.name,
            Table::V8(t) => t.name,
            Table::V9(t) => t.name,
            Table::V10(t) => t.name,
            Table::V11(t) => t.name,
            Table::V12(t) => t.name,
        };
        // SAFETY: the table's name is a static NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

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

    pub fn listen(&self, dev: i32) -> CallResult<([u8; NET_HANDLE_MAXSIZE], Ptr)> {
        let mut handle = [0u8; NET_HANDLE_MAXSIZE];
        let mut l = ptr::null_mut();
        let h = handle.as_mut_ptr().cast();
        let ctx = self.ctx.lock().0;
        // SAFETY: handle has NCCL_NET_HANDLE_MAXSIZE bytes; l is an out-pointer.
        let r = unsafe {
            match self.table {
                Table::V6(t) => (t.listen)(dev, h, &mut l),
                Table::V7(t) => (t.listen)(dev, h, &mut l),
                Table::V8(t) => (t.listen)(dev, h, &mut l),
                Table::V9(t) => (t.listen)(dev, h, &mut l),
                Table::V10(t) => (t.listen)(dev, h, &mut l),
                Table::V11(t) => (t.listen)(ctx, dev, h, &mut l),
                Table::V12(t) => (t.listen)(ctx, dev, h, &mut l),
            }
        };
        check("listen", r)?;
        Ok((handle, Ptr(l)))
    }

    /// One `connect` call: `Ok(None)` means "call again".
    pub fn connect(
        &self,
        dev: i32,
        handle: &mut [u8; NET_HANDLE_MAXSIZE],
    ) -> CallResult<Option<Ptr>> {
        let mut s = ptr::null_mut();
        let mut dh: *mut nccl::DeviceHandleV8 = ptr::null_mut();
        let h = handle.as_mut_ptr().cast();
        let ctx = self.ctx.lock().0;
        let cfg = ptr::null_mut();
        // SAFETY: handle is the peer's 128-byte handle; s and dh are out-pointers.
        let r = unsafe {
            match self.table {
                Table::V6(t) => (t.connect)(dev, h, &mut s),
                Table::V7(t) => (t.connect)(dev, h, &mut s, &mut dh),
                Table::V8(t) => (t.connect)(dev, h, &mut s, &mut dh),
                Table::V9(t) => (t.connect)(dev, h, &mut s, &mut dh),
                Table::V10(t) => (t.connect)(dev, cfg, h, &mut s, &mut dh),
                Table::V11(t) => (t.connect)(ctx, dev, h, &mut s, &mut dh),
                Table::V12(t) => (t.connect)(ctx, dev, h, &mut s, &mut dh),
            }
        };
        check("connect", r)?;
        Ok((!s.is_null()).then_some(Ptr(s)))
    }

    /// One `accept` call: `Ok(None)` means "call again".
    pub fn accept(&self, listen: Ptr) -> CallResult<Option<Ptr>> {
        let mut r = ptr::null_mut();
        let mut dh: *mut nccl::DeviceHandleV8 = ptr::null_mut();
        let l = listen.0;
        // SAFETY: listen came from this plugin's listen; r and dh are out-pointers.
        let code = unsafe {
            match self.table {
                Table::V6(t) => (t.accept)(l, &mut r),
                Table::V7(t) => (t.accept)(l, &mut r, &mut dh),
                Table::V8(t) => (t.accept)(l, &mut r, &mut dh),
                Table::V9(t) => (t.accept)(l, &mut r, &mut dh),
                Table::V10(t) => (t.accept)(l, &mut r, &mut dh),
                Table::V11(t) => (t.accept)(l, &mut r, &mut dh),
                Table::V12(t) => (t.accept)(l, &mut r, &mut dh),
            }
        };
        check("accept", code)?;
        Ok((!r.is_null()).then_some(Ptr(r)))
    }

    /// Calls `connect` until it returns a comm or the deadline passes.
    pub fn connect_until(
        &self,
        dev: i32,
        handle: &mut [u8; NET_HANDLE_MAXSIZE],
        deadline: Instant,
    ) -> CallResult<Ptr> {
        until("connect", deadline, || self.connect(dev, handle))
    }

    /// Calls `accept` until it returns a comm or the deadline passes.
    pub fn accept_until(&self, listen: Ptr, deadline: Instant) -> CallResult<Ptr> {
        until("accept", deadline, || self.accept(listen))
    }

    /// listen + connect + accept + closeListen inside one thread: (sendComm, recvComm).
    pub fn connect_pair(&self, dev: i32, deadline: Instant) -> CallResult<(Ptr, Ptr)> {
        let (mut handle, listen) = self.listen(dev)?;
        let (mut send, mut recv) = (None, None);
        while send.is_none() || recv.is_none() {
            if send.is_none() {
                send = self.connect(dev, &mut handle)?;
            }
            if recv.is_none() {
                recv = self.accept(listen)?;
            }
            if Instant::now() > deadline {
                return Err(CallError {
                    call: "connect_pair",
                    code: -1,
                });
            }
        }
        self.close_listen(listen)?;
        Ok((send.expect("set"), recv.expect("set")))
    }

    /// # Safety
    /// `data` must stay allocated for `size` bytes until `dereg_mr`.
    pub unsafe fn reg_mr(
        &self,
        comm: Ptr,
        data: *mut c_void,
        size: usize,
        kind: c_int,
    ) -> CallResult<Ptr> {
        let mut mh = ptr::null_mut();
        let small = c_int::try_from(size).unwrap_or(c_int::MAX);
        let c = comm.0;
        // SAFETY: per the caller.
        let r = unsafe {
            match self.table {
                Table::V6(t) => (t.reg_mr)(c, data, small, kind, &mut mh),
                Table::V7(t) => (t.reg_mr)(c, data, small, kind, &mut mh),
                Table::V8(t) => (t.reg_mr)(c, data, size, kind, &mut mh),
                Table::V9(t) => (t.reg_mr)(c, data, size, kind, &mut mh),
                Table::V10(t) => (t.reg_mr)(c, data, size, kind, &mut mh),
                Table::V11(t) => (t.reg_mr)(c, data, size, kind, &mut mh),
                Table::V12(t) => (t.reg_mr)(c, data, size, kind, &mut mh),
            }
        };
        check("regMr", r)?;
        Ok(Ptr(mh))
    }

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

    pub fn dereg_mr(&self, comm: Ptr, mhandle: Ptr) -> CallResult<()> {
        // SAFETY: mhandle came from reg_mr on comm.
        check("deregMr", unsafe {
            (self.shared().dereg_mr)(comm.0, mhandle.0)
        })
    }

    /// # Safety
    /// `data` must stay valid for `size` bytes until the request completes.
    pub unsafe fn isend(
        &self,
        comm: Ptr,
        data: *mut c_void,
        size: i32,
        mhandle: Ptr,
    ) -> CallResult<Option<Ptr>> {
        // SAFETY: per the caller.
        unsafe { self.isend_tagged(comm, data, size as usize, 0, mhandle, Ptr(ptr::null_mut())) }
    }

    /// `isend` with NCCL's tag and a profiler handle (passed where the version has one).
    ///
    /// # Safety
    /// As [`PluginLib::isend`].
    pub unsafe fn isend_tagged(
        &self,
        comm: Ptr,
        data: *mut c_void,
        size: usize,
        tag: i32,
        mhandle: Ptr,
        phandle: Ptr,
    ) -> CallResult<Option<Ptr>> {
        let mut req = ptr::null_mut();
        let (c, mh, ph) = (comm.0, mhandle.0, phandle.0);
        let small = c_int::try_from(size).unwrap_or(c_int::MAX);
        // SAFETY: per the caller.
        let r = unsafe {
            match self.table {
                Table::V6(t) => (t.isend)(c, data, small, tag, mh, &mut req),
                Table::V7(t) => (t.isend)(c, data, small, tag, mh, &mut req),
                Table::V8(t) => (t.isend)(c, data, small, tag, mh, &mut req),
                Table::V9(t) => (t.isend)(c, data, size, tag, mh, &mut req),
                Table::V10(t) => (t.isend)(c, data, size, tag, mh, ph, &mut req),
                Table::V11(t) => (t.isend)(c, data, size, tag, mh, ph, &mut req),
                Table::V12(t) => (t.isend)(c, data, size, tag, mh, ph, &mut req),
            }
        };
        check("isend", r)?;
        Ok((!req.is_null()).then_some(Ptr(req)))
    }

    /// # Safety
    /// `data` must stay valid for `size` bytes until the request completes.
    pub unsafe fn irecv(
        &self,
        comm: Ptr,
        data: *mut c_void,
        size: i32,
        mhandle: Ptr,
    ) -> CallResult<Option<Ptr>> {
        let buf = RecvBuffer {
            data,
            size: size as usize,
            tag: 0,
            mhandle,
            phandle: Ptr(ptr::null_mut()),
        };
        // SAFETY: per the caller.
        unsafe { self.irecv_group(comm, &[buf]) }
    }

    /// `irecv` of several buffers at once (a grouped receive), each with its tag.
    ///
    /// # Safety
    /// Every buffer must stay valid for its size until the request completes.
    pub unsafe fn irecv_group(&self, comm: Ptr, bufs: &[RecvBuffer]) -> CallResult<Option<Ptr>> {
        let mut req = ptr::null_mut();
        let n = bufs.len() as c_int;
        let mut datas: Vec<*mut c_void> = bufs.iter().map(|b| b.data).collect();
        let mut small: Vec<c_int> = bufs.iter().map(|b| b.size as c_int).collect();
        let mut sizes: Vec<usize> = bufs.iter().map(|b| b.size).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag).collect();
        let mut mhs: Vec<*mut c_void> = bufs.iter().map(|b| b.mhandle.0).collect();
        let mut phs: Vec<*mut c_void> = bufs.iter().map(|b| b.phandle.0).collect();
        let (c, d, t, m, p) = (
            comm.0,
            datas.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            phs.as_mut_ptr(),
        );
        let (si, sz) = (small.as_mut_ptr(), sizes.as_mut_ptr());
        // SAFETY: per the caller; arrays of n entries each.
        let r = unsafe {
            match self.table {
                Table::V6(x) => (x.irecv)(c, n, d, si, t, m, &mut req),
                Table::V7(x) => (x.irecv)(c, n, d, si, t, m, &mut req),
                Table::V8(x) => (x.irecv)(c, n, d, si, t, m, &mut req),
                Table::V9(x) => (x.irecv)(c, n, d, sz, t, m, &mut req),
                Table::V10(x) => (x.irecv)(c, n, d, sz, t, m, p, &mut req),
                Table::V11(x) => (x.irecv)(c, n, d, sz, t, m, p, &mut req),
                Table::V12(x) => (x.irecv)(c, n, d, sz, t, m, p, &mut req),
            }
        };
        check("irecv", r)?;
        Ok((!req.is_null()).then_some(Ptr(req)))
    }

    /// One `test` call: `Ok(Some(bytes))` when done.
    pub fn test(&self, req: Ptr) -> CallResult<Option<i32>> {
        Ok(self.test_group(req, 1)?.map(|s| s[0]))
    }

    /// One `test` call for a request of `n` buffers: `Ok(Some(sizes))` when done.
    pub fn test_group(&self, req: Ptr, n: usize) -> CallResult<Option<Vec<i32>>> {
        let mut done = 0;
        let mut sizes = vec![-1; n.max(1)];
        // SAFETY: req came from isend/irecv and has not been reported done yet; sizes has a
        // slot per buffer.
        check("test", unsafe {
            (self.shared().test)(req.0, &mut done, sizes.as_mut_ptr())
        })?;
        Ok((done != 0).then_some(sizes))
    }

    /// Tests until done or the deadline passes.
    pub fn wait(&self, req: Ptr, deadline: Instant) -> CallResult<i32> {
        until("test", deadline, || self.test(req))
    }

    /// Posts (retrying "call again" answers) until the plugin takes the request.
    ///
    /// # Safety
    /// As [`PluginLib::isend`].
    pub unsafe fn isend_until(
        &self,
        comm: Ptr,
        data: *mut c_void,
        size: i32,
        mh: Ptr,
        deadline: Instant,
    ) -> CallResult<Ptr> {
        until("isend", deadline, || {
            // SAFETY: per the caller.
            unsafe { self.isend(comm, data, size, mh) }
        })
    }

    /// # Safety
    /// As [`PluginLib::irecv`].
    pub unsafe fn irecv_until(
        &self,
        comm: Ptr,
        data: *mut c_void,
        size: i32,
        mh: Ptr,
        deadline: Instant,
    ) -> CallResult<Ptr> {
        until("irecv", deadline, || {
            // SAFETY: per the caller.
            unsafe { self.irecv(comm, data, size, mh) }
        })
    }

    pub fn close_send(&self, comm: Ptr) -> CallResult<()> {
        // SAFETY: comm is a sendComm of this plugin, closed once.
        check("closeSend", unsafe { (self.shared().close_send)(comm.0) })
    }

    pub fn close_recv(&self, comm: Ptr) -> CallResult<()> {
        // SAFETY: comm is a recvComm of this plugin, closed once.
        check("closeRecv", unsafe { (self.shared().close_recv)(comm.0) })
    }

    pub fn close_listen(&self, listen: Ptr) -> CallResult<()> {
        // SAFETY: listen is a listenComm of this plugin, closed once.
        check("closeListen", unsafe {
            (self.shared().close_listen)(listen.0)
        })
    }
}

/// Repeats a call that may answer "not yet" (`Ok(None)`) until it gives a value, fails, or
/// the deadline passes (then a [`CallError`] with code -1), yielding between tries.
pub fn until<T>(
    call: &'static str,
    deadline: Instant,
    mut f: impl FnMut() -> CallResult<Option<T>>,
) -> CallResult<T> {
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(CallError { call, code: -1 });
        }
        std::thread::yield_now();
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local message.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL dlerror result is a valid C string.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Hex for passing a handle through a pipe or an environment variable.
pub fn handle_to_hex(h: &[u8; NET_HANDLE_MAXSIZE]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn handle_from_hex(s: &str) -> Option<[u8; NET_HANDLE_MAXSIZE]> {
    let s = s.trim();
    if s.len() != NET_HANDLE_MAXSIZE * 2 {
        return None;
    }
    let mut out = [0u8; NET_HANDLE_MAXSIZE];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}
