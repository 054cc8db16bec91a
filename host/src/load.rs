//! Finding the plugin library, opening it as NCCL does (`dlopen`, then the table of one
//! version), closing it, and what its table offers.

use crate::error::{check, CallResult};
use crate::nccl::ProfilerFn;
use crate::{PluginLib, Ptr, Table};
use parking_lot::Mutex;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

impl PluginLib {
    /// Where the plugin may be, relative to the running executable, in order: built by
    /// cargo beside it (`target/<profile>/`, its deps/, or the one above deps/), installed
    /// by `scripts/install.sh` (PREFIX/bin → PREFIX/lib), or by the Debian package
    /// (`/usr/lib/<triplet>`).
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
