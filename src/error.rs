//! One error type for the plugin, and the one mapping from it to `ncclResult_t`.

use crate::nccl::NcclResult;
use std::ffi::CStr;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libfabric call returned a negative errno.
    #[error("{call} failed: {} ({code})", fi_strerror(*code))]
    Fabric { call: &'static str, code: i32 },

    /// A completion came back with an error (`fi_cq_readerr`).
    #[error("{op} of {len} bytes {peer} failed: {text} (err {code}, provider err {prov_errno})")]
    Completion {
        op: &'static str,
        len: usize,
        peer: String,
        code: i32,
        prov_errno: i32,
        text: String,
    },

    /// A receive buffer smaller than the message sent into it.
    #[error("{}", truncated_text(.posted, .sent, .peer))]
    Truncated {
        posted: usize,
        /// The message's size, when known.
        sent: Option<usize>,
        peer: String,
    },

    /// The peer went away or stopped answering.
    #[error("{0}")]
    Remote(String),

    /// No libfabric provider/domain can carry NCCL traffic under the current settings.
    #[error("{0}")]
    NoProvider(String),

    /// A setting the user gave cannot be used.
    #[error("{0}")]
    InvalidUsage(String),

    /// NCCL handed us something malformed (a bad handle, a null pointer, an unknown device).
    #[error("{0}")]
    InvalidArgument(String),

    /// An entry point called before `init`, or a panic caught at the C boundary.
    #[error("{0}")]
    Internal(String),
}

fn truncated_text(posted: &usize, sent: &Option<usize>, peer: &str) -> String {
    let sent = match sent {
        Some(n) => format!("{n} bytes were sent"),
        None => "the sender sent more".into(),
    };
    format!(
        "receive of {posted} bytes {peer} was truncated: {sent}; NCCL posts receives at least \
         as large as their sends, so the ranks disagree on buffer sizes (run every rank with \
         the same NCCL and NCCL_* settings)"
    )
}

impl Error {
    pub fn fabric(call: &'static str, ret: impl Into<i64>) -> Self {
        let ret = ret.into();
        Error::Fabric {
            call,
            code: i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX),
        }
    }

    /// The `ncclResult_t` NCCL should see for this error.
    pub fn nccl_result(&self) -> NcclResult {
        match self {
            Error::Fabric { .. } | Error::NoProvider(_) => NcclResult::SystemError,
            Error::Completion { .. } | Error::Remote(_) => NcclResult::RemoteError,
            Error::InvalidUsage(_) => NcclResult::InvalidUsage,
            Error::InvalidArgument(_) => NcclResult::InvalidArgument,
            Error::Truncated { .. } | Error::Internal(_) => NcclResult::InternalError,
        }
    }
}

/// libfabric's text for a (positive) errno, `fi_strerror`.
pub fn fi_strerror(code: i32) -> String {
    // SAFETY: fi_strerror accepts any int and returns a pointer to a static NUL-terminated
    // string (or a thread-local buffer for unknown values) that stays valid until the next call
    // on this thread; it is copied at once.
    unsafe {
        let p = crate::sys::fi_strerror(code);
        if p.is_null() {
            return format!("errno {code}");
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Turns a libfabric return value into `Ok(value)` or an [`Error::Fabric`] naming the call.
pub fn check(call: &'static str, ret: impl Into<i64>) -> Result<i64> {
    let ret = ret.into();
    if ret < 0 {
        Err(Error::fabric(call, ret))
    } else {
        Ok(ret)
    }
}
