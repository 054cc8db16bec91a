//! Sends and receives: `isend`, `irecv` (grouped receives included), `iflush`, `test` and
//! `irecvConsumed`, with the checks of NCCL's sizes and comms they share.

use super::boundary::{boundary, out};
use super::profiler::{profile_start, profile_stop};
use super::registration::desc_of;
use crate::comm::{Buffer, Comm, Direction, Request, MAX_RECVS, NO_DESCS};
use crate::error::{Error, Result};
use crate::nccl::{self, NcclResult};
use crate::opaque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

pub(crate) unsafe extern "C" fn irecv_consumed(
    _recv_comm: *mut c_void,
    _n: c_int,
    _request: *mut c_void,
) -> c_int {
    // Receives are finished when test() says so; nothing more to release.
    NcclResult::Success as c_int
}
