//! The C ABI: one table per NCCL net API version, `ncclNetPlugin_v6` … `ncclNetPlugin_v12`
//! (NCCL looks up the newest it knows), over one version-free API written against the
//! newest types (sizes `size_t`, a context per communicator, profiler handles).
//!
//! This module is that API: each function checks NCCL's pointers and calls `plugin`,
//! `connection`, `comm` and `mr`. The version modules hold the tables, whose entries are
//! adapters of a few lines (type widths, arguments a version lacks, its properties layout),
//! each inside [`boundary`], which turns an error into its `ncclResult_t` plus one WARN
//! line, and a panic into `ncclInternalError`: nothing unwinds into NCCL. Entry points every
//! version shares unchanged are defined here once.

mod props;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

use crate::comm::{Buffer, Comm, Descs, Direction, Registered, Request, MAX_RECVS, NO_DESCS};
use crate::connection::{self, ListenComm};
use crate::device::Properties;
use crate::error::{Error, Result};
use crate::gdr::Side;
use crate::mr::{cuda_device_of, Memory, MemoryRegion};
use crate::nccl::{self, DeviceHandleV8, Logger, NcclResult, ProfilerFn};
use crate::opaque;
use crate::plugin;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;

/// Runs an entry point's body: errors become their `ncclResult_t` and a WARN line, panics
/// become `ncclInternalError`.
pub(crate) fn boundary(call: &'static str, body: impl FnOnce() -> Result<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NcclResult::Success as c_int,
        Ok(Err(e)) => {
            tracing::warn!("{call}: {e}");
            e.nccl_result() as c_int
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // Logging itself must not unwind out of here either.
            let _ = catch_unwind(|| {
                tracing::warn!(
                    "{call}: internal error ({what}); this is a plugin bug, please report it"
                )
            });
            NcclResult::InternalError as c_int
        }
    }
}

/// Writes through an out-pointer NCCL passed, refusing NULL.
///
/// # Safety
/// `p` must be NULL or valid for writing a `T`.
pub(crate) unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: per the caller, p is NULL or valid for writes.
    unsafe { p.as_mut() }.ok_or_else(|| Error::InvalidArgument(format!("{what} is NULL")))
}

/// The name every table carries (what `NCCL_NET=Fabric` selects).
pub(crate) const NAME: &std::ffi::CStr = c"Fabric";

/// The profiler callback NCCL passed at init (v10+), or NULL.
static PROFILER: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `init` of every version: NCCL's logger, and its profiler callback (v10+; NULL: none).
pub(crate) fn init(logger: Logger, profiler: ProfilerFn) -> Result<()> {
    crate::log::init_nccl(logger);
    PROFILER.store(
        profiler.map_or(std::ptr::null_mut(), |f| f as *mut c_void),
        Ordering::Release,
    );
    plugin::init().map(|_| ())
}

fn profiler() -> ProfilerFn {
    let p = PROFILER.load(Ordering::Acquire);
    // SAFETY: PROFILER only ever holds NULL or a callback NCCL passed at init, of this type.
    (!p.is_null()).then(|| unsafe {
        std::mem::transmute::<
            *mut c_void,
            unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> c_int,
        >(p)
    })
}

/// Starts a profiler event per buffer of a request just posted, with the handles NCCL gave.
///
/// # Safety
/// `request` is a request this plugin just returned; `phandles` NULL or one per buffer.
unsafe fn profile_start(request: *mut c_void, phandles: &[*mut c_void], bufs: &[Buffer], kind: u8) {
    let Some(f) = profiler() else { return };
    // SAFETY: per the caller.
    let Ok(req) = (unsafe { Request::from_handle(request) }) else {
        return;
    };
    for (i, (event, b)) in req.events().zip(bufs).enumerate() {
        let phandle = phandles.get(i).copied().unwrap_or(std::ptr::null_mut());
        let mut descr = nccl::ProfilerDescrV1 {
            kind,
            part: i as i32,
            tag: b.tag,
            length: b.len,
        };
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL's callback; descr lives through the call, handle is ours to keep.
        unsafe {
            f(
                &mut handle,
                nccl::profiler::START,
                phandle,
                nccl::profiler::PLUGIN_ID,
                (&raw mut descr).cast(),
            )
        };
        event.store(handle, Ordering::Release);
    }
}

/// Stops the profiler events of a request that is done.
fn profile_stop(req: &Request) {
    let Some(f) = profiler() else { return };
    for event in req.events() {
        let mut handle = event.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !handle.is_null() {
            // SAFETY: NCCL's callback with the handle its start gave.
            unsafe {
                f(
                    &mut handle,
                    nccl::profiler::STOP,
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                )
            };
        }
    }
}

/// What `init` hands NCCL as the communicator's context (v11+).
struct Context {
    comm_id: u64,
}

impl crate::opaque::Kind for Context {
    const MAGIC: u64 = 0x4e46_4142_4354_5831; // "NFABCTX1"
    const NAME: &'static str = "context";
}

/// Contexts NCCL holds: when the last one is finalized, what closed comms left behind is
/// released.
static CONTEXTS: AtomicUsize = AtomicUsize::new(0);

/// `init` of v11+: per communicator, with a context.
///
/// # Safety
/// `ctx` is NULL or NCCL's out-pointer for the context.
pub(crate) unsafe fn init_context(
    ctx: *mut *mut c_void,
    comm_id: u64,
    logger: Logger,
    profiler: ProfilerFn,
) -> Result<()> {
    // SAFETY: per the caller.
    let slot = unsafe { out(ctx, "ctx")? };
    *slot = std::ptr::null_mut();
    init(logger, profiler)?;
    tracing::debug!("init for communicator {comm_id:#x}");
    *slot = opaque::into_raw(Context { comm_id });
    CONTEXTS.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// `finalize` (v11+).
pub(crate) unsafe extern "C" fn finalize(ctx: *mut c_void) -> c_int {
    boundary("finalize", || {
        // A failed init left no context: nothing to release.
        if ctx.is_null() {
            return Ok(());
        }
        // SAFETY: NCCL passes back the context init gave it, once.
        let c = unsafe { opaque::take::<Context>(ctx)? };
        tracing::debug!("finalize for communicator {:#x}", c.comm_id);
        // Devices and endpoints stay for other and later communicators; what closed comms
        // left behind goes with the last context.
        if CONTEXTS.fetch_sub(1, Ordering::AcqRel) == 1 {
            plugin::release_leftovers();
        }
        Ok(())
    })
}

/// `setNetAttr` (v11+): traffic hints (peers, flows per peer) do not change how this plugin
/// posts.
pub(crate) unsafe extern "C" fn set_net_attr(_ctx: *mut c_void, _attr: *mut c_void) -> c_int {
    boundary("setNetAttr", || Ok(()))
}

/// `getProperties` of every version, in the layout `convert` makes.
///
/// # Safety
/// `props` is NULL or NCCL's pointer to a properties struct of type `T`.
pub(crate) unsafe fn properties<T>(
    dev: c_int,
    props: *mut T,
    convert: fn(&Properties, c_int) -> T,
) -> Result<()> {
    let plugin = plugin::get()?;
    let device = plugin.device(dev)?;
    // SAFETY: per the caller.
    *unsafe { out(props, "props") }? = convert(&device.props, dev);
    Ok(())
}

pub(crate) unsafe extern "C" fn devices(ndev: *mut c_int) -> c_int {
    boundary("devices", || {
        let n = plugin::get()?.devices.len();
        // SAFETY: NCCL passes a pointer to an int.
        *unsafe { out(ndev, "ndev") }? = c_int::try_from(n).unwrap_or(c_int::MAX);
        Ok(())
    })
}

/// # Safety
/// `handle` must be NULL or point to `NCCL_NET_HANDLE_MAXSIZE` writable (or readable) bytes.
pub(crate) unsafe fn handle_bytes<'a>(
    handle: *mut c_void,
) -> Result<&'a mut [u8; nccl::NET_HANDLE_MAXSIZE]> {
    // SAFETY: per the caller; NCCL's handle buffers are NCCL_NET_HANDLE_MAXSIZE bytes.
    unsafe { out(handle.cast::<[u8; nccl::NET_HANDLE_MAXSIZE]>(), "handle") }
}

/// `listen` of every version (v11+ pass a context first, which it does not need).
pub(crate) unsafe extern "C" fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> c_int {
    boundary("listen", || {
        // SAFETY: NCCL passes its handle buffer and an out-pointer.
        let (handle, slot) = unsafe { (handle_bytes(handle)?, out(listen_comm, "listenComm")?) };
        *slot = std::ptr::null_mut();
        let l = connection::listen(&*plugin::get()?, dev, handle)?;
        *slot = opaque::into_raw(l);
        Ok(())
    })
}

/// `connect` of every version (v6 has no device handle, v10 passes a comm config first,
/// v11+ a context: a host plugin needs neither).
pub(crate) unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut DeviceHandleV8,
) -> c_int {
    boundary("connect", || {
        // SAFETY: NULL or NCCL's out-pointer; a host plugin has no device handle.
        if let Some(d) = unsafe { send_dev_comm.as_mut() } {
            *d = std::ptr::null_mut();
        }
        // SAFETY: NCCL passes the peer's handle and an out-pointer.
        let (handle, slot) = unsafe { (handle_bytes(handle)?, out(send_comm, "sendComm")?) };
        *slot = std::ptr::null_mut();
        if let Some(comm) = connection::connect(&*plugin::get()?, dev, handle)? {
            *slot = opaque::into_raw(comm);
        }
        Ok(())
    })
}

/// `accept` of every version (v6 has no device handle).
pub(crate) unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    recv_dev_comm: *mut *mut DeviceHandleV8,
) -> c_int {
    boundary("accept", || {
        // SAFETY: NULL or NCCL's out-pointer; a host plugin has no device handle.
        if let Some(d) = unsafe { recv_dev_comm.as_mut() } {
            *d = std::ptr::null_mut();
        }
        // SAFETY: NCCL passes the listenComm we returned and an out-pointer.
        let (l, slot) = unsafe {
            (
                opaque::borrow::<ListenComm>(listen_comm)?,
                out(recv_comm, "recvComm")?,
            )
        };
        *slot = std::ptr::null_mut();
        if let Some(comm) = l.accept(&*plugin::get()?)? {
            *slot = opaque::into_raw(comm);
        }
        Ok(())
    })
}

/// `regMr` of every version (sizes are `int` until v7).
pub(crate) unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> c_int {
    boundary("regMr", || {
        // SAFETY: NCCL passes a send or recv comm we returned and an out-pointer.
        let (comm, slot) =
            unsafe { (opaque::borrow::<Arc<Comm>>(comm)?, out(mhandle, "mhandle")?) };
        *slot = std::ptr::null_mut();
        let plugin = plugin::get()?;
        if let Some(d) = plugin.devices.get(comm.dev) {
            d.buffers.note(
                match comm.dir {
                    Direction::Send => Side::Send,
                    Direction::Recv => Side::Recv,
                },
                kind,
            );
        }
        let memory = match kind {
            nccl::PTR_HOST => Memory::Host,
            nccl::PTR_CUDA if plugin.gpu => Memory::Cuda {
                device: cuda_device_of(data as usize),
            },
            nccl::PTR_CUDA => {
                return Err(Error::InvalidArgument(
                    "CUDA buffer offered, but this plugin told NCCL it takes host buffers only"
                        .into(),
                ))
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown buffer type {other}"
                )))
            }
        };
        // SAFETY: NCCL keeps the buffer allocated until deregMr.
        *slot = opaque::into_raw(unsafe { MemoryRegion::register(comm, data, size, memory)? });
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn reg_mr_dma_buf(
    _comm: *mut c_void,
    _data: *mut c_void,
    _size: usize,
    _kind: c_int,
    _offset: u64,
    _fd: c_int,
    mhandle: *mut *mut c_void,
) -> c_int {
    boundary("regMrDmaBuf", || {
        if let Some(slot) = unsafe { mhandle.as_mut() } {
            *slot = std::ptr::null_mut();
        }
        Err(Error::Internal(
            "DMA-BUF registration was not advertised (ptrSupport has no NCCL_PTR_DMABUF)".into(),
        ))
    })
}

pub(crate) unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> c_int {
    boundary("deregMr", || {
        // SAFETY: NCCL passes the comm and mhandle it got from us.
        unsafe { opaque::borrow::<Arc<Comm>>(comm)? };
        // NULL: nothing was registered.
        if !mhandle.is_null() {
            // SAFETY: mhandle came from reg_mr and NCCL releases it once.
            drop(unsafe { opaque::take::<MemoryRegion>(mhandle)? });
        }
        Ok(())
    })
}

/// The descriptors of `mhandle` for an operation on `comm` of `len` bytes at `data` (one
/// per leg), whether it is host memory, and where the comm's domains claim `FI_MR_LOCAL`
/// the registration itself (see `comm::Registered`). Without an mhandle (NCCL always gives
/// one; other callers may not) on such a comm, the comm registers the host buffer itself,
/// once per address and length.
///
/// # Safety
/// `mhandle` must be NULL or a registration we returned.
unsafe fn desc_of(
    comm: &Comm,
    mhandle: *mut c_void,
    data: *mut c_void,
    len: usize,
) -> Result<(Descs, bool, Option<*const dyn Registered>)> {
    let needs = comm.needs_descs();
    if mhandle.is_null() {
        if len == 0 || !needs {
            return Ok((NO_DESCS, true, None));
        }
        let region = comm.adhoc(data as usize, len, || {
            // SAFETY: only domains whose registrations pin nothing claim FI_MR_LOCAL
            // (`quirks::claim_local_mr`: tcp), so a registration that outlives the buffer
            // is only an entry in the provider's key map; while the buffer lives it is
            // valid for `len` bytes (the caller's promise for the operation).
            let r = unsafe { MemoryRegion::register(comm, data, len, Memory::Host)? };
            Ok(Arc::new(r) as Arc<dyn Registered>)
        })?;
        // The comm holds the registration until it closes, past this operation's posting.
        let at = Arc::as_ptr(&region);
        return Ok((region.descs(), true, Some(at)));
    }
    // SAFETY: per the caller.
    match unsafe { opaque::borrow::<MemoryRegion>(mhandle)? } {
        region if region.fits(comm) => Ok((
            region.descs(),
            region.memory == Memory::Host,
            needs.then_some(region as &dyn Registered as *const dyn Registered),
        )),
        _ => Err(Error::InvalidArgument(
            "the mhandle was registered on another comm (each comm's endpoints have \
             libfabric domains of their own): register the buffer with regMr on the comm \
             that uses it"
                .into(),
        )),
    }
}

/// Sizes as NCCL passes them: `int` up to v8, `size_t` from v9 on.
pub(crate) fn byte_count(size: impl TryInto<usize> + Copy + std::fmt::Display) -> Result<usize> {
    match size.try_into() {
        Ok(n) if n <= crate::device::MAX_MESSAGE_BYTES => Ok(n),
        _ => Err(Error::InvalidArgument(format!(
            "message size {size} is negative or above {} bytes",
            crate::device::MAX_MESSAGE_BYTES
        ))),
    }
}

/// The comm behind a pointer, if it goes the way `want` says.
///
/// # Safety
/// `comm` is NULL or a pointer NCCL got from us.
unsafe fn comm_for<'a>(comm: *mut c_void, want: Direction) -> Result<&'a Arc<Comm>> {
    // SAFETY: per the caller.
    let c = unsafe { opaque::borrow::<Arc<Comm>>(comm)? };
    if c.dir != want {
        return Err(Error::InvalidArgument(format!(
            "{want:?} called on a {:?} comm",
            c.dir
        )));
    }
    Ok(c)
}

/// Posts `bufs` on `comm`, writes the request (NULL: call again) and starts profiler events.
///
/// # Safety
/// Each buffer valid until its request completes; `request` NCCL's out-pointer.
unsafe fn post(
    comm: &Arc<Comm>,
    bufs: &[Buffer],
    phandles: &[*mut c_void],
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: per the caller.
    let slot = unsafe { out(request, "request")? };
    // NCCL may pre-set a receive request as a hint (v9+); we always write ours.
    *slot = std::ptr::null_mut();
    // SAFETY: per the caller.
    *slot = unsafe { comm.post(bufs)? }.unwrap_or(std::ptr::null_mut());
    if !slot.is_null() {
        let kind = match comm.dir {
            Direction::Send => nccl::profiler::SEND,
            Direction::Recv => nccl::profiler::RECV,
        };
        // SAFETY: the request was just returned by post.
        unsafe { profile_start(*slot, phandles, bufs, kind) };
    }
    Ok(())
}

/// `isend` of every version, with `size_t` sizes and a profiler handle (NULL before v10).
///
/// # Safety
/// As NCCL calls it: a sendComm of ours, a buffer valid until the request is done, the
/// mhandle regMr gave for it (or NULL), an out-pointer.
pub(crate) unsafe fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: per the caller.
    let comm = unsafe { comm_for(send_comm, Direction::Send)? };
    // SAFETY: NCCL passes the mhandle regMr gave it, or NULL.
    let len = byte_count(size)?;
    // SAFETY: NCCL passes the mhandle regMr gave it, or NULL.
    let (descs, host, starts) = unsafe { desc_of(comm, mhandle, data, len)? };
    let buf = Buffer {
        data,
        len,
        descs,
        starts,
        host,
        tag,
    };
    // SAFETY: per the caller.
    unsafe { post(comm, &[buf], &[phandle], request) }
}

/// The sizes array of an `irecv`: `int` until v8, `size_t` after.
#[derive(Clone, Copy)]
pub(crate) enum Lengths {
    Int(*mut c_int),
    Size(*mut usize),
}

/// `irecv` of every version: `n` buffers (up to `maxRecvs`), each taking the send with its
/// tag.
///
/// # Safety
/// As NCCL calls it: a recvComm of ours and arrays of `n` entries (`mhandles` and
/// `phandles` may be NULL), buffers valid until the request is done, an out-pointer.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: Lengths,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: per the caller.
    let comm = unsafe { comm_for(recv_comm, Direction::Recv)? };
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_RECVS).contains(n))
        .ok_or_else(|| {
            Error::InvalidArgument(format!("irecv of {n} buffers (1 to {MAX_RECVS})"))
        })?;
    let mut bufs = [Buffer {
        data: std::ptr::null_mut(),
        len: 0,
        descs: NO_DESCS,
        starts: None,
        host: true,
        tag: 0,
    }; MAX_RECVS];
    let mut ph = [std::ptr::null_mut(); MAX_RECVS];
    let missing = match sizes {
        Lengths::Int(p) => p.is_null(),
        Lengths::Size(p) => p.is_null(),
    };
    if data.is_null() || missing {
        return Err(Error::InvalidArgument(
            "irecv without buffers or sizes".into(),
        ));
    }
    // An optional array's i-th entry, or `none`.
    // SAFETY (of the calls below): per the caller, each non-NULL array has n entries.
    let nth = |a: *mut *mut c_void, i: usize| match a.is_null() {
        true => std::ptr::null_mut(),
        false => unsafe { *a.add(i) },
    };
    for (i, b) in bufs.iter_mut().enumerate().take(n) {
        // SAFETY: per the caller, data, sizes (and tags, if not NULL) have n entries.
        let (len, tag) = unsafe {
            let len = match sizes {
                Lengths::Int(p) => byte_count(*p.add(i))?,
                Lengths::Size(p) => byte_count(*p.add(i))?,
            };
            (len, if tags.is_null() { 0 } else { *tags.add(i) })
        };
        // SAFETY: NCCL passes the mhandles regMr gave it, or NULL. A receive's registration
        // may begin anywhere: only sends name where the peer reads.
        let (descs, host, _) = unsafe { desc_of(comm, nth(mhandles, i), nth(data, i), len)? };
        *b = Buffer {
            data: nth(data, i),
            len,
            descs,
            starts: None,
            host,
            tag,
        };
        ph[i] = nth(phandles, i);
    }
    note_group(n);
    // SAFETY: per the caller.
    unsafe { post(comm, &bufs[..n], &ph[..n], request) }
}

/// Says (INFO, once per size) that NCCL grouped this many buffers in one receive: whether
/// NCCL uses grouped receives at all depends on its connection sharing (PXN, p2p).
fn note_group(n: usize) {
    static LARGEST: AtomicUsize = AtomicUsize::new(1);
    if n > LARGEST.fetch_max(n, Ordering::AcqRel) {
        tracing::info!("NCCL posted a grouped receive of {n} buffers (maxRecvs {MAX_RECVS})");
    }
}

pub(crate) unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    boundary("iflush", || {
        // SAFETY: NCCL passes a recvComm we returned and an out-pointer.
        let (_, slot) = unsafe {
            (
                opaque::borrow::<Arc<Comm>>(recv_comm)?,
                out(request, "request")?,
            )
        };
        // Received data is already where NCCL reads it: nothing to flush ("already done").
        *slot = std::ptr::null_mut();
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> c_int {
    boundary("test", || {
        // SAFETY: NCCL passes a request we returned and an out-pointer for `done`.
        let (req, done) = unsafe { (Request::from_handle(request)?, out(done, "done")?) };
        *done = 0;
        let result = req.test();
        if !matches!(result, Ok(None)) {
            profile_stop(req);
        }
        if let Some(s) = result? {
            *done = 1;
            // NCCL passes one size slot per buffer of the request, or NULL.
            if !sizes.is_null() {
                for (i, &n) in s.bytes[..s.n].iter().enumerate() {
                    // SAFETY: NCCL's array has an entry per buffer it posted.
                    unsafe { *sizes.add(i) = c_int::try_from(n).unwrap_or(c_int::MAX) };
                }
            }
        }
        Ok(())
    })
}

/// # Safety
/// `comm` must be NULL or a comm we returned that NCCL closes once.
unsafe fn close_comm(comm: *mut c_void, want: Direction) -> Result<()> {
    // SAFETY: per the caller.
    let c = unsafe { opaque::borrow::<Arc<Comm>>(comm)? };
    if c.dir != want {
        return Err(Error::InvalidArgument(format!(
            "close{want:?} called on a {:?} comm",
            c.dir
        )));
    }
    // SAFETY: comm came from connect/accept; NCCL gives it back once.
    unsafe { opaque::take::<Arc<Comm>>(comm)? }.close();
    Ok(())
}

pub(crate) unsafe extern "C" fn close_send(comm: *mut c_void) -> c_int {
    // SAFETY: NCCL passes a sendComm we returned, once.
    boundary("closeSend", || unsafe { close_comm(comm, Direction::Send) })
}

pub(crate) unsafe extern "C" fn close_recv(comm: *mut c_void) -> c_int {
    // SAFETY: NCCL passes a recvComm we returned, once.
    boundary("closeRecv", || unsafe { close_comm(comm, Direction::Recv) })
}

pub(crate) unsafe extern "C" fn close_listen(listen_comm: *mut c_void) -> c_int {
    boundary("closeListen", || {
        // SAFETY: NCCL passes a listenComm we returned, once.
        unsafe { opaque::take::<ListenComm>(listen_comm)? }.close();
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn get_device_mr(
    _comm: *mut c_void,
    _mhandle: *mut c_void,
    dptr: *mut *mut c_void,
) -> c_int {
    boundary("getDeviceMr", || {
        // A host plugin has no device-side handles.
        if let Some(slot) = unsafe { dptr.as_mut() } {
            *slot = std::ptr::null_mut();
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn irecv_consumed(
    _recv_comm: *mut c_void,
    _n: c_int,
    _request: *mut c_void,
) -> c_int {
    // Receives are finished when test() says so; nothing more to release.
    NcclResult::Success as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_maps_errors_and_catches_panics() {
        assert_eq!(boundary("t", || Ok(())), 0);
        let invalid = boundary("t", || Err(Error::InvalidArgument("bad".into())));
        assert_eq!(invalid, NcclResult::InvalidArgument as c_int);
        let remote = boundary("t", || Err(Error::Remote("gone".into())));
        assert_eq!(remote, NcclResult::RemoteError as c_int);
        let panicked = boundary("t", || panic!("a bug"));
        assert_eq!(panicked, NcclResult::InternalError as c_int);
    }
}
