//! The plugin's state after `init`: settings, the provider decision and the devices.
//!
//! Everything NCCL is told about (devices, `ptrSupport`) is decided here once, in `init`,
//! and never changed afterwards.

use crate::discover::{discover, Discovery};
use crate::error::{Error, Result};
use crate::fabric::{runtime_version, version_string, Domain, Fabric, HEADER_VERSION};
use crate::nccl;
use crate::provider::{decide, errno_name, Candidate, CudaApiAnswer, Decision, Failure};
use crate::settings::{EndpointSharing, Settings};
use parking_lot::{Mutex, RwLock};
use std::ffi::CString;
use std::sync::{Arc, Weak};

/// Largest message NCCL may hand a v11 `isend`/`irecv`: `test` reports sizes as `int`.
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// Speed reported when neither the provider nor `NCCL_FABRIC_SPEED_MBPS` gives one.
pub const DEFAULT_SPEED_MBPS: u64 = 100_000;
/// Speed reported for shared-memory providers (shm, sm2), which report no link: NCCL then
/// opens 4 channels per GPU pair rather than 2, and copies run on 4 endpoints' threads
/// (all_reduce busbw at 1 GiB: 9.3 → 14.5 GB/s on a 32-core machine; 8 channels: 8.1).
pub const SHARED_MEMORY_SPEED_MBPS: u64 = 400_000;
/// Receives NCCL may group in one `irecv` (we match in posting order, one buffer each).
pub const MAX_RECVS: i32 = 1;
pub const MAX_COMMS: i32 = 65_536;

/// What `getProperties` reports for a device, version-free.
#[derive(Debug, Clone)]
pub struct Properties {
    pub name: CString,
    pub pci_path: Option<CString>,
    pub guid: u64,
    pub ptr_support: i32,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
}

impl Properties {
    /// The v11 layout: the v8 fields plus those v9-v11 added.
    pub fn to_v11(&self, dev: i32) -> nccl::PropertiesV11 {
        let v8 = self.to_v8();
        nccl::PropertiesV11 {
            name: v8.name,
            pci_path: v8.pci_path,
            guid: v8.guid,
            ptr_support: v8.ptr_support,
            reg_is_global: v8.reg_is_global,
            force_flush: 0,
            speed: v8.speed,
            port: v8.port,
            latency: v8.latency,
            max_comms: v8.max_comms,
            max_recvs: v8.max_recvs,
            net_device_type: v8.net_device_type,
            net_device_version: v8.net_device_version,
            v_props: nccl::VDevicePropsV11 {
                ndevs: 1,
                devs: [dev, 0, 0, 0],
            },
            max_p2p_bytes: MAX_MESSAGE_BYTES,
            max_coll_bytes: MAX_MESSAGE_BYTES,
            max_multi_request_size: 1,
        }
    }

    pub fn to_v8(&self) -> nccl::PropertiesV8 {
        nccl::PropertiesV8 {
            name: self.name.as_ptr().cast_mut(),
            pci_path: self
                .pci_path
                .as_ref()
                .map_or(std::ptr::null_mut(), |p| p.as_ptr().cast_mut()),
            guid: self.guid,
            ptr_support: self.ptr_support,
            reg_is_global: 0,
            speed: self.speed_mbps,
            port: self.port,
            latency: self.latency_us,
            max_comms: self.max_comms,
            max_recvs: self.max_recvs,
            net_device_type: nccl::NET_DEVICE_HOST,
            net_device_version: nccl::NET_DEVICE_INVALID_VERSION,
        }
    }
}

/// A device's shared endpoints of one role (`NCCL_FABRIC_LANES` of them, opened when first
/// used) and which one the next comm gets.
#[derive(Default)]
pub struct Lanes {
    pub endpoints: Vec<Weak<crate::comm::SharedEndpoint>>,
    pub next: usize,
}

/// One NCCL device: a domain of the chosen provider.
pub struct Device {
    pub index: usize,
    pub domain: Arc<Domain>,
    pub props: Properties,
    pub candidate: Candidate,
    /// With endpoints shared per device, the lanes all comms of this device share, indexed
    /// by [`crate::comm::Role`], and a counter per role that hands them out in turn.
    pub shared_endpoints: Mutex<[Lanes; 2]>,
}

pub struct Plugin {
    pub settings: Settings,
    pub devices: Vec<Device>,
    pub gpu: bool,
    pub provider: String,
    pub summary: String,
}

static STATE: RwLock<Option<Arc<Plugin>>> = RwLock::new(None);

/// The initialised plugin, or an error for entry points called before `init`.
pub fn get() -> Result<Arc<Plugin>> {
    STATE
        .read()
        .clone()
        .ok_or_else(|| Error::Internal("called before init succeeded".into()))
}

impl Plugin {
    pub fn device(&self, dev: i32) -> Result<&Device> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device {dev} does not exist ({} devices)",
                    self.devices.len()
                ))
            })
    }
    /// How comms on `device` get endpoints. `auto` gives shared-memory providers an endpoint
    /// per comm: measured under NCCL with shm, per-comm endpoints moved 1.6x the bytes of one
    /// shared pair (two ranks' progress threads no longer contend on one queue) and as much as
    /// 4-16 lanes, while tcp;ofi_rxm takes ~0.2-0.7 s to connect each new endpoint, so it
    /// shares lanes.
    pub fn sharing(&self, device: &Device) -> EndpointSharing {
        match self.settings.endpoints {
            EndpointSharing::Auto if device.candidate.local_only() => EndpointSharing::PerComm,
            EndpointSharing::Auto => EndpointSharing::PerDevice,
            chosen => chosen,
        }
    }
}

/// `init`: parse settings, discover, decide, open the chosen domains. Runs once; a second
/// call (NCCL may re-run init) keeps the first result.
pub fn init() -> Result<Arc<Plugin>> {
    if let Some(p) = STATE.read().clone() {
        return Ok(p);
    }
    let mut state = STATE.write();
    if let Some(p) = state.clone() {
        return Ok(p);
    }
    let settings = Settings::from_env()?;
    let discovery = discover(&settings)?;
    let decision = decide(&discovery.candidates, &settings);
    for (c, v) in discovery.candidates.iter().zip(&decision.verdicts) {
        tracing::trace!(
            "candidate {} fabric {} domain {} ({:?} pass, FI_HMEM {}, mr_mode {:#x}): {}",
            c.provider,
            c.fabric,
            c.domain,
            c.pass,
            if c.hmem_offered() {
                "offered"
            } else {
                "not offered"
            },
            c.mr_mode,
            v.reason
        );
    }
    match &decision.failure {
        Some(Failure::NoProvider(text)) => return Err(Error::NoProvider(text.clone())),
        Some(Failure::HmemRequired(text)) => return Err(Error::InvalidUsage(text.clone())),
        None => {}
    }
    let plugin = Arc::new(open_devices(settings, &discovery, &decision)?);
    tracing::info!("{}", plugin.summary);
    if decision.hmem_reason.contains("NCCL_FABRIC_HMEM=force") {
        tracing::warn!(
            "NCCL_FABRIC_HMEM=force: {} does not say whether its FI_HMEM path calls the CUDA API; \
             NCCL will hand it GPU buffers on your word that it does not (unset the variable if \
             NCCL hangs or fails in CUDA calls)",
            decision.provider
        );
    }
    *state = Some(plugin.clone());
    Ok(plugin)
}

fn open_devices(settings: Settings, discovery: &Discovery, decision: &Decision) -> Result<Plugin> {
    let mut fabrics: Vec<(String, Arc<Fabric>)> = Vec::new();
    let mut devices = Vec::new();
    for (index, &ci) in decision.devices.iter().enumerate() {
        let info = discovery.info(ci);
        let c = discovery.candidates[ci].clone();
        let fabric = match fabrics.iter().find(|(n, _)| *n == c.fabric) {
            Some((_, f)) => f.clone(),
            None => {
                let f = Fabric::open(info)?;
                fabrics.push((c.fabric.clone(), f.clone()));
                f
            }
        };
        let domain = Domain::open(&fabric, info)?;
        let unreported = match c.local_only() {
            true => SHARED_MEMORY_SPEED_MBPS,
            false => DEFAULT_SPEED_MBPS,
        };
        let speed = match settings.speed_mbps {
            0 => info
                .link_speed_bps()
                .map_or(unreported, |bps| (bps / 1_000_000).max(1)),
            s => s,
        };
        let pci_path = info
            .pci_address()
            .and_then(|a| std::fs::canonicalize(format!("/sys/bus/pci/devices/{a}")).ok())
            .and_then(|p| CString::new(p.to_string_lossy().into_owned()).ok());
        let mut ptr_support = nccl::PTR_HOST;
        if decision.gpu {
            ptr_support |= nccl::PTR_CUDA;
        }
        let props = Properties {
            name: CString::new(c.domain.clone()).unwrap_or_else(|_| CString::from(c"fabric")),
            pci_path,
            guid: index as u64,
            ptr_support,
            speed_mbps: i32::try_from(speed).unwrap_or(i32::MAX),
            port: 0,
            latency_us: 0.0,
            max_comms: MAX_COMMS,
            max_recvs: MAX_RECVS,
        };
        devices.push(Device {
            index,
            domain,
            props,
            candidate: c,
            shared_endpoints: Mutex::new(Default::default()),
        });
    }
    let summary = summary(discovery, decision, &devices);
    Ok(Plugin {
        settings,
        devices,
        gpu: decision.gpu,
        provider: decision.provider.clone(),
        summary,
    })
}

fn summary(discovery: &Discovery, decision: &Decision, devices: &[Device]) -> String {
    let first = &devices[0].candidate;
    let answer = first.setopt.clone().and_then(Result::ok).unwrap_or(0);
    format!(
        "provider {} fabric {} domain(s) {} ({} device(s)); libfabric {} (headers {}); {}; this \
         provider's setopt(FI_OPT_CUDA_API_PERMITTED=false) = {}: {}",
        decision.provider,
        first.fabric,
        devices
            .iter()
            .map(|d| d.candidate.domain.as_str())
            .collect::<Vec<_>>()
            .join(","),
        devices.len(),
        version_string(discovery.version),
        version_string(HEADER_VERSION),
        decision.hmem_reason,
        errno_name(answer),
        CudaApiAnswer::classify(answer).describe(),
    )
}

/// Libfabric runtime version, for reports.
pub fn libfabric_version() -> String {
    version_string(runtime_version())
}
