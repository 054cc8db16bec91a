//! Logging: every message goes through `tracing`; this module decides where it lands.
//!
//! Inside NCCL (after `init` hands us its logger) events are forwarded to NCCL's logger with
//! level WARN/INFO/TRACE, subsystem `INIT|NET`, format `"%s"` and the prefix `NET/Fabric`.
//! Outside NCCL (tests, the command-line tool) they are printed to stderr, filtered by
//! `NCCL_FABRIC_LOG` (`off`, `warn`, `info`, `debug`, `trace`; default `warn`).

use crate::nccl::{self, Logger};
use parking_lot::RwLock;
use std::ffi::{c_int, CString};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Prefix of every line the plugin writes.
pub const PREFIX: &str = "NET/Fabric";

/// Max level enabled, as 0 = off, 1 = error/warn, 2 = info, 3 = debug, 4 = trace.
static MAX_LEVEL: AtomicU8 = AtomicU8::new(1);
static NCCL_LOGGER: RwLock<Logger> = RwLock::new(None);
static INSTALLED: OnceLock<()> = OnceLock::new();

fn rank(level: &Level) -> u8 {
    match *level {
        Level::ERROR | Level::WARN => 1,
        Level::INFO => 2,
        Level::DEBUG => 3,
        Level::TRACE => 4,
    }
}

fn parse_rank(text: &str) -> Option<u8> {
    Some(match text.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => 0,
        "warn" | "error" => 1,
        "info" => 2,
        "debug" => 3,
        "trace" => 4,
        _ => return None,
    })
}

/// The subscriber behind every `tracing` macro in this crate.
struct Sink;

impl Subscriber for Sink {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        rank(metadata.level()) <= MAX_LEVEL.load(Ordering::Relaxed)
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = String::with_capacity(128);
        event.record(&mut Fields(&mut text));
        let meta = event.metadata();
        let logger = *NCCL_LOGGER.read();
        match logger {
            Some(log) => forward_to_nccl(log, meta, &text),
            None => eprintln!("{PREFIX} {}: {text}", meta.level()),
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Formats an event's fields as `message key=value …`.
struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }
}

fn forward_to_nccl(
    log: unsafe extern "C" fn(
        c_int,
        std::ffi::c_ulong,
        *const std::ffi::c_char,
        c_int,
        *const std::ffi::c_char,
        ...
    ),
    meta: &Metadata<'_>,
    text: &str,
) {
    let level = match *meta.level() {
        Level::ERROR | Level::WARN => nccl::level::WARN,
        Level::INFO => nccl::level::INFO,
        Level::DEBUG | Level::TRACE => nccl::level::TRACE,
    };
    let flags = (nccl::subsys::INIT | nccl::subsys::NET) as std::ffi::c_ulong;
    let message = CString::new(format!("{PREFIX} : {text}").replace('\0', " ")).unwrap_or_default();
    let file = CString::new(meta.file().unwrap_or("nccl-net-fabric")).unwrap_or_default();
    let line = meta.line().map_or(0, |l| c_int::try_from(l).unwrap_or(0));
    // SAFETY: `log` is the logger NCCL passed to init; NCCL keeps it valid while the plugin is
    // loaded. The format is the literal "%s" and the single vararg is a NUL-terminated string,
    // so no '%' in the message is ever interpreted.
    unsafe {
        log(
            level,
            flags,
            file.as_ptr(),
            line,
            c"%s".as_ptr(),
            message.as_ptr(),
        )
    };
}

fn install() {
    INSTALLED.get_or_init(|| {
        // Fails only if a subscriber was set already (a host binary of ours did it): keep that.
        let _ = tracing::subscriber::set_global_default(Sink);
    });
}

/// Sends events to stderr, at the level `NCCL_FABRIC_LOG` names (default `warn`).
pub fn init_stderr() {
    let level = std::env::var("NCCL_FABRIC_LOG")
        .ok()
        .and_then(|v| parse_rank(&v))
        .unwrap_or(1);
    MAX_LEVEL.store(level, Ordering::Relaxed);
    install();
    tracing::callsite::rebuild_interest_cache();
}

/// Sends events to NCCL's logger, at the level `NCCL_DEBUG` asks for.
/// Without a logger (a host that passes NULL) events go to stderr as with [`init_stderr`].
pub fn init_nccl(logger: Logger) {
    if logger.is_none() {
        *NCCL_LOGGER.write() = None;
        return init_stderr();
    }
    let level = match std::env::var("NCCL_DEBUG").map(|v| v.to_ascii_uppercase()) {
        Ok(v) if v == "TRACE" => 4,
        Ok(v) if v == "INFO" => 2,
        _ => 1,
    };
    *NCCL_LOGGER.write() = logger;
    MAX_LEVEL.store(level, Ordering::Relaxed);
    install();
    tracing::callsite::rebuild_interest_cache();
}

/// Lets a repeated warning through at most once per period, counting the ones held back.
pub struct Throttle {
    every: std::time::Duration,
    last: Option<std::time::Instant>,
    held: u64,
}

impl Throttle {
    pub fn new(every: std::time::Duration) -> Self {
        Throttle {
            every,
            last: None,
            held: 0,
        }
    }

    /// `Some(n)`: warn now, `n` warnings were held back since the last one; `None`: hold
    /// this one back.
    pub fn allow(&mut self) -> Option<u64> {
        let now = std::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}
