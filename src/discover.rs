//! Gathers provider candidates from libfabric for the policy in `provider`.
//!
//! Two `fi_getinfo` passes at the API version the running library reports: first with
//! `FI_TAGGED|FI_MSG|FI_HMEM`, then without `FI_HMEM`; each asks for `FI_DIRECTED_RECV` too
//! and takes providers without it only where none with it exists. Every admissible entry gets a probe
//! endpoint whose `FI_OPT_CUDA_API_PERMITTED=false` answer is recorded.

use crate::control_domain::{self, Route};
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::fabric::{runtime_version, Domain, Fabric, Hints, InfoList};
use crate::nic::Sysfs;
use crate::provider::{admissible, Candidate, Names, Pass};
use crate::settings::Settings;
use crate::sys;
use std::sync::Arc;

/// mr_mode bits the plugin can honour.
pub const MR_MODE: i32 = (sys::FI_MR_LOCAL
    | sys::FI_MR_HMEM
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ENDPOINT) as i32;

/// The smallest `max_msg_size` the plugin accepts: NCCL's steps are 512 KiB with its default
/// 4 MiB buffers (`NCCL_BUFFSIZE` / 8).
pub const MIN_MAX_MSG: usize = 512 << 10;

/// Why the plugin cannot use an entry whose attributes ask for what it does not do, if so:
/// mode bits beyond FI_CONTEXT/FI_CONTEXT2, mr_mode bits beyond [`MR_MODE`], tags too
/// narrow for its layout, messages smaller than NCCL's steps.
pub fn attribute_refusal(info: crate::fabric::Info<'_>) -> Option<String> {
    let mode = info.mode() & !(sys::FI_CONTEXT | sys::FI_CONTEXT2);
    if mode != 0 {
        return Some(format!(
            "it requires mode bits {mode:#x} (info->mode {:#x}); the plugin meets FI_CONTEXT and \
             FI_CONTEXT2 only",
            info.mode()
        ));
    }
    let mr = info.mr_mode() & !MR_MODE;
    if mr != 0 {
        return Some(format!(
            "it requires mr_mode bits {mr:#x} (mr_mode {:#x}; FI_MR_RAW is {:#x}); the plugin \
             honours LOCAL, VIRT_ADDR, ALLOCATED, PROV_KEY, ENDPOINT and HMEM ({MR_MODE:#x})",
            info.mr_mode(),
            sys::FI_MR_RAW
        ));
    }
    if let Some(why) = crate::tags::too_few_bits(info.mem_tag_format()) {
        return Some(why);
    }
    (info.max_msg_size() < MIN_MAX_MSG).then(|| {
        format!(
            "its largest message is {} bytes (ep_attr->max_msg_size), below NCCL's {} KiB steps",
            info.max_msg_size(),
            MIN_MAX_MSG >> 10
        )
    })
}

/// Hints for one pass; `directed`: ask for `FI_DIRECTED_RECV` and `FI_SOURCE` too (receives
/// bound to their peer, and completions that name the sender, to check it).
pub fn hints(pass: Pass, directed: bool, settings: &Settings) -> Hints {
    let mut caps = sys::FI_TAGGED as u64 | sys::FI_MSG as u64;
    if pass == Pass::Hmem {
        caps |= sys::FI_HMEM;
    }
    if directed {
        caps |= sys::FI_DIRECTED_RECV | sys::FI_SOURCE;
    }
    Hints {
        caps,
        mode: sys::FI_CONTEXT | sys::FI_CONTEXT2,
        mr_mode: MR_MODE,
        ep_type: sys::FI_EP_RDM,
        threading: sys::FI_THREAD_SAFE,
        // One named provider can be asked for directly; a list is filtered by the policy.
        provider: match settings.providers.as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        },
    }
}

/// Everything discovery learnt: the candidates and the fi_info lists they came from.
pub struct Discovery {
    pub version: u32,
    pub candidates: Vec<Candidate>,
    lists: Vec<InfoList>,
    /// Per candidate: which list, which entry.
    at: Vec<(usize, usize)>,
    /// Per candidate: where its control endpoints live when not on its domain (found by its
    /// probe, see `control_domain`).
    routes: Vec<Option<Arc<Route>>>,
}

impl Discovery {
    /// Where candidate `index`'s control endpoints live, when not on its own domain.
    pub fn control_route(&self, index: usize) -> Option<&Arc<Route>> {
        self.routes[index].as_ref()
    }

    /// The `fi_info` entry behind candidate `index`.
    pub fn info(&self, index: usize) -> crate::fabric::Info<'_> {
        let (list, entry) = self.at[index];
        self.lists[list]
            .iter()
            .nth(entry)
            .expect("candidate indices point into the lists")
    }
}

/// (pass, provider, domain): entries with the same key get the same probe answer.
type ProbeKey = (Pass, String, String);

/// What one probe endpoint answered.
#[derive(Clone)]
struct Probed {
    setopt: i32,
    names: Names,
    route: Option<Arc<Route>>,
}

/// Runs both passes. Each asks first for `FI_DIRECTED_RECV` (receives bound to their peer)
/// and then without it; an entry of the second answer is kept only if the first had none for
/// the same provider, fabric and domain.
pub fn discover(settings: &Settings) -> Result<Discovery> {
    let version = runtime_version();
    let mut candidates = Vec::new();
    let mut lists = Vec::new();
    let mut at = Vec::new();
    let mut routes = Vec::new();
    let mut probed: Vec<(ProbeKey, Result<Probed, String>)> = Vec::new();
    let sysfs = Sysfs::default();
    for pass in [Pass::Hmem, Pass::Host] {
        let first = candidates.len();
        for directed in [true, false] {
            let list = InfoList::get(version, &hints(pass, directed, settings))?;
            for (entry, info) in list.iter().enumerate() {
                let src = info.src_socket_address();
                let mut c = Candidate {
                    pass,
                    provider: info.provider(),
                    fabric: info.fabric(),
                    domain: info.domain(),
                    caps: info.caps(),
                    mr_mode: info.mr_mode(),
                    api_version: info.api_version(),
                    src,
                    loopback: info.loopback(&sysfs),
                    setopt: None,
                    names: None,
                };
                let seen = candidates[first..].iter().any(|o: &Candidate| {
                    o.caps & sys::FI_DIRECTED_RECV != 0
                        && (&o.provider, &o.fabric, &o.domain)
                            == (&c.provider, &c.fabric, &c.domain)
                });
                if !directed && seen {
                    continue;
                }
                let mut route = None;
                if admissible(&c.provider, &c.domain, settings).is_ok() {
                    // One probe per provider, domain and pass: entries that differ only in
                    // address format (IPv4, IPv6, link-local …) get the same answer, and an
                    // endpoint of tcp;ofi_rxm takes ~0.1 s to open.
                    let key = (pass, c.provider.clone(), c.domain.clone());
                    let answer = match probed.iter().find(|(k, _)| *k == key) {
                        Some((_, a)) => a.clone(),
                        None => {
                            let a = probe(info, settings).map_err(|e| e.to_string());
                            probed.push((key, a.clone()));
                            a
                        }
                    };
                    c.setopt = Some(answer.clone().map(|p| p.setopt));
                    if let Ok(p) = answer {
                        c.names = Some(p.names);
                        route = p.route;
                    }
                }
                tracing::trace!(
                    "candidate {} / {} / {} ({:?} pass): caps {:#x}, mr_mode {:#x}, \
                     setopt(FI_OPT_CUDA_API_PERMITTED=false) {}",
                    c.provider,
                    c.fabric,
                    c.domain,
                    pass,
                    c.caps,
                    c.mr_mode,
                    match &c.setopt {
                        Some(Ok(r)) => crate::provider::errno_name(*r),
                        Some(Err(e)) => format!("not answered: the probe endpoint failed ({e})"),
                        None => "not asked (the settings exclude it)".into(),
                    }
                );
                candidates.push(c);
                at.push((lists.len(), entry));
                routes.push(route);
            }
            lists.push(list);
        }
    }
    Ok(Discovery {
        version,
        candidates,
        lists,
        at,
        routes,
    })
}

/// Opens fabric, domain and an endpoint for one entry; returns the setopt answer and what
/// its name says. A provider whose names do not fit NCCL's handle needs another provider to
/// carry the handshake (see `control_domain`): without one it is refused here.
fn probe(info: crate::fabric::Info<'_>, settings: &Settings) -> Result<Probed> {
    if let Some(why) = attribute_refusal(info) {
        return Err(crate::error::Error::NoProvider(why));
    }
    let fabric = Fabric::open(info)?;
    let domain = Domain::open(&fabric, info)?;
    let (ep, _queue) = Endpoint::open(&domain, None)?;
    let route = match control_domain::needed(ep.name.len(), settings) {
        Some(reason) => Some(Arc::new(control_domain::find(
            &info.domain(),
            &reason,
            settings,
        )?)),
        None => None,
    };
    Ok(Probed {
        setopt: ep.cuda_api_answer,
        names: Names {
            len: ep.name.len(),
            shape: ep.shape.clone(),
            control_elsewhere: route.as_ref().map(|r| r.why.clone()),
        },
        route,
    })
}
