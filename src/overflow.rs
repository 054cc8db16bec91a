//! The overflow area: where the bytes of a message longer than its receive land.
//!
//! Every receive is posted as two pieces: NCCL's buffer, then this area. A provider therefore
//! never sees a message larger than the receive it matches (its truncation paths hang shm and
//! crash 2.1 `tcp;ofi_rxm`, see `quirks`); the plugin compares the received length with the
//! size NCCL posted and reports both. The area is one private mapping per process, reserved
//! but not backed: only a truncated message touches its pages, which are then given back.

use std::sync::OnceLock;

/// Size of the area: the longest message NCCL may send (sizes are `int` in `test`).
pub const LEN: usize = 1 << 31;

struct Area(usize);

fn area() -> Option<usize> {
    static AREA: OnceLock<Option<Area>> = OnceLock::new();
    AREA.get_or_init(|| {
        // SAFETY: an anonymous private mapping with no file; MAP_NORESERVE reserves address
        // space only. Failure is reported as MAP_FAILED and handled.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            tracing::warn!(
                "could not reserve the {LEN}-byte overflow area ({}): a message larger than its \
                 receive is left to the provider, which may hang or crash",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Area(p as usize))
    })
    .as_ref()
    .map(|a| a.0)
}

/// The whole area (address and length), to register where a provider needs a descriptor
/// for every buffer; `None` when there is no area.
pub fn whole() -> Option<(*mut u8, usize)> {
    area().map(|a| (a as *mut u8, LEN))
}

/// The area's address and how much of it a receive of `posted` bytes may use, given the
/// provider's largest message; `None` when there is no area.
pub fn for_receive(posted: usize, max_msg_size: usize) -> Option<(*mut u8, usize)> {
    let room = LEN.min(max_msg_size.saturating_sub(posted));
    (room > 0).then_some(())?;
    area().map(|a| (a as *mut u8, room))
}

/// Gives back the pages a truncated message of `excess` bytes wrote into the area.
pub fn release(excess: usize) {
    let Some(a) = area() else { return };
    let len = excess.min(LEN).next_multiple_of(4096).min(LEN);
    // SAFETY: the range lies inside our own mapping; MADV_DONTNEED on private anonymous
    // memory only drops its pages (they read as zero afterwards). A concurrent write by the
    // provider into the same range is harmless: nobody reads the area.
    unsafe { libc::madvise(a as *mut libc::c_void, len, libc::MADV_DONTNEED) };
}
