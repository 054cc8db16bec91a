//! The NCCL side of the ABI: loads a plugin `.so` the way NCCL does (`dlopen` with
//! `RTLD_NOW|RTLD_LOCAL`, then `ncclNetPlugin_v8`) and calls through its table.
//!
//! Used by the demo, the tests and the benchmarks, so they exercise exactly what NCCL
//! exercises. Calls return the plugin's `ncclResult_t` as a [`CallError`] when it is not
//! success; waits take a deadline so nothing built on this can hang.

use crate::nccl::{self, NetV11, NetV8, PropertiesV8, NET_HANDLE_MAXSIZE};
use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;
use std::time::Instant;

extern "C" {
    /// NCCL-style logger from `src/c/host_logger.c`.
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
}

/// A loaded plugin.
pub struct PluginLib {
    handle: *mut c_void,
    table: &'static NetV8,
    v11: Option<&'static NetV11>,
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
    /// The plugin built next to the running executable (target/<profile>/ or its deps/).
    pub fn default_path() -> PathBuf {
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        for d in [
            dir.clone(),
            dir.parent().map(Path::to_path_buf).unwrap_or_default(),
        ] {
            let p = d.join("libnccl_net_fabric.so");
            if p.exists() {
                return p;
            }
        }
        dir.join("libnccl_net_fabric.so")
    }

    /// `dlopen(path, RTLD_NOW|RTLD_LOCAL)` and `dlsym("ncclNetPlugin_v8")`, as NCCL does.
    pub fn open(path: &Path) -> Result<Self, String> {
        let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: dlopen with a NUL-terminated path; failure is reported through dlerror.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("dlopen({}) failed: {}", path.display(), dlerror()));
        }
        // SAFETY: handle is a live library handle; the symbol name is NUL-terminated.
        let sym = unsafe { libc::dlsym(handle, c"ncclNetPlugin_v8".as_ptr()) };
        if sym.is_null() {
            return Err(format!(
                "{} has no ncclNetPlugin_v8: {}",
                path.display(),
                dlerror()
            ));
        }
        // SAFETY: the symbol is the plugin's immutable v8 table, alive while the library is
        // loaded, and the library is never unloaded (see Drop).
        let table = unsafe { &*sym.cast::<NetV8>() };
        // SAFETY: as above, for the v11 table where the plugin has one.
        let v11 = unsafe {
            libc::dlsym(handle, c"ncclNetPlugin_v11".as_ptr())
                .cast::<NetV11>()
                .as_ref()
        };
        Ok(PluginLib { handle, table, v11 })
    }

    /// Looks up any symbol (for checking what the library exports).
    pub fn symbol(&self, name: &str) -> bool {
        let Ok(c) = CString::new(name) else {
            return false;
        };
        // SAFETY: live handle, NUL-terminated name.
        !unsafe { libc::dlsym(self.handle, c.as_ptr()) }.is_null()
    }

    pub fn table(&self) -> &NetV8 {
        self.table
    }

    pub fn name(&self) -> String {
        // SAFETY: the table's name is a static NUL-terminated string.
        unsafe { CStr::from_ptr(self.table.name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `init` with an NCCL-style stderr logger (`with_logger`) or NULL.
    pub fn init(&self, with_logger: bool) -> CallResult<()> {
        let logger: nccl::Logger = if with_logger {
            Some(nccl_net_fabric_host_logger)
        } else {
            None
        };
        // SAFETY: calling the plugin's init as NCCL does.
        check("init", unsafe { (self.table.init)(logger) })
    }

    /// The v11 table's per-communicator `init`, as NCCL 2.28 calls it: returns the context.
    pub fn init_v11(&self, comm_id: u64, with_logger: bool) -> CallResult<Ptr> {
        let v11 = self.v11.ok_or(CallError {
            call: "init(v11)",
            code: -1,
        })?;
        let logger: nccl::Logger = if with_logger {
            Some(nccl_net_fabric_host_logger)
        } else {
            None
        };
        let mut ctx = ptr::null_mut();
        // SAFETY: calling the plugin's v11 init as NCCL does, with an out-pointer.
        check("init(v11)", unsafe {
            (v11.init)(&mut ctx, comm_id, ptr::null_mut(), logger, ptr::null_mut())
        })?;
        Ok(Ptr(ctx))
    }

    /// The v11 table's `finalize` for a context `init_v11` returned.
    pub fn finalize_v11(&self, ctx: Ptr) -> CallResult<()> {
        let v11 = self.v11.ok_or(CallError {
            call: "finalize(v11)",
            code: -1,
        })?;
        // SAFETY: ctx came from init_v11 and is finalized once.
        check("finalize(v11)", unsafe { (v11.finalize)(ctx.0) })
    }

    pub fn devices(&self) -> CallResult<i32> {
        let mut n = 0;
        // SAFETY: n is a valid int out-pointer.
        check("devices", unsafe { (self.table.devices)(&mut n) })?;
        Ok(n)
    }

    pub fn properties(&self, dev: i32) -> CallResult<Properties> {
        // SAFETY: PropertiesV8 is plain data; zeroed is a valid value to be overwritten.
        let mut p: PropertiesV8 = unsafe { std::mem::zeroed() };
        // SAFETY: p is a valid out-struct.
        check("getProperties", unsafe {
            (self.table.get_properties)(dev, &mut p)
        })?;
        let text = |s: *mut std::ffi::c_char| {
            // SAFETY: the plugin returns NUL-terminated strings it keeps alive, or NULL.
            (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
        };
        Ok(Properties {
            name: text(p.name).unwrap_or_default(),
            pci_path: text(p.pci_path),
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: p.reg_is_global,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: p.net_device_type,
            net_device_version: p.net_device_version,
        })
    }

    pub fn listen(&self, dev: i32) -> CallResult<([u8; NET_HANDLE_MAXSIZE], Ptr)> {
        let mut handle = [0u8; NET_HANDLE_MAXSIZE];
        let mut l = ptr::null_mut();
        // SAFETY: handle has NCCL_NET_HANDLE_MAXSIZE bytes; l is an out-pointer.
        check("listen", unsafe {
            (self.table.listen)(dev, handle.as_mut_ptr().cast(), &mut l)
        })?;
        Ok((handle, Ptr(l)))
    }

    /// One `connect` call: `Ok(None)` means "call again".
    pub fn connect(
        &self,
        dev: i32,
        handle: &mut [u8; NET_HANDLE_MAXSIZE],
    ) -> CallResult<Option<Ptr>> {
        let mut s = ptr::null_mut();
        let mut dev_handle: *mut nccl::DeviceHandleV8 = ptr::null_mut();
        // SAFETY: handle is the peer's 128-byte handle; s and dev_handle are out-pointers.
        check("connect", unsafe {
            (self.table.connect)(dev, handle.as_mut_ptr().cast(), &mut s, &mut dev_handle)
        })?;
        Ok((!s.is_null()).then_some(Ptr(s)))
    }

    /// One `accept` call: `Ok(None)` means "call again".
    pub fn accept(&self, listen: Ptr) -> CallResult<Option<Ptr>> {
        let mut r = ptr::null_mut();
        let mut dev_handle: *mut nccl::DeviceHandleV8 = ptr::null_mut();
        // SAFETY: listen came from this plugin's listen; r and dev_handle are out-pointers.
        check("accept", unsafe {
            (self.table.accept)(listen.0, &mut r, &mut dev_handle)
        })?;
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
        // SAFETY: per the caller.
        check("regMr", unsafe {
            (self.table.reg_mr)(comm.0, data, size, kind, &mut mh)
        })?;
        Ok(Ptr(mh))
    }

    pub fn dereg_mr(&self, comm: Ptr, mhandle: Ptr) -> CallResult<()> {
        // SAFETY: mhandle came from reg_mr on comm.
        check("deregMr", unsafe {
            (self.table.dereg_mr)(comm.0, mhandle.0)
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
        let mut req = ptr::null_mut();
        // SAFETY: per the caller.
        check("isend", unsafe {
            (self.table.isend)(comm.0, data, size, 0, mhandle.0, &mut req)
        })?;
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
        let mut req = ptr::null_mut();
        let mut datas = [data];
        let mut sizes = [size];
        let mut tags = [0];
        let mut mhs = [mhandle.0];
        // SAFETY: per the caller; one-element arrays for n = 1.
        check("irecv", unsafe {
            (self.table.irecv)(
                comm.0,
                1,
                datas.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(Ptr(req)))
    }

    /// One `test` call: `Ok(Some(bytes))` when done.
    pub fn test(&self, req: Ptr) -> CallResult<Option<i32>> {
        let mut done = 0;
        let mut size = -1;
        // SAFETY: req came from isend/irecv and has not been reported done yet.
        check("test", unsafe {
            (self.table.test)(req.0, &mut done, &mut size)
        })?;
        Ok((done != 0).then_some(size))
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
        check("closeSend", unsafe { (self.table.close_send)(comm.0) })
    }

    pub fn close_recv(&self, comm: Ptr) -> CallResult<()> {
        // SAFETY: comm is a recvComm of this plugin, closed once.
        check("closeRecv", unsafe { (self.table.close_recv)(comm.0) })
    }

    pub fn close_listen(&self, listen: Ptr) -> CallResult<()> {
        // SAFETY: listen is a listenComm of this plugin, closed once.
        check("closeListen", unsafe {
            (self.table.close_listen)(listen.0)
        })
    }
}

/// Repeats a call that may answer "not yet" (`Ok(None)`) until it gives a value, fails, or
/// the deadline passes (then a [`CallError`] with code -1), yielding between tries.
fn until<T>(
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
