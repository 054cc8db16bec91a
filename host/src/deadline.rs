//! Calls repeated until the plugin answers or a deadline passes, so nothing built on the
//! host can hang.

use crate::error::{CallError, CallResult};
use crate::nccl::NET_HANDLE_MAXSIZE;
use crate::{PluginLib, Ptr};
use std::ffi::c_void;
use std::time::Instant;

impl PluginLib {
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
