//! NCCL's opaque handles: every pointer the plugin gives NCCL (listen, send and receive
//! comms, memory registrations, contexts, requests) goes out and comes back through here.
//!
//! Objects travel as a boxed `Tagged` value whose first word is a magic number per kind,
//! so a NULL, foreign or wrong-kind pointer is an error, not a misread. Requests are
//! addresses of 64-byte aligned slots with a generation in their low 6 bits, so a pointer
//! to a request that was already reported done is refused even when its slot is in use again.

use crate::error::{Error, Result};
use std::ffi::c_void;

/// A kind of object handed to NCCL.
pub trait Kind: Sized + 'static {
    const MAGIC: u64;
    /// What NCCL calls it (`sendComm`, `mhandle`, …), for error messages.
    const NAME: &'static str;
}

#[repr(C)]
struct Tagged<T> {
    magic: u64,
    value: T,
}

/// Gives `value` to NCCL as an opaque pointer.
pub fn into_raw<T: Kind>(value: T) -> *mut c_void {
    Box::into_raw(Box::new(Tagged {
        magic: T::MAGIC,
        value,
    }))
    .cast()
}

/// Looks at a pointer NCCL handed back.
///
/// # Safety
/// `p` must be NULL or point to at least 8 readable bytes; if it carries `T`'s magic, it
/// must be a pointer [`into_raw`] made for a `T` that [`take`] has not reclaimed.
pub unsafe fn borrow<'a, T: Kind>(p: *mut c_void) -> Result<&'a T> {
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("NULL {}", T::NAME)));
    }
    // SAFETY: per the caller, the first word is readable.
    let magic = unsafe { p.cast::<u64>().read() };
    if magic != T::MAGIC {
        return Err(Error::InvalidArgument(format!(
            "{} pointer {p:p} is not one this plugin gave out",
            T::NAME
        )));
    }
    // SAFETY: the magic says it is a live Tagged<T> (per the caller's guarantee).
    Ok(unsafe { &(*p.cast::<Tagged<T>>()).value })
}

/// Takes back a pointer NCCL gives up (close, deregister, finalize).
///
/// # Safety
/// As [`borrow`]; NCCL hands each pointer back once.
pub unsafe fn take<T: Kind>(p: *mut c_void) -> Result<T> {
    // SAFETY: per the caller.
    unsafe { borrow::<T>(p)? };
    // SAFETY: made by into_raw for a T; the magic is cleared so a second take is refused
    // while the memory has not been reused.
    let mut b = unsafe { Box::from_raw(p.cast::<Tagged<T>>()) };
    b.magic = 0;
    Ok(b.value)
}

/// Request handles: slot address plus generation.
pub mod request {
    /// Slots are aligned to this, leaving the low bits for the generation.
    pub const ALIGN: usize = 64;
    const GEN_MASK: usize = ALIGN - 1;

    pub fn pack<T>(slot: *const T, generation: u32) -> *mut std::ffi::c_void {
        debug_assert_eq!(slot as usize % ALIGN, 0);
        (slot as usize | (generation as usize & GEN_MASK)) as *mut std::ffi::c_void
    }

    /// The slot address and the generation bits of a handle.
    pub fn unpack<T>(handle: *mut std::ffi::c_void) -> (*const T, u32) {
        let h = handle as usize;
        ((h & !GEN_MASK) as *const T, (h & GEN_MASK) as u32)
    }

    /// Whether a slot's current generation is the one a handle carries.
    pub fn matches(current: u32, carried: u32) -> bool {
        current as usize & GEN_MASK == carried as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Thing(u32);
    impl Kind for Thing {
        const MAGIC: u64 = 0x5448_494e_4731;
        const NAME: &'static str = "thing";
    }
    struct Other;
    impl Kind for Other {
        const MAGIC: u64 = 0x4f54_4845_5231;
        const NAME: &'static str = "other";
    }

    #[test]
    fn round_trip_and_wrong_kinds() {
        let p = into_raw(Thing(7));
        // SAFETY: p came from into_raw and is still live.
        unsafe {
            assert_eq!(borrow::<Thing>(p).unwrap().0, 7);
            assert!(borrow::<Other>(p).is_err());
            assert!(borrow::<Thing>(std::ptr::null_mut()).is_err());
            assert_eq!(take::<Thing>(p).unwrap().0, 7);
        }
        let mut junk = [0u64; 4];
        // SAFETY: junk is readable.
        assert!(unsafe { borrow::<Thing>(junk.as_mut_ptr().cast()) }.is_err());
    }

    #[test]
    fn request_generations() {
        #[repr(align(64))]
        struct Slot(#[allow(dead_code)] u8);
        let s = Slot(0);
        let h = request::pack(&s, 65);
        let (p, g) = request::unpack::<Slot>(h);
        assert_eq!(p, &s as *const Slot);
        assert!(request::matches(65, g));
        assert!(!request::matches(66, g));
        assert!(request::matches(1, g), "65 and 1 share their low 6 bits");
    }
}
