//! `listen`, `connect` and `accept`, one call each, and the `close*` calls.

use crate::error::{check, CallResult};
use crate::nccl::{self, NET_HANDLE_MAXSIZE};
use crate::{PluginLib, Ptr, Table};
use std::ptr;

impl PluginLib {
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
