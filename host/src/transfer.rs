//! Registrations, sends, receives (grouped ones included) and `test`, adapted to each
//! version's sizes and arguments.

use crate::error::{check, CallResult};
use crate::{PluginLib, Ptr, Table};
use std::ffi::{c_int, c_void};
use std::ptr;

/// One buffer of an [`PluginLib::irecv_group`].
#[derive(Debug, Clone, Copy)]
pub struct RecvBuffer {
    pub data: *mut c_void,
    pub size: usize,
    pub tag: i32,
    pub mhandle: Ptr,
    pub phandle: Ptr,
}

impl PluginLib {
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
}
