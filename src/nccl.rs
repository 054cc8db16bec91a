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
type Ptr = *mut c_void;
type Out = *mut *mut c_void;

// Entry points every version shares (`ncclNet_v6_t` … `ncclNet_v12_t`).
pub type DevicesFn = unsafe extern "C" fn(*mut c_int) -> R;
pub type RegMrDmaBufFn = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, c_int, Out) -> R;
pub type DeregMrFn = unsafe extern "C" fn(Ptr, Ptr) -> R;
pub type IflushFn = unsafe extern "C" fn(Ptr, c_int, Out, *mut c_int, Out, Out) -> R;
pub type TestFn = unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int) -> R;
pub type CloseFn = unsafe extern "C" fn(Ptr) -> R;
pub type GetDeviceMrFn = unsafe extern "C" fn(Ptr, Ptr, Out) -> R;
pub type IrecvConsumedFn = unsafe extern "C" fn(Ptr, c_int, Ptr) -> R;
// Up to v9: no context; v6 without device handles.
pub type InitV6Fn = unsafe extern "C" fn(Logger) -> R;
pub type ListenV6Fn = unsafe extern "C" fn(c_int, Ptr, Out) -> R;
pub type ConnectV6Fn = unsafe extern "C" fn(c_int, Ptr, Out) -> R;
pub type AcceptV6Fn = unsafe extern "C" fn(Ptr, Out) -> R;
pub type ConnectV8Fn = unsafe extern "C" fn(c_int, Ptr, Out, *mut *mut DeviceHandleV8) -> R;
pub type AcceptV8Fn = unsafe extern "C" fn(Ptr, Out, *mut *mut DeviceHandleV8) -> R;
// Sizes: `int` until v8 (regMr until v7), `size_t` after.
pub type RegMrIntFn = unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, Out) -> R;
pub type RegMrFn = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Out) -> R;
pub type IsendIntFn = unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, Ptr, Out) -> R;
pub type IrecvIntFn = unsafe extern "C" fn(Ptr, c_int, Out, *mut c_int, *mut c_int, Out, Out) -> R;
pub type IsendV9Fn = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, Out) -> R;
pub type IrecvV9Fn = unsafe extern "C" fn(Ptr, c_int, Out, *mut usize, *mut c_int, Out, Out) -> R;
// v10: a profiler callback at init, a comm config at connect, profiler handles per post.
pub type InitV10Fn = unsafe extern "C" fn(Logger, ProfilerFn) -> R;
pub type ConnectV10Fn = unsafe extern "C" fn(c_int, Ptr, Ptr, Out, *mut *mut DeviceHandleV8) -> R;
pub type IsendV10Fn = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, Ptr, Out) -> R;
pub type IrecvV10Fn =
    unsafe extern "C" fn(Ptr, c_int, Out, *mut usize, *mut c_int, Out, Out, Out) -> R;
// v11: a context per communicator.
pub type InitV11Fn = unsafe extern "C" fn(Out, u64, Ptr, Logger, ProfilerFn) -> R;
pub type ListenV11Fn = unsafe extern "C" fn(Ptr, c_int, Ptr, Out) -> R;
pub type ConnectV11Fn = unsafe extern "C" fn(Ptr, c_int, Ptr, Out, *mut *mut DeviceHandleV8) -> R;
pub type FinalizeFn = unsafe extern "C" fn(Ptr) -> R;
pub type SetNetAttrFn = unsafe extern "C" fn(Ptr, Ptr) -> R;

/// `ncclProfilerCallback_t`: `(void** eHandle, int type, void* phandle, int64_t pluginId,
/// void* extData)`; NULL when NCCL runs no profiler.
pub type ProfilerFn = Option<unsafe extern "C" fn(Out, c_int, Ptr, i64, Ptr) -> R>;

/// Profiler event kinds (`ncclProfilerNetEventStart` …).
pub mod profiler {
    pub const START: i32 = 0;
    pub const STOP: i32 = 1;
    /// This plugin's id in NCCL's net-profiler scheme (type bits above 16, version below):
    /// its events carry a [`super::ProfilerDescrV1`].
    pub const PLUGIN_ID: i64 = (0x46 << 16) | 1;
    pub const SEND: u8 = 1;
    pub const RECV: u8 = 2;
}

/// What a profiler event of this plugin describes (`ncclProfilerNetFabricDescr_v1_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProfilerDescrV1 {
    /// [`profiler::SEND`] or [`profiler::RECV`].
    pub kind: u8,
    /// Which buffer of a grouped receive (0 for a send).
    pub part: i32,
    pub tag: i32,
    pub length: usize,
}

/// `ncclNetProperties_v6_t` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNetProperties_v7_t` (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetVDeviceProps_v9_t` … `_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevicePropsV11 {
    pub ndevs: c_int,
    pub devs: [c_int; 4],
}

/// `ncclNetVDeviceProps_v12_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevicePropsV12 {
    pub ndevs: c_int,
    pub devs: [c_int; 8],
}

/// `ncclNetProperties_v9_t` and `_v10_t` (104 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV9 {
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

/// `ncclNetProperties_v12_t` (128 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PropertiesV12 {
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
    pub v_props: VDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

/// `ncclNet_v6_t` (136 bytes): NCCL 2.13–2.18.
#[repr(C)]
pub struct NetV6 {
    pub name: *const c_char,
    pub init: InitV6Fn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV6) -> R,
    pub listen: ListenV6Fn,
    pub connect: ConnectV6Fn,
    pub accept: AcceptV6Fn,
    pub reg_mr: RegMrIntFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendIntFn,
    pub irecv: IrecvIntFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
}

/// `ncclNet_v7_t` (152 bytes): NCCL 2.19.
#[repr(C)]
pub struct NetV7 {
    pub name: *const c_char,
    pub init: InitV6Fn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV7) -> R,
    pub listen: ListenV6Fn,
    pub connect: ConnectV8Fn,
    pub accept: AcceptV8Fn,
    pub reg_mr: RegMrIntFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendIntFn,
    pub irecv: IrecvIntFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
}

/// `ncclNet_v8_t` (152 bytes): NCCL 2.20–2.23.
#[repr(C)]
pub struct NetV8 {
    pub name: *const c_char,
    pub init: InitV6Fn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV8) -> R,
    pub listen: ListenV6Fn,
    pub connect: ConnectV8Fn,
    pub accept: AcceptV8Fn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendIntFn,
    pub irecv: IrecvIntFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
}

/// `ncclNet_v9_t` (160 bytes): NCCL 2.24–2.25.
#[repr(C)]
pub struct NetV9 {
    pub name: *const c_char,
    pub init: InitV6Fn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV9) -> R,
    pub listen: ListenV6Fn,
    pub connect: ConnectV8Fn,
    pub accept: AcceptV8Fn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendV9Fn,
    pub irecv: IrecvV9Fn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_v_device: Option<unsafe extern "C" fn(*mut c_int, *mut VDevicePropsV11) -> R>,
}

/// `ncclNet_v10_t` (160 bytes): NCCL 2.26–2.27.
#[repr(C)]
pub struct NetV10 {
    pub name: *const c_char,
    pub init: InitV10Fn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV9) -> R,
    pub listen: ListenV6Fn,
    pub connect: ConnectV10Fn,
    pub accept: AcceptV8Fn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendV10Fn,
    pub irecv: IrecvV10Fn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_v_device: Option<unsafe extern "C" fn(*mut c_int, *mut VDevicePropsV11) -> R>,
}

/// `ncclNet_v11_t` (176 bytes): NCCL 2.28–2.29. Pointers NCCL passes only through (comm
/// config, net attributes) are `*mut c_void`.
#[repr(C)]
pub struct NetV11 {
    pub name: *const c_char,
    pub init: InitV11Fn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV11) -> R,
    pub listen: ListenV11Fn,
    pub connect: ConnectV11Fn,
    pub accept: AcceptV8Fn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendV10Fn,
    pub irecv: IrecvV10Fn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_v_device: Option<unsafe extern "C" fn(*mut c_int, *mut VDevicePropsV11) -> R>,
    pub finalize: FinalizeFn,
    pub set_net_attr: Option<SetNetAttrFn>,
}

/// `ncclNet_v12_t` (176 bytes): NCCL 2.30 and later.
#[repr(C)]
pub struct NetV12 {
    pub name: *const c_char,
    pub init: InitV11Fn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(c_int, *mut PropertiesV12) -> R,
    pub listen: ListenV11Fn,
    pub connect: ConnectV11Fn,
    pub accept: AcceptV8Fn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendV10Fn,
    pub irecv: IrecvV10Fn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_v_device: Option<unsafe extern "C" fn(*mut c_int, *mut VDevicePropsV12) -> R>,
    pub finalize: FinalizeFn,
    pub set_net_attr: Option<SetNetAttrFn>,
}

// SAFETY: the tables are immutable and only hold function pointers and a pointer to a
// 'static C string; sharing them between threads is what NCCL does.
unsafe impl Sync for NetV6 {}
// SAFETY: as above.
unsafe impl Sync for NetV7 {}
// SAFETY: as above.
unsafe impl Sync for NetV8 {}
// SAFETY: as above.
unsafe impl Sync for NetV9 {}
// SAFETY: as above.
unsafe impl Sync for NetV10 {}
// SAFETY: as above.
unsafe impl Sync for NetV11 {}
// SAFETY: as above.
unsafe impl Sync for NetV12 {}
