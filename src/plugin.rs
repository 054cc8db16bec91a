//! The plugin's state after `init`: settings, the provider decision and the devices.
//!
//! Everything NCCL is told about (devices, `ptrSupport`) is decided here once, in `init`,
//! and never changed afterwards.

use crate::control::Liveness;
use crate::device::{Device, Properties, MAX_COMMS};
use crate::discover::{discover, Discovery};
use crate::error::{Error, Result};
use crate::fabric::{runtime_version, version_string, Domain, Fabric, HEADER_VERSION};
use crate::lane::{LaneConfig, LanePool};
use crate::nccl;
use crate::provider::{decide, errno_name, CudaApiAnswer, Decision, Failure};
use crate::settings::{EndpointSharing, Settings};
use parking_lot::RwLock;
use std::ffi::CString;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Plugin {
    pub settings: Settings,
    pub devices: Vec<Device>,
    pub gpu: bool,
    pub provider: String,
    pub summary: String,
    /// How the plugin sized itself (CPUs, threads, each device's flows), said at init.
    pub sizing: String,
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
}

/// How comms on a device get endpoints. `auto` gives shared-memory providers an endpoint
/// per comm: measured under NCCL with shm, per-comm endpoints moved 1.6x the bytes of one
/// shared pair (two ranks' progress threads no longer contend on one queue) and as much as
/// 4-16 lanes, while tcp;ofi_rxm takes ~0.2-0.7 s to connect each new endpoint, so it
/// shares lanes.
fn per_comm(settings: &Settings, provider: &str) -> bool {
    let version = crate::fabric::runtime_version();
    match settings.endpoints {
        EndpointSharing::Auto => crate::quirks::local_only(provider),
        EndpointSharing::PerComm => true,
        EndpointSharing::PerDevice => match crate::quirks::sharing_stalls(provider, version) {
            Some(why) => {
                tracing::warn!(
                    "NCCL_FABRIC_ENDPOINTS=device is not followed over {provider}: {why}; \
                     each comm gets an endpoint of its own (use libfabric 1.19 or later to \
                     share them)"
                );
                true
            }
            None => false,
        },
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
    for warning in crate::settings::unknown_in_env() {
        tracing::warn!("{warning}");
    }
    let defaults = crate::quirks::apply_defaults();
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
    // Only once init will succeed: where it fails NCCL goes on with another transport, which
    // these are not meant for.
    let nccl_defaults = crate::quirks::apply_nccl_defaults(&decision.provider);
    tracing::info!("{}", plugin.summary);
    if decision.loopback_only {
        tracing::info!("{}", crate::provider::LOOPBACK_ONLY);
    }
    tracing::info!("{}", plugin.sizing);
    for (d, set) in defaults.iter().chain(&nccl_defaults) {
        if plugin.provider.contains(d.provider) && !set.is_empty() {
            tracing::info!(
                "{}: {} (set these variables yourself to choose others)",
                d.what,
                set.join(" ")
            );
        }
    }
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

/// A device's data domain: where rxm would otherwise register each long message itself,
/// the plugin's own registrations serve (`quirks::claim_local_mr`).
fn data_domain(fabric: &Arc<Fabric>, info: crate::fabric::Info<'_>) -> Result<Arc<Domain>> {
    match crate::quirks::claim_local_mr(&info.provider()) {
        true => Domain::open_claiming_local_mr(fabric, info),
        false => Domain::open(fabric, info),
    }
}

fn open_devices(
    mut settings: Settings,
    discovery: &Discovery,
    decision: &Decision,
) -> Result<Plugin> {
    // The NICs of each device: one each, or all of them in one (NCCL_FABRIC_MERGE).
    let descriptions = describe_devices(discovery, decision, settings.speed_mbps);
    let mut nics: Vec<(usize, crate::nic::Description)> =
        decision.devices.iter().copied().zip(descriptions).collect();
    let groups: Vec<Vec<(usize, crate::nic::Description)>> = match settings.merge {
        true if nics.len() > 1 => {
            // In the order of their names, which the peer's NICs share.
            nics.sort_by(|a, b| {
                let name = |ci: usize| discovery.candidates[ci].domain.as_str();
                name(a.0).cmp(name(b.0))
            });
            vec![nics]
        }
        _ => nics.drain(..).map(|n| vec![n]).collect(),
    };
    settings.size_for_devices(groups.len());
    crate::times::enable(settings.times);
    let mut fabrics: Vec<(String, Arc<Fabric>)> = Vec::new();
    let mut fabric_of = |ci: usize| -> Result<Arc<Fabric>> {
        let name = &discovery.candidates[ci].fabric;
        if let Some((_, f)) = fabrics.iter().find(|(n, _)| n == name) {
            return Ok(f.clone());
        }
        let f = Fabric::open(discovery.info(ci))?;
        fabrics.push((name.clone(), f.clone()));
        Ok(f)
    };
    let mut devices = Vec::new();
    // Each device's flows and lanes, for the sizing line.
    let mut sized = Vec::new();
    for (index, group) in groups.into_iter().enumerate() {
        let (ci, mut described) = group[0].clone();
        let info = discovery.info(ci);
        let mut c = discovery.candidates[ci].clone();
        let domain = data_domain(&fabric_of(ci)?, info)?;
        // A device over several NICs: each NIC's domain, in the order its lanes take them.
        let mut rails = Vec::new();
        if group.len() > 1 {
            let mut nic_domains = vec![domain.clone()];
            for (cj, _) in &group[1..] {
                nic_domains.push(data_domain(&fabric_of(*cj)?, discovery.info(*cj))?);
            }
            let speeds: Vec<u64> = group.iter().map(|(_, d)| d.speed_mbps).collect();
            let pattern = crate::nic::rail_pattern(&speeds);
            rails = pattern.iter().map(|&k| nic_domains[k].clone()).collect();
            let names: Vec<&str> = group
                .iter()
                .map(|(cj, _)| discovery.candidates[*cj].domain.as_str())
                .collect();
            tracing::info!(
                "dev {index}: one device over {} NICs (NCCL_FABRIC_MERGE=yes): {}; their lanes \
                 take them in the order {:?} (by speed, {:?} Mb/s), so a comm's flows carry each \
                 NIC's share of a long message; flow j pairs with the peer's flow j, on its NIC \
                 of the same place in the order of their names",
                group.len(),
                names.join(", "),
                pattern.iter().map(|&k| names[k]).collect::<Vec<_>>(),
                speeds
            );
            c.domain = names.join("+");
            described.speed_mbps = speeds.iter().sum();
            described.flow_speed_mbps = group.iter().map(|(_, d)| d.flow_speed_mbps).sum();
        }
        tracing::trace!("dev {index} {}: {}", c.domain, described.text());
        let control_home = match discovery.control_route(ci) {
            Some(route) => {
                tracing::info!("dev {index} {}: {}", c.domain, route.why);
                Some((crate::control_domain::open(route)?, route.domain.clone()))
            }
            None => None,
        };
        let pci_path = described
            .pci_path
            .as_ref()
            .and_then(|p| CString::new(p.to_string_lossy().into_owned()).ok());
        let mut ptr_support = nccl::PTR_HOST;
        if decision.gpu {
            ptr_support |= nccl::PTR_CUDA;
        }
        let props = Properties {
            name: CString::new(c.domain.clone()).unwrap_or_else(|_| CString::from(c"fabric")),
            pci_path,
            guid: described.guid,
            ptr_support,
            speed_mbps: i32::try_from(described.speed_mbps).unwrap_or(i32::MAX),
            port: 0,
            latency_us: 0.0,
            max_comms: MAX_COMMS,
            max_recvs: settings.max_recvs as i32,
            max_message: info.max_msg_size().min(crate::device::MAX_MESSAGE_BYTES),
        };
        if props.max_message < crate::device::MAX_MESSAGE_BYTES {
            tracing::info!(
                "dev {index} {}: {} carries messages of at most {} bytes (max_msg_size): NCCL is \
                 told so (maxP2pBytes, maxCollBytes, from the v9 table on); keep NCCL_BUFFSIZE \
                 at most 8 times that",
                c.domain,
                c.provider,
                props.max_message
            );
        }
        // With GPU buffers allowed, every endpoint must answer as the probe did.
        let expected_answer = c
            .setopt
            .clone()
            .and_then(Result::ok)
            .filter(|_| decision.gpu);
        let close_after = Duration::from_millis(settings.close_timeout_ms);
        // Only NCCL's threads may drive such a provider with GPU buffers: no progress
        // threads, and no turns from the control thread.
        let nccl_threads_only =
            decision.gpu && crate::quirks::progress_needs_cuda_context(&c.provider);
        let threaded = settings.progress_thread && !nccl_threads_only;
        if settings.progress_thread && !threaded {
            tracing::info!(
                "dev {index} {}: no progress threads: {} copies GPU buffers with the CUDA API \
                 in the thread that drives it (UCX's cuda_copy), and only NCCL's proxy thread \
                 holds the GPU's context, so NCCL's calls drive (NCCL_FABRIC_HMEM=off gives \
                 host buffers and progress threads)",
                c.domain,
                c.provider
            );
        }
        // Whether the lanes' progress threads sleep on the provider's wait object, and after
        // how long: decided once for the device.
        let wakes =
            crate::quirks::wait_object_tells_all(&c.provider, crate::fabric::runtime_version());
        let spin = settings.progress_spin.filter(|_| threaded && wakes);
        match (threaded, spin) {
            (true, Some(spin)) => tracing::info!(
                "dev {index} {}: progress threads sleep in poll on {}'s sockets once they found \
                 nothing to do for {} µs (NCCL_FABRIC_PROGRESS_SPIN_US), and wake when data \
                 arrives or NCCL hands them work",
                c.domain,
                c.provider,
                spin.as_micros()
            ),
            (true, None) => tracing::info!(
                "dev {index} {}: progress threads spin while operations are in flight, then \
                 yield and nap 20-200 µs{}",
                c.domain,
                if wakes {
                    " (NCCL_FABRIC_PROGRESS_SPIN_US=10000000)"
                } else {
                    " (this provider's wait object would not wake a sleeping thread)"
                }
            ),
            (false, _) => {}
        }
        // Flows and the piece size this device's comms offer, decided once. Several flows
        // carry a message's pieces at once, however the lanes are driven (their connections
        // move in parallel, each under its own cap on a network that caps flows). On one
        // flow, pieces overlap one piece's rendezvous with the others' data where threads
        // drive the lane; where NCCL's calls drive it, the extra messages only cost CPU (both
        // ends sharing one core, `benches/transfer.rs --yield`: 4 MiB at 0.56-0.60x raw
        // libfabric in pieces, 1.04-1.08x whole), so whole messages there unless the size
        // was set.
        let split = crate::quirks::pieces_pay(&c.provider, crate::fabric::runtime_version());
        let per_comm = per_comm(&settings, &c.provider);
        let can_stripe = split && !per_comm && settings.piece_bytes >= crate::handshake::MIN_PIECE;
        // A rank bound to one CPU drives every flow from NCCL's calls on the core its own
        // threads share: one flow there (on the GPU machine, bound to a core, all_reduce at
        // 1 GiB moved 2.9 GB/s on one flow, 2.1 on 16).
        let one_cpu = settings.cpus.per_rank() < 2;
        let flows = match (can_stripe, settings.flows) {
            (false, _) => 1,
            (true, 0) if one_cpu => 1,
            (true, 0) => crate::sizing::flows_for(described.flow_speed_mbps),
            (true, n) => n,
        };
        let lanes =
            crate::sizing::lanes_for_flows(settings.lanes, settings.lanes_auto, flows, rails.len());
        // Over several NICs, lanes come in whole rounds of the rails.
        let lanes = lanes.div_ceil(rails.len().max(1)) * rails.len().max(1);
        // Flows beyond the lanes pair every sending lane with every receiving one
        // (`lane::most_flows`); where the lanes were set and the flows not, no more flows
        // than lanes.
        let most = match (settings.flows, settings.lanes_auto) {
            (0, false) => lanes,
            _ => crate::lane::most_flows(lanes, rails.len()),
        };
        let flows = flows.min(most).min(crate::comm::MAX_FLOWS);
        let by_calls = !threaded && settings.pieces_auto && flows == 1;
        let piece = match split && !by_calls {
            true => settings.piece_bytes,
            false => 0,
        };
        let striped = piece >= crate::handshake::MIN_PIECE && !per_comm;
        match (split, piece) {
            (true, _) if by_calls => tracing::info!(
                "dev {index} {}: whole messages: one flow per comm, which NCCL's calls drive \
                 (no progress threads), and there pieces cost CPU without overlapping anything \
                 (NCCL_FABRIC_PIECE_BYTES sets a size anyway)",
                c.domain
            ),
            (true, p) if p >= crate::handshake::MIN_PIECE => tracing::info!(
                "dev {index} {}: messages over {p} bytes go in pieces, up to one per flow, {}",
                c.domain,
                match (flows, per_comm) {
                    (1, true) => format!(
                        "up to {} on each comm's own endpoint",
                        crate::comm::PIECES_ON_ONE_FLOW
                    ),
                    (1, false) => format!(
                        "up to {} on one flow (NCCL_FABRIC_FLOWS)",
                        crate::comm::PIECES_ON_ONE_FLOW
                    ),
                    (n, _) if settings.pieces_auto => format!(
                        "over {n} flows per comm (NCCL_FABRIC_FLOWS), once whole messages on \
                         the first flow prove slower than {} Mbit/s, or than pieces over all \
                         flows (tried now and then): fast flows move more whole",
                        crate::sizing::FLOW_MBPS
                    ),
                    (n, _) => format!("over {n} flows per comm (NCCL_FABRIC_FLOWS)"),
                }
            ),
            (true, _) => tracing::info!(
                "dev {index} {}: whole messages (NCCL_FABRIC_PIECE_BYTES below {})",
                c.domain,
                crate::handshake::MIN_PIECE
            ),
            (false, _) => tracing::info!(
                "dev {index} {}: whole messages: pieces do not pay over {} at libfabric {} \
                 (shared memory, or rxm before 2.1)",
                c.domain,
                c.provider,
                crate::fabric::version_string(crate::fabric::runtime_version())
            ),
        }
        sized.push(format!(
            "dev {index} {}: {}, {lanes} lane(s) per direction",
            c.domain,
            match (flows, striped, settings.flows) {
                (1, _, 0) if one_cpu && can_stripe => {
                    "1 flow per comm (this rank has one CPU, on which NCCL's calls drive every \
                     flow)"
                        .into()
                }
                (1, false, _) => "1 flow per comm (whole messages, or an endpoint per comm)".into(),
                (n, true, 0) => format!(
                    "{n} flow(s) per comm ({} Mbps{} at an assumed {} Mbps per flow, 1 to {}{})",
                    described.flow_speed_mbps,
                    match described.flow_speed_mbps == described.speed_mbps {
                        true => String::new(),
                        false => format!(
                            " for a link that reports no speed, {} told to NCCL",
                            described.speed_mbps
                        ),
                    },
                    crate::sizing::FLOW_MBPS,
                    crate::sizing::MAX_AUTO_FLOWS,
                    if n < crate::sizing::flows_for(described.flow_speed_mbps) {
                        ", no more than the lanes"
                    } else {
                        ""
                    }
                ),
                (n, _, _) => format!("{n} flow(s) per comm (as set)"),
            }
        ));
        let lanes = LanePool::new(LaneConfig {
            domain: domain.clone(),
            rails,
            expected_answer,
            threads: match threaded {
                true => settings.threads,
                false => 0,
            },
            calls_help: settings.calls_help,
            inline_post: settings.inline_post_bytes,
            lanes,
            flows,
            per_comm,
            label: c.domain.clone(),
            adopt: Box::new(move |d| crate::control::adopt(d, Instant::now() + close_after)),
            linger: Duration::from_millis(settings.linger_ms),
            schedule: Box::new(crate::control::later),
            nudge: !nccl_threads_only,
            spin,
            own_fabric: crate::quirks::domain_open_races_progress(
                &c.provider,
                crate::fabric::runtime_version(),
            ),
        });
        let liveness = Liveness {
            timeout: Duration::from_millis(settings.peer_timeout_ms),
        };
        devices.push(Device::new(
            index,
            domain,
            props,
            c,
            lanes,
            expected_answer,
            piece,
            flows,
            liveness,
            control_home,
        ));
    }
    let summary = summary(discovery, decision, &devices);
    let sizing = settings.sizing(&sized);
    Ok(Plugin {
        sizing,
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
         provider's setopt(FI_OPT_CUDA_API_PERMITTED=false) = {}: {}; {}",
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
        match first.caps & crate::sys::FI_DIRECTED_RECV {
            0 => "receives are matched by tag only (the provider lacks FI_DIRECTED_RECV)",
            _ => "each receive accepts only its peer (FI_DIRECTED_RECV)",
        }
    )
}

/// What each device of `decision` tells NCCL about itself (see `nic`), in device order,
/// from the provider's entries and the kernel; no two get one guid.
pub fn describe_devices(
    discovery: &Discovery,
    decision: &Decision,
    speed_setting: u64,
) -> Vec<crate::nic::Description> {
    let sysfs = crate::nic::Sysfs::default();
    let mut out: Vec<crate::nic::Description> = Vec::new();
    for &ci in &decision.devices {
        let (info, c) = (discovery.info(ci), &discovery.candidates[ci]);
        let reported = crate::nic::ProviderNic {
            speed_bps: info.link_speed_bps(),
            pci_address: info.pci_address(),
        };
        let taken: Vec<u64> = out.iter().map(|d| d.guid).collect();
        out.push(crate::nic::describe(
            &sysfs,
            &c.domain,
            &reported,
            speed_setting,
            crate::quirks::unreported_speed_mbps(&c.provider),
            &taken,
        ));
    }
    out
}

/// Releases what closed comms left behind (endpoints the provider still held operations on):
/// called when NCCL finalizes the last communicator. Devices, domains and control endpoints
/// stay for the next init.
pub fn release_leftovers() {
    let Some(plugin) = STATE.read().clone() else {
        return;
    };
    for d in &plugin.devices {
        // Dropped outside the lock: a connect's lane may close with it.
        let gone = std::mem::take(&mut *d.connects.lock());
        drop(gone);
    }
    crate::control::flush();
}

/// Libfabric runtime version, for reports.
pub fn libfabric_version() -> String {
    version_string(runtime_version())
}
