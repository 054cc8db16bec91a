//! Provider selection policy: a pure function from candidates and settings to a decision.
//!
//! Candidates come from two `fi_getinfo` passes (see `discover`): first with
//! `FI_TAGGED|FI_MSG|FI_HMEM`, then without `FI_HMEM`. Each carries the answer of
//! `fi_setopt(FI_OPT_CUDA_API_PERMITTED=false)` on a probe endpoint. The policy decides which
//! provider and domains become NCCL devices, whether NCCL may pass GPU pointers, and why,
//! with one reason per candidate.

use crate::settings::{matches_pattern, HmemMode, Settings, PROVIDER};
use crate::sys;

/// Which `fi_getinfo` pass found a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Hints `FI_TAGGED|FI_MSG|FI_HMEM`.
    Hmem,
    /// Hints `FI_TAGGED|FI_MSG` (host buffers only).
    Host,
}

/// What was learnt about one provider/domain.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub pass: Pass,
    pub provider: String,
    pub fabric: String,
    pub domain: String,
    pub caps: u64,
    pub mr_mode: i32,
    pub api_version: u32,
    /// The entry's source address, when it is an IP socket address.
    pub src: Option<std::net::SocketAddr>,
    /// The domain is a loopback interface, or the entry's address is a loopback address:
    /// peers on other hosts cannot reach it.
    pub loopback: bool,
    /// `Ok(answer)` of setopt on the probe endpoint, or `Err(text)` if the probe endpoint
    /// could not be set up at all. `None`: not probed (filtered out by settings first).
    pub setopt: Option<Result<i32, String>>,
    /// What the probe endpoint's name said: the shape of this provider's addresses, and
    /// where control endpoints must live instead of this domain (see `control_domain`).
    pub names: Option<Names>,
}

/// The probe endpoint's name, and what follows from it.
#[derive(Debug, Clone)]
pub struct Names {
    pub len: usize,
    pub shape: crate::address::Shape,
    /// Why the control endpoint lives elsewhere; `None`: on this domain.
    pub control_elsewhere: Option<String>,
}

impl Candidate {
    pub fn hmem_offered(&self) -> bool {
        self.caps & sys::FI_HMEM != 0
    }
    /// Providers that only reach peers on the same host.
    pub fn local_only(&self) -> bool {
        crate::quirks::local_only(&self.provider)
    }
    /// Which of a domain's entries serves best across hosts: IPv4, then IPv6 that routes,
    /// then link-local IPv6 (its scope id means nothing on the peer's host), then anything
    /// else.
    pub fn address_preference(&self) -> u8 {
        match self.src {
            Some(std::net::SocketAddr::V4(_)) => 0,
            Some(std::net::SocketAddr::V6(a)) if a.ip().segments()[0] & 0xffc0 != 0xfe80 => 1,
            Some(_) => 2,
            None => 3,
        }
    }
}

/// The answer of `FI_OPT_CUDA_API_PERMITTED=false`, in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaApiAnswer {
    /// 0: the provider promises not to call the CUDA API.
    Promised,
    /// -FI_EOPNOTSUPP: its FI_HMEM path needs the CUDA API, which NCCL forbids.
    NeedsCudaApi,
    /// -FI_EINVAL: libfabric found no CUDA library or device.
    NoCuda,
    /// -FI_ENOPROTOOPT / -FI_ENOSYS: the provider or libfabric (< 1.18) does not know it.
    Unknown,
    /// Anything else: endpoint setup failed.
    Failed(i32),
}

impl CudaApiAnswer {
    pub fn classify(ret: i32) -> Self {
        match -ret {
            0 => Self::Promised,
            e if e == sys::FI_EOPNOTSUPP as i32 => Self::NeedsCudaApi,
            e if e == sys::FI_EINVAL as i32 => Self::NoCuda,
            e if e == sys::FI_ENOPROTOOPT as i32 || e == sys::FI_ENOSYS as i32 => Self::Unknown,
            _ => Self::Failed(ret),
        }
    }
    pub fn describe(self) -> &'static str {
        match self {
            Self::Promised => "provider promises no CUDA calls",
            Self::NeedsCudaApi => "provider's FI_HMEM path needs the CUDA API, which NCCL forbids",
            Self::NoCuda => "libfabric found no CUDA library or device",
            Self::Unknown => "provider or libfabric (< 1.18) does not know the option",
            Self::Failed(_) => "endpoint setup failed",
        }
    }
}

/// A symbolic name for a setopt return value: `0`, `-92 (FI_ENOPROTOOPT)`, ….
pub fn errno_name(ret: i32) -> String {
    let name = match -ret {
        0 => return "0".into(),
        e if e == sys::FI_EOPNOTSUPP as i32 => "FI_EOPNOTSUPP",
        e if e == sys::FI_EINVAL as i32 => "FI_EINVAL",
        e if e == sys::FI_ENOPROTOOPT as i32 => "FI_ENOPROTOOPT",
        e if e == sys::FI_ENOSYS as i32 => "FI_ENOSYS",
        _ => return format!("{ret} ({})", crate::error::fi_strerror(-ret)),
    };
    format!("{ret} ({name})")
}

/// The verdict on one candidate.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub accepted: bool,
    /// Would carry GPU buffers (FI_HMEM offered and the setopt answer allows it).
    pub gpu_capable: bool,
    pub reason: String,
}

/// What the policy decided.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Indices into the candidate list, one per NCCL device, in device order.
    pub devices: Vec<usize>,
    /// NCCL may hand us CUDA pointers (`NCCL_PTR_CUDA`).
    pub gpu: bool,
    /// The chosen provider (empty if none).
    pub provider: String,
    /// One verdict per candidate, same order.
    pub verdicts: Vec<Verdict>,
    /// Why GPU buffers are or are not used, in one sentence.
    pub hmem_reason: String,
    /// Every device is a loopback interface: the job can span one host only.
    pub loopback_only: bool,
    /// Set when the settings cannot be met: init must fail with this text.
    pub failure: Option<Failure>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Nothing usable at all.
    NoProvider(String),
    /// `NCCL_FABRIC_HMEM=require` and no candidate qualifies.
    HmemRequired(String),
}

/// Why a loopback domain is not a device.
pub const LOOPBACK_LEFT_OUT: &str = "loopback: peers on other hosts cannot reach it, so it is a \
    device only where no other interface exists (name it in NCCL_FABRIC_DOMAINS to use it)";

/// What to say at INFO when every device is a loopback interface.
pub const LOOPBACK_ONLY: &str = "only loopback: this job can span one host (no other interface \
    offers the provider; NCCL_FABRIC_DOMAINS names the ones to use)";

/// Settings-only filter, applied before probing: `Err(reason)` rejects the candidate.
pub fn admissible(provider: &str, domain: &str, settings: &Settings) -> Result<(), String> {
    admission(provider, domain, settings).1
}

/// The settings' filters in turn, what the user selected first (provider, domains), then
/// what is refused (native tcp, rxm writing long messages, excluded domains): how many a candidate passed, and the
/// verdict. A candidate that got further came closer to being used.
fn admission(provider: &str, domain: &str, settings: &Settings) -> (usize, Result<(), String>) {
    if !settings.providers.is_empty() && !settings.providers.iter().any(|p| p == provider) {
        let why = format!(
            "not in NCCL_FABRIC_PROVIDER={}",
            settings.providers.join(",")
        );
        return (0, Err(why));
    }
    if !settings.domains.is_empty() && !settings.domains.iter().any(|p| matches_pattern(p, domain))
    {
        let why = format!(
            "domain not in NCCL_FABRIC_DOMAINS={}",
            settings.domains.join(",")
        );
        return (1, Err(why));
    }
    if let Some(why) = crate::quirks::native_tcp_refusal(provider, settings.allow_native_tcp) {
        return (2, Err(why.into()));
    }
    if let Some(why) = crate::quirks::rxm_write_refusal(provider, settings.rxm_rndv_write) {
        return (2, Err(why.into()));
    }
    if let Some(p) = settings
        .exclude_domains
        .iter()
        .find(|p| matches_pattern(p, domain))
    {
        return (
            3,
            Err(format!(
                "domain excluded by NCCL_FABRIC_EXCLUDE_DOMAINS ({p})"
            )),
        );
    }
    (4, Ok(()))
}

/// Decides. Pure: same candidates and settings, same decision.
pub fn decide(candidates: &[Candidate], settings: &Settings) -> Decision {
    let force = settings.hmem == HmemMode::Force;
    // First pass over every candidate: usable at all? GPU-capable?
    let mut verdicts: Vec<Verdict> = candidates
        .iter()
        .map(|c| {
            let reject = |reason: String| Verdict { accepted: false, gpu_capable: false, reason };
            if let Err(why) = admissible(&c.provider, &c.domain, settings) {
                return reject(why);
            }
            let answer = match &c.setopt {
                None => return reject("not probed".into()),
                Some(Err(e)) => return reject(format!("probe endpoint failed: {e}")),
                Some(Ok(ret)) => *ret,
            };
            let class = CudaApiAnswer::classify(answer);
            let setopt = format!("setopt {} = {}", errno_name(answer), class.describe());
            if let CudaApiAnswer::Failed(_) = class {
                return reject(format!("{setopt}: provider rejected"));
            }
            let gpu_capable = c.pass == Pass::Hmem
                && c.hmem_offered()
                && (class == CudaApiAnswer::Promised || (force && class == CudaApiAnswer::Unknown));
            let hmem = match (c.pass, c.hmem_offered()) {
                (Pass::Hmem, true) if gpu_capable && class == CudaApiAnswer::Unknown => {
                    "FI_HMEM offered; accepted by NCCL_FABRIC_HMEM=force although the option is unknown"
                }
                (Pass::Hmem, true) if gpu_capable => "FI_HMEM offered and usable",
                (Pass::Hmem, true) => "FI_HMEM offered but not usable",
                _ => "host buffers",
            };
            Verdict { accepted: false, gpu_capable, reason: format!("{hmem}; {setopt}") }
        })
        .collect();

    let usable: Vec<usize> = (0..candidates.len())
        .filter(|&i| {
            let c = &candidates[i];
            admissible(&c.provider, &c.domain, settings).is_ok()
                && matches!(c.setopt, Some(Ok(r)) if !matches!(CudaApiAnswer::classify(r), CudaApiAnswer::Failed(_)))
        })
        .collect();
    let gpu_ok: Vec<usize> = usable
        .iter()
        .copied()
        .filter(|&i| verdicts[i].gpu_capable)
        .collect();

    let want_gpu = match settings.hmem {
        HmemMode::Off => false,
        HmemMode::Auto | HmemMode::Force | HmemMode::Require => !gpu_ok.is_empty(),
    };
    let mut failure = None;
    if settings.hmem == HmemMode::Require && gpu_ok.is_empty() {
        failure = Some(Failure::HmemRequired(format!(
            "NCCL_FABRIC_HMEM=require but no provider can carry GPU buffers: {}; set \
             NCCL_FABRIC_HMEM=auto to run with host buffers",
            closest(candidates, &verdicts, settings, |c| c.pass == Pass::Hmem
                && c.hmem_offered())
        )));
    }

    // Rank providers: the user's order first, then network providers before local-only
    // ones, then fi_getinfo's order. GPU-capable entries win when GPU buffers are wanted.
    let pool: Vec<usize> = if want_gpu {
        gpu_ok.clone()
    } else {
        usable
            .iter()
            .copied()
            .filter(|&i| candidates[i].pass == Pass::Host)
            .collect()
    };
    let rank = |i: usize| {
        let c = &candidates[i];
        let user = settings
            .providers
            .iter()
            .position(|p| *p == c.provider)
            .unwrap_or(usize::MAX);
        (user, c.local_only(), c.loopback, i)
    };
    let chosen_provider = pool
        .iter()
        .copied()
        .min_by_key(|&i| rank(i))
        .map(|i| candidates[i].provider.clone());

    let mut devices: Vec<usize> = Vec::new();
    let domains_named = !settings.domains.is_empty();
    if failure.is_none() {
        if let Some(p) = &chosen_provider {
            // One device per domain (an interface's IPv4 and IPv6 entries are one NIC), on
            // the entry whose address serves best across hosts.
            for &i in &pool {
                let c = &candidates[i];
                if &c.provider != p {
                    continue;
                }
                match devices
                    .iter()
                    .position(|&d| candidates[d].domain == c.domain)
                {
                    None => devices.push(i),
                    Some(k)
                        if c.address_preference() < candidates[devices[k]].address_preference() =>
                    {
                        devices[k] = i
                    }
                    Some(_) => {}
                }
            }
            // A loopback device beside a real NIC would hand peers on other hosts an address
            // of their own loopback: it is a device only where nothing else exists, or where
            // the user named it.
            if !domains_named && devices.iter().any(|&d| !candidates[d].loopback) {
                devices.retain(|&d| !candidates[d].loopback);
            }
        } else {
            let mut asked = String::new();
            if !settings.providers.is_empty() {
                asked += &format!(", {PROVIDER}={}", settings.providers.join(","));
            }
            if let Ok(p) = std::env::var("FI_PROVIDER") {
                asked += &format!(", FI_PROVIDER={p}");
            }
            failure = Some(Failure::NoProvider(format!(
                "no libfabric provider matched (FI_EP_RDM with FI_TAGGED|FI_MSG{asked}): {}",
                if candidates.is_empty() {
                    let named = match (
                        settings.providers.is_empty(),
                        std::env::var_os("FI_PROVIDER"),
                    ) {
                        (true, None) => String::new(),
                        _ => " for the providers named (check their spelling: `fi_info -l` \
                              lists those this libfabric has)"
                            .to_string(),
                    };
                    format!("fi_getinfo returned nothing{named}")
                } else {
                    closest(candidates, &verdicts, settings, |c| c.setopt.is_some())
                }
            )));
        }
    }

    let provider = chosen_provider.unwrap_or_default();
    for (i, v) in verdicts.iter_mut().enumerate() {
        if devices.contains(&i) {
            v.accepted = true;
            v.reason = format!("chosen: {}", v.reason);
        } else if usable.contains(&i) {
            let c = &candidates[i];
            let why = if c.provider != provider {
                let chosen = devices.first().map(|&d| &candidates[d]);
                let rule = if !settings.providers.is_empty() {
                    format!("earlier in {PROVIDER}")
                } else if chosen.is_some_and(|d| !d.local_only()) && c.local_only() {
                    "network providers come before single-host ones".into()
                } else {
                    "earlier in fi_getinfo's order".into()
                };
                format!("provider {provider} preferred ({rule})")
            } else if want_gpu != (c.pass == Pass::Hmem) {
                format!(
                    "{} pass entry not used",
                    if c.pass == Pass::Hmem {
                        "FI_HMEM"
                    } else {
                        "host"
                    }
                )
            } else if c.loopback
                && !domains_named
                && devices.iter().any(|&d| !candidates[d].loopback)
            {
                LOOPBACK_LEFT_OUT.into()
            } else {
                "another entry of this domain is its device (one device per interface; IPv4 \
                 first, then IPv6 that routes, then link-local)"
                    .into()
            };
            v.reason = format!("{why}; {}", v.reason);
        }
    }

    let hmem_reason = hmem_reason(candidates, &devices, want_gpu, settings);
    let loopback_only = !devices.is_empty() && devices.iter().all(|&d| candidates[d].loopback);
    Decision {
        loopback_only,
        devices,
        gpu: want_gpu && failure.is_none(),
        provider,
        verdicts,
        hmem_reason,
        failure,
    }
}

/// Why nothing qualified, in one short sentence: how many candidates, the closest one with
/// its verdict, and where the full list is.
fn closest(
    candidates: &[Candidate],
    verdicts: &[Verdict],
    settings: &Settings,
    preferred: impl Fn(&Candidate) -> bool,
) -> String {
    // Furthest through the settings' filters, then `preferred`, then fi_getinfo's order.
    let pick = (0..candidates.len())
        .max_by_key(|&i| {
            let c = &candidates[i];
            let depth = admission(&c.provider, &c.domain, settings).0;
            (depth, preferred(c), std::cmp::Reverse(i))
        })
        .unwrap_or(0);
    let (c, v) = (&candidates[pick], &verdicts[pick]);
    let alike = verdicts.iter().filter(|w| w.reason == v.reason).count() - 1;
    format!(
        "{} candidate(s), closest {} on {} ({:?} pass): {}{}; `nccl-net-fabric doctor` (or \
         NCCL_DEBUG=TRACE) lists every candidate",
        candidates.len(),
        c.provider,
        c.domain,
        c.pass,
        v.reason,
        match alike {
            0 => String::new(),
            n => format!(" (so were {n} more)"),
        }
    )
}

fn hmem_reason(
    candidates: &[Candidate],
    devices: &[usize],
    gpu: bool,
    settings: &Settings,
) -> String {
    let Some(&first) = devices.first() else {
        return "no device".into();
    };
    let chosen = &candidates[first];
    if settings.hmem == HmemMode::Off {
        return "NCCL_FABRIC_HMEM=off: host buffers only".into();
    }
    if gpu {
        let ans = chosen.setopt.clone().and_then(Result::ok).unwrap_or(0);
        let forced = if CudaApiAnswer::classify(ans) == CudaApiAnswer::Unknown {
            " (accepted by NCCL_FABRIC_HMEM=force: the promise of no CUDA calls is the user's)"
        } else {
            ""
        };
        return format!(
            "GPU buffers: yes: {} offers FI_HMEM and setopt(FI_OPT_CUDA_API_PERMITTED=false) = {}: {}{forced}",
            chosen.provider,
            errno_name(ans),
            CudaApiAnswer::classify(ans).describe()
        );
    }
    // Why not: what did the FI_HMEM pass find for the chosen provider, or at all?
    let hmem_entries: Vec<&Candidate> =
        candidates.iter().filter(|c| c.pass == Pass::Hmem).collect();
    let same = hmem_entries.iter().find(|c| c.provider == chosen.provider);
    match same {
        Some(c) => {
            let ans = c.setopt.clone().and_then(Result::ok).unwrap_or(0);
            format!(
                "GPU buffers: no: {} offers FI_HMEM but setopt(FI_OPT_CUDA_API_PERMITTED=false) = {}: {}",
                c.provider,
                errno_name(ans),
                CudaApiAnswer::classify(ans).describe()
            )
        }
        None if hmem_entries.is_empty() => {
            // With providers named, discovery asks libfabric for those alone.
            let among = match settings.providers.as_slice() {
                [] => String::new(),
                named => format!(" among NCCL_FABRIC_PROVIDER={}", named.join(",")),
            };
            format!("GPU buffers: no: no provider{among} offers FI_HMEM (hints FI_TAGGED|FI_MSG|FI_HMEM found nothing); {} carries host buffers", chosen.provider)
        }
        None => {
            let found: Vec<String> = hmem_entries
                .iter()
                .map(|c| match &c.setopt {
                    Some(Ok(r)) => format!(
                        "{} (setopt(FI_OPT_CUDA_API_PERMITTED=false) = {}: {})",
                        c.provider,
                        errno_name(*r),
                        CudaApiAnswer::classify(*r).describe()
                    ),
                    Some(Err(e)) => format!("{} (probe failed: {e})", c.provider),
                    None => format!("{} (not allowed by the settings)", c.provider),
                })
                .collect();
            format!(
                "GPU buffers: no: {} does not offer FI_HMEM; the FI_HMEM hints found only {}",
                chosen.provider,
                found.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests;
