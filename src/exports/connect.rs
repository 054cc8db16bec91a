//! `listen`, `connect` and `accept`, which open comms, and the `close*` entry points that
//! close them.

use super::boundary::{boundary, out};
use crate::comm::{Comm, Direction};
use crate::connection::{self, ListenComm};
use crate::error::{Error, Result};
use crate::nccl::{self, DeviceHandleV8};
use crate::opaque;
use crate::plugin;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

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
