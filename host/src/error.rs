//! What a call that fails returns: the plugin's `ncclResult_t`, or a deadline passed.

use crate::nccl;
use std::ffi::c_int;

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

pub(crate) fn check(call: &'static str, code: c_int) -> CallResult<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(CallError { call, code })
    }
}
