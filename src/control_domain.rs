//! Where a device's control endpoint lives.
//!
//! NCCL's connection handle is 128 bytes and names the listener's control endpoint, so that
//! endpoint's name must fit in [`HANDLE_ADDR_MAX`] bytes. Where the data provider's names fit,
//! the control endpoint is one more endpoint of the device's own domain. Where they do not
//! (ucx: 1024 bytes), or `NCCL_FABRIC_CONTROL_PROVIDER` names providers, it lives on a
//! provider with short names on an interface of this host, and the data endpoints' names
//! travel inside the control messages (CONNECT and ACK carry names up to
//! `handshake::MAX_ADDR` bytes). Decided once, at init, per device.

use crate::error::{Error, Result};
use crate::fabric::{runtime_version, Domain, Fabric, Hints, InfoList, OwnedInfo};
use crate::handshake::HANDLE_ADDR_MAX;
use crate::settings::{matches_pattern, Settings};
use crate::sys;
use std::sync::Arc;

/// Providers tried for the control endpoint when the settings name none.
pub const DEFAULT_PROVIDERS: &[&str] = &["tcp;ofi_rxm", "tcp", "sockets", "udp;ofi_rxd"];

/// A control endpoint's home away from the data domain.
pub struct Route {
    pub provider: String,
    pub domain: String,
    pub info: OwnedInfo,
    /// Why the control endpoint does not live on the data domain, and why here.
    pub why: String,
}

/// Why a device whose data provider names its endpoints in `name_len` bytes needs its
/// control endpoint elsewhere; `None`: it lives on the data domain.
pub fn needed(name_len: usize, settings: &Settings) -> Option<String> {
    if !settings.control_providers.is_empty() {
        return Some(format!(
            "NCCL_FABRIC_CONTROL_PROVIDER={}",
            settings.control_providers.join(",")
        ));
    }
    (name_len > HANDLE_ADDR_MAX).then(|| {
        format!(
            "the data provider's endpoint names are {name_len} bytes, and NCCL's {}-byte \
             connection handle carries at most {HANDLE_ADDR_MAX}",
            crate::nccl::NET_HANDLE_MAXSIZE
        )
    })
}

/// Hints for a control endpoint: tagged messages only. It registers nothing and posts no
/// descriptors, so it asks for no FI_MR_LOCAL and no FI_HMEM.
fn hints(provider: &str) -> Hints {
    Hints {
        caps: sys::FI_TAGGED as u64 | sys::FI_MSG as u64,
        mode: sys::FI_CONTEXT | sys::FI_CONTEXT2,
        mr_mode: (sys::FI_MR_VIRT_ADDR
            | sys::FI_MR_ALLOCATED
            | sys::FI_MR_PROV_KEY
            | sys::FI_MR_ENDPOINT) as i32,
        ep_type: sys::FI_EP_RDM,
        threading: sys::FI_THREAD_SAFE,
        provider: Some(provider.to_string()),
    }
}

/// Whether `name` passes NCCL's own interface filter, `NCCL_SOCKET_IFNAME` (`eth`: prefix,
/// `=eth0`: exact, `^docker`: all but these); `None` when the variable is not set.
fn socket_ifname(spec: Option<&str>, name: &str) -> Option<bool> {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty())?;
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let hit = rest
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| {
            if exact {
                p == name
            } else {
                name.starts_with(p)
            }
        });
    Some(hit != exclude)
}

/// One entry a control endpoint could use, ranked: lower is better.
fn rank(
    domain: &str,
    data_domain: &str,
    loopback: bool,
    ipv4: bool,
    settings: &Settings,
    ifname: Option<&str>,
) -> Option<(u8, String)> {
    if settings
        .exclude_domains
        .iter()
        .any(|p| matches_pattern(p, domain))
    {
        return None;
    }
    let listed = settings.domains.iter().any(|p| matches_pattern(p, domain));
    let (r, why) = if domain == data_domain {
        (0, "the data domain's own interface".to_string())
    } else if listed {
        (1, "named in NCCL_FABRIC_DOMAINS".to_string())
    } else if let Some(chosen) = socket_ifname(ifname, domain) {
        if !chosen {
            return None;
        }
        (2, "NCCL_SOCKET_IFNAME's interface".to_string())
    } else if !loopback {
        (3, "the first interface that is not loopback".to_string())
    } else {
        (
            5,
            "loopback, the only interface it offers (ranks on other hosts cannot reach it)"
                .to_string(),
        )
    };
    Some((r * 2 + u8::from(!ipv4), why))
}

/// Finds where the control endpoints of a device on `data_domain` live: the first provider
/// of the settings' list (or [`DEFAULT_PROVIDERS`]) that offers an interface, its best
/// interface. `Err`: why none can.
pub fn find(data_domain: &str, reason: &str, settings: &Settings) -> Result<Route> {
    let sysfs = crate::nic::Sysfs::default();
    let ifname = std::env::var("NCCL_SOCKET_IFNAME").ok();
    let wanted: Vec<String> = if settings.control_providers.is_empty() {
        DEFAULT_PROVIDERS.iter().map(|p| p.to_string()).collect()
    } else {
        settings.control_providers.clone()
    };
    let mut tried = Vec::new();
    for provider in &wanted {
        let list = match InfoList::get(runtime_version(), &hints(provider)) {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{provider}: {e}"));
                continue;
            }
        };
        let best = list
            .iter()
            .filter(|i| i.provider() == *provider)
            .filter_map(|i| {
                let ipv4 = matches!(i.src_socket_address(), Some(std::net::SocketAddr::V4(_)));
                rank(
                    &i.domain(),
                    data_domain,
                    i.loopback(&sysfs),
                    ipv4,
                    settings,
                    ifname.as_deref(),
                )
                .map(|(r, why)| (r, why, i))
            })
            .min_by_key(|(r, _, _)| *r);
        match best {
            Some((_, why, info)) => {
                return Ok(Route {
                    provider: provider.clone(),
                    domain: info.domain(),
                    info: info.to_owned()?,
                    why: format!(
                        "{reason}: the handshake runs over {provider} on {} ({why})",
                        info.domain()
                    ),
                });
            }
            None => tried.push(format!("{provider}: no usable interface")),
        }
    }
    Err(Error::NoProvider(format!(
        "{reason}, and no provider with short names carries the handshake instead ({})",
        tried.join("; ")
    )))
}

/// Opens the route's fabric and domain.
pub fn open(route: &Route) -> Result<Arc<Domain>> {
    let fabric = Fabric::open(route.info.info())?;
    Domain::open(&fabric, route.info.info())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_socket_ifname_is_read_as_nccl_reads_it() {
        assert_eq!(socket_ifname(None, "eth0"), None);
        assert_eq!(socket_ifname(Some("eth"), "eth0"), Some(true));
        assert_eq!(socket_ifname(Some("eth"), "ib0"), Some(false));
        assert_eq!(socket_ifname(Some("=eth"), "eth0"), Some(false));
        assert_eq!(socket_ifname(Some("=eth0,ib0"), "ib0"), Some(true));
        assert_eq!(socket_ifname(Some("^docker,lo"), "lo"), Some(false));
        assert_eq!(socket_ifname(Some("^docker,lo"), "eth0"), Some(true));
    }

    #[test]
    fn the_data_domain_wins_then_the_lists_then_any_interface() {
        let s = Settings::default();
        let r = |d: &str, lo: bool, v4: bool| rank(d, "eth1", lo, v4, &s, None).map(|x| x.0);
        assert!(r("eth1", false, true) < r("eth0", false, true));
        assert!(r("eth0", false, true) < r("eth0", false, false));
        assert!(r("eth0", false, false) < r("lo", true, true));
        assert_eq!(r("docker0", false, true), None, "excluded by default");
        let only_ib = rank("eth0", "ucx", false, true, &s, Some("ib"));
        assert_eq!(only_ib, None, "NCCL_SOCKET_IFNAME leaves eth0 out");
        let ib = rank("ib0", "ucx", false, true, &s, Some("ib")).unwrap();
        assert!(ib.1.contains("NCCL_SOCKET_IFNAME"));
    }

    #[test]
    fn long_names_or_the_setting_move_the_control_endpoint() {
        let s = Settings::default();
        assert!(needed(16, &s).is_none());
        assert!(needed(HANDLE_ADDR_MAX, &s).is_none());
        let why = needed(1024, &s).unwrap();
        assert!(
            why.contains("1024 bytes") && why.contains("at most 86"),
            "{why}"
        );
        let forced = Settings::from_lookup(|n| {
            (n == crate::settings::CONTROL_PROVIDER).then(|| "tcp;ofi_rxm".to_string())
        })
        .unwrap();
        assert!(needed(16, &forced).unwrap().contains("tcp;ofi_rxm"));
    }
}
