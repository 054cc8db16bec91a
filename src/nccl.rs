//! The NCCL net-plugin ABI (see `include/nccl_net.h`) as Rust types.
//!
//! Only layout lives here; behaviour is in `plugin` and the tables in `exports`.

use std::ffi::{c_char, c_int, c_void};

/// `ncclResult_t`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclResult {
    Success = 0,
    UnhandledCudaError = 1,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6,
    InProgress = 7,
}

impl NcclResult {
    /// Reads a raw `ncclResult_t` returned by a plugin table (used by the NCCL-side host).
    pub fn from_raw(v: c_int) -> Option<Self> {
        Some(match v {
            0 => Self::Success,
            1 => Self::UnhandledCudaError,
            2 => Self::SystemError,
            3 => Self::InternalError,
            4 => Self::InvalidArgument,
            5 => Self::InvalidUsage,
            6 => Self::RemoteError,
            7 => Self::InProgress,
            _ => return None,
        })
    }
}

/// `ncclDebugLogLevel`.
pub mod level {
    pub const NONE: i32 = 0;
    pub const VERSION: i32 = 1;
    pub const WARN: i32 = 2;
    pub const INFO: i32 = 3;
    pub const ABORT: i32 = 4;
    pub const TRACE: i32 = 5;
}

/// `ncclDebugLogSubSys` flags.
pub mod subsys {
    pub const INIT: u64 = 0x1;
    pub const NET: u64 = 0x10;
    pub const ENV: u64 = 0x80;
}

pub const NET_HANDLE_MAXSIZE: usize = 128;
pub const PTR_HOST: c_int = 0x1;
pub const PTR_CUDA: c_int = 0x2;
pub const PTR_DMABUF: c_int = 0x4;
pub const NET_MAX_REQUESTS: usize = 32;
pub const NET_DEVICE_HOST: c_int = 0;
pub const NET_DEVICE_INVALID_VERSION: c_int = 0;

/// `ncclDebugLogger_t`: `void (*)(level, flags, file, line, fmt, ...)`.
pub type Logger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: std::ffi::c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclNetProperties_v8_t` (64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetDeviceHandle_v8_t` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceHandleV8 {
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

type R = c_int;

/// `ncclNet_v8_t` (152 bytes): the table NCCL 2.20+ looks up as `ncclNetPlugin_v8`.
#[repr(C)]
pub struct NetV8 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(Logger) -> R,
    pub devices: unsafe extern "C" fn(*mut c_int) -> R,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV8) -> R,
    pub listen: unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> R,
    pub connect:
        unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void, *mut *mut DeviceHandleV8) -> R,
    pub accept: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut *mut DeviceHandleV8) -> R,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, *mut *mut c_void) -> R,
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            usize,
            c_int,
            u64,
            c_int,
            *mut *mut c_void,
        ) -> R,
    >,
    pub dereg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void) -> R,
    pub isend: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        c_int,
        c_int,
        *mut c_void,
        *mut *mut c_void,
    ) -> R,
    pub irecv: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut c_int,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
    pub iflush: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
    pub test: unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> R,
    pub close_send: unsafe extern "C" fn(*mut c_void) -> R,
    pub close_recv: unsafe extern "C" fn(*mut c_void) -> R,
    pub close_listen: unsafe extern "C" fn(*mut c_void) -> R,
    pub get_device_mr:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> R>,
    pub irecv_consumed: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> R>,
}

// SAFETY: the table is immutable and only holds function pointers and a pointer to a
// 'static C string; sharing it between threads is what NCCL does.
unsafe impl Sync for NetV8 {}

/// `ncclNetVDeviceProps_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevicePropsV11 {
    pub ndevs: c_int,
    pub devs: [c_int; 4],
}

/// `ncclNetProperties_v11_t` (112 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDevicePropsV11,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNet_v11_t` (176 bytes): the table NCCL 2.28+ looks up first, as `ncclNetPlugin_v11`.
/// Pointers NCCL passes only through (comm config, profiler callback, net attributes) are
/// `*mut c_void`.
#[repr(C)]
pub struct NetV11 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(*mut *mut c_void, u64, *mut c_void, Logger, *mut c_void) -> R,
    pub devices: unsafe extern "C" fn(*mut c_int) -> R,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV11) -> R,
    pub listen: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut *mut c_void) -> R,
    pub connect: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut DeviceHandleV8,
    ) -> R,
    pub accept: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut *mut DeviceHandleV8) -> R,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, *mut *mut c_void) -> R,
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            usize,
            c_int,
            u64,
            c_int,
            *mut *mut c_void,
        ) -> R,
    >,
    pub dereg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void) -> R,
    pub isend: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        c_int,
        *mut c_void,
        *mut c_void,
        *mut *mut c_void,
    ) -> R,
    pub irecv: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut usize,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
    pub iflush: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
    pub test: unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> R,
    pub close_send: unsafe extern "C" fn(*mut c_void) -> R,
    pub close_recv: unsafe extern "C" fn(*mut c_void) -> R,
    pub close_listen: unsafe extern "C" fn(*mut c_void) -> R,
    pub get_device_mr:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> R>,
    pub irecv_consumed: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> R>,
    pub make_v_device: Option<unsafe extern "C" fn(*mut c_int, *mut VDevicePropsV11) -> R>,
    pub finalize: unsafe extern "C" fn(*mut c_void) -> R,
    pub set_net_attr: Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> R>,
}

// SAFETY: as for NetV8: immutable function pointers and a static name.
unsafe impl Sync for NetV11 {}
