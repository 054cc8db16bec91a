//! `ncclTunerPlugin_v5`: NCCL 2.28 and later load a tuner from the net plugin's library when
//! `NCCL_TUNER_PLUGIN` is unset. Unless `NCCL_FABRIC_TUNER_BELOW_BYTES` is set, it leaves
//! every choice to NCCL; set, it runs shorter collectives on fewer channels
//! (`sizing::tuner_channels`), for channels connected beyond what those need.

use super::boundary::{boundary, out};
use crate::error::Error;
use crate::nccl::{Logger, TunerV5};
use crate::settings::Settings;
use std::ffi::{c_int, c_void};
use std::sync::Once;

/// One communicator's tuner: what the settings asked for when NCCL made it.
struct Tuner {
    below: u64,
    channels: usize,
}

/// Says once per process what the tuner does.
fn tell(t: &Tuner) {
    static TOLD: Once = Once::new();
    TOLD.call_once(|| match t.below {
        0 => tracing::info!(
            "tuner: NCCL's own choices for every collective (NCCL_FABRIC_TUNER_BELOW_BYTES unset)"
        ),
        b => tracing::info!(
            "tuner: collectives under {b} bytes on at most {} channel(s) \
             (NCCL_FABRIC_TUNER_BELOW_BYTES, NCCL_FABRIC_TUNER_CHANNELS)",
            t.channels
        ),
    });
}

unsafe extern "C" fn init(
    context: *mut *mut c_void,
    _comm_id: u64,
    _ranks: usize,
    _nodes: usize,
    _logger: Logger,
    _nvl_domains: *mut c_void,
    _constants: *mut c_void,
) -> c_int {
    boundary("tuner init", || {
        // SAFETY: NCCL passes where to keep the context, NULL checked.
        let slot = unsafe { out(context, "the tuner's context")? };
        // NCCL fails the communicator when its tuner fails to start: settings that cannot be
        // read (init has already said why) leave every choice to NCCL.
        let t = match Settings::from_env() {
            Ok(s) => Tuner {
                below: s.tuner_below_bytes,
                channels: s.tuner_channels,
            },
            Err(_) => Tuner {
                below: 0,
                channels: 1,
            },
        };
        tell(&t);
        *slot = Box::into_raw(Box::new(t)).cast();
        Ok(())
    })
}

unsafe extern "C" fn get_coll_info(
    context: *mut c_void,
    _coll: c_int,
    bytes: usize,
    _pipe_ops: c_int,
    _costs: *mut *mut f32,
    _algos: c_int,
    _protos: c_int,
    _reg_buff: c_int,
    channels: *mut c_int,
) -> c_int {
    boundary("tuner getCollInfo", || {
        // SAFETY: NCCL passes the context our init made, which lives until finalize.
        let t = unsafe { context.cast::<Tuner>().as_ref() }
            .ok_or_else(|| Error::InvalidArgument("the tuner's context is NULL".into()))?;
        // SAFETY: NCCL passes where the channel count goes, NULL checked.
        let count = unsafe { out(channels, "nChannels")? };
        if let Some(n) = crate::sizing::tuner_channels(bytes as u64, t.below, t.channels) {
            *count = c_int::try_from(n).unwrap_or(c_int::MAX);
        }
        Ok(())
    })
}

unsafe extern "C" fn finalize(context: *mut c_void) -> c_int {
    boundary("tuner finalize", || {
        if !context.is_null() {
            // SAFETY: made by Box::into_raw in init; NCCL finalizes each context once.
            drop(unsafe { Box::from_raw(context.cast::<Tuner>()) });
        }
        Ok(())
    })
}

/// The tuner NCCL 2.28+ finds beside the net tables.
#[no_mangle]
#[used]
pub static ncclTunerPlugin_v5: TunerV5 = TunerV5 {
    name: super::NAME.as_ptr(),
    init,
    get_coll_info,
    finalize,
};
