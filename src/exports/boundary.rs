//! The panic boundary every entry point runs in, and NCCL's out-pointers checked for NULL.

use crate::error::{Error, Result};
use crate::nccl::NcclResult;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

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
