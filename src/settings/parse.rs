//! Reading the environment into [`Settings`]: each value checked against its kind in
//! [`TABLE`], and every setting as this environment has it.

use super::table::*;
use super::{EndpointSharing, HmemMode, Settings};
use crate::error::{Error, Result};
use crate::sizing::Cpus;
use std::time::Duration;

/// Raw value of `name` (or its default), checked against its kind.
fn value(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Result<String> {
    let s = setting(name);
    let raw = lookup(name).map(|v| v.trim().to_string());
    let text = raw.clone().unwrap_or_else(|| s.default.to_string());
    let ok = match s.kind {
        Kind::Choice(words) => words.contains(&text.to_ascii_lowercase().as_str()),
        Kind::List => true,
        Kind::Number { min, max } => text.parse::<u64>().is_ok_and(|n| (min..=max).contains(&n)),
    };
    if ok {
        return Ok(text.to_ascii_lowercase());
    }
    let accepted = match s.kind {
        Kind::Choice(words) => words.join(", "),
        Kind::Number { min, max } => format!("an integer from {min} to {max}"),
        Kind::List => unreachable!("lists accept any text"),
    };
    Err(Error::InvalidUsage(format!(
        "{name}={} is not valid: accepted values are {accepted} (default {})",
        raw.unwrap_or_default(),
        if s.default.is_empty() {
            "empty"
        } else {
            s.default
        }
    )))
}

/// libfabric's variable that makes rxm write long messages (read by `quirks`).
const RXM_RNDV_WRITE: &str = "FI_OFI_RXM_USE_RNDV_WRITE";

/// Whether libfabric reads `text` as a true boolean (`fi_parse_bool`: 1, true, yes, on).
fn libfabric_true(text: &str) -> bool {
    let t = text.trim();
    t == "1"
        || ["true", "yes", "on"]
            .iter()
            .any(|w| t.eq_ignore_ascii_case(w))
}

fn list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

impl Settings {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let number = |name| value(&lookup, name).map(|v| v.parse::<u64>().expect("checked"));
        // Lists keep their case: provider and interface names are case-sensitive.
        let raw_list = |name| {
            value(&lookup, name)
                .map(|_| list(&lookup(name).unwrap_or_else(|| setting(name).default.into())))
        };
        // Lanes and threads for this rank's CPUs, read once (/proc/cpuinfo, affinity); `auto`
        // is resolved by `size_for_devices`, for one device until init knows how many.
        let cpus = Cpus::detect();
        let lanes = number(LANES)?;
        let threads = value(&lookup, PROGRESS_THREAD)?;
        let thread_count = number(THREADS)?;
        Ok(Settings {
            hmem: match value(&lookup, HMEM)?.as_str() {
                "require" => HmemMode::Require,
                "off" => HmemMode::Off,
                "force" => HmemMode::Force,
                _ => HmemMode::Auto,
            },
            providers: raw_list(PROVIDER)?,
            control_providers: raw_list(CONTROL_PROVIDER)?,
            domains: raw_list(DOMAINS)?,
            exclude_domains: raw_list(EXCLUDE_DOMAINS)?,
            endpoints: match value(&lookup, ENDPOINTS)?.as_str() {
                "comm" => EndpointSharing::PerComm,
                "device" => EndpointSharing::PerDevice,
                _ => EndpointSharing::Auto,
            },
            connect_timeout_ms: number(CONNECT_TIMEOUT_MS)?,
            close_timeout_ms: number(CLOSE_TIMEOUT_MS)?,
            linger_ms: number(LINGER_MS)?,
            peer_timeout_ms: number(PEER_TIMEOUT_MS)?,
            max_recvs: number(MAX_RECVS)?,
            piece_bytes: number(PIECE_BYTES)?,
            pieces_auto: lookup(PIECE_BYTES).is_none(),
            times: value(&lookup, TIMES)? == "yes",
            stall_warn_ms: number(STALL_WARN_MS)?,
            speed_mbps: number(SPEED_MBPS)?,
            allow_native_tcp: value(&lookup, ALLOW_TCP_RDM)? == "yes",
            rxm_rndv_write: lookup(RXM_RNDV_WRITE).is_some_and(|v| libfabric_true(&v)),
            merge: value(&lookup, MERGE)? == "yes",
            progress_thread: threads == "yes" || threads == "both",
            calls_help: threads == "both",
            inline_post_bytes: number(INLINE_POST_BYTES)? as usize,
            progress_spin: Some(Duration::from_micros(number(PROGRESS_SPIN_US)?))
                .filter(|&d| d < Duration::from_secs(10)),
            spin_auto: lookup(PROGRESS_SPIN_US).is_none(),
            lanes: lanes.max(1) as usize,
            lanes_auto: lanes == 0,
            threads_auto: threads == "auto",
            flows: number(FLOWS)? as usize,
            threads: thread_count.max(1) as usize,
            thread_count_auto: thread_count == 0,
            devices: 1,
            cpus,
        })
        .map(|mut s| {
            s.size_for_devices(1);
            s
        })
        .and_then(|s| {
            // Checked here too so a bad NCCL_FABRIC_LOG fails init like any other setting.
            value(&lookup, LOG)?;
            Ok(s)
        })
    }
}

/// One setting as this environment has it: the raw value (if set), and the value in effect
/// or why the raw one is refused.
pub struct Current {
    pub setting: &'static Setting,
    pub raw: Option<String>,
    pub effective: std::result::Result<String, String>,
}

/// Every setting as `lookup` (the environment) has it.
pub fn current(lookup: impl Fn(&str) -> Option<String>) -> Vec<Current> {
    TABLE
        .iter()
        .map(|s| Current {
            setting: s,
            raw: lookup(s.name),
            effective: value(&lookup, s.name).map_err(|e| e.to_string()),
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::settings::matches_pattern;
    use crate::sizing::sizing_for;
    use std::collections::HashMap;

    pub(in crate::settings) fn parse(pairs: &[(&str, &str)]) -> Result<Settings> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_parse() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.hmem, HmemMode::Auto);
        assert!(s.providers.is_empty());
        assert_eq!(s.exclude_domains, vec!["docker*", "virbr*", "veth*"]);
        assert_eq!(s.connect_timeout_ms, 60000);
    }

    #[test]
    fn bad_choice_names_variable_and_accepted_values() {
        let err = parse(&[(HMEM, "banana")]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("NCCL_FABRIC_HMEM=banana"), "{text}");
        assert!(text.contains("auto, require, off, force"), "{text}");
        assert_eq!(err.nccl_result(), crate::nccl::NcclResult::InvalidUsage);
    }

    #[test]
    fn bad_number_is_rejected() {
        assert!(parse(&[(CONNECT_TIMEOUT_MS, "5")]).is_err());
        assert!(parse(&[(CONNECT_TIMEOUT_MS, "x")]).is_err());
        assert_eq!(
            parse(&[(CONNECT_TIMEOUT_MS, "500")])
                .unwrap()
                .connect_timeout_ms,
            500
        );
    }

    #[test]
    fn lists_keep_case_and_order() {
        let s = parse(&[(PROVIDER, "shm, tcp;ofi_rxm")]).unwrap();
        assert_eq!(s.providers, vec!["shm", "tcp;ofi_rxm"]);
        assert!(matches_pattern("docker*", "docker0"));
        assert!(!matches_pattern("eth0", "eth01"));
    }

    #[test]
    fn lanes_follow_the_machine_unless_set() {
        let auto = parse(&[]).unwrap().lanes;
        assert_eq!(auto, sizing_for(Cpus::detect().per_rank(), 1).lanes);
        assert_eq!(parse(&[(LANES, "8")]).unwrap().lanes, 8);
        assert!(parse(&[(LANES, "65")]).is_err());
    }

    #[test]
    fn peer_timeout_parses() {
        assert_eq!(parse(&[]).unwrap().peer_timeout_ms, 3000);
        assert_eq!(
            parse(&[(PEER_TIMEOUT_MS, "1000")]).unwrap().peer_timeout_ms,
            1000
        );
        assert!(parse(&[(PEER_TIMEOUT_MS, "10")]).is_err());
    }

    #[test]
    fn rxm_writes_are_read_as_libfabric_reads_them() {
        assert!(!parse(&[]).unwrap().rxm_rndv_write);
        for on in ["1", "yes", "TRUE", "on"] {
            assert!(
                parse(&[(RXM_RNDV_WRITE, on)]).unwrap().rxm_rndv_write,
                "{on}"
            );
        }
        for off in ["0", "no", "false", "off", "2"] {
            assert!(
                !parse(&[(RXM_RNDV_WRITE, off)]).unwrap().rxm_rndv_write,
                "{off}"
            );
        }
        let s = parse(&[(RXM_RNDV_WRITE, "1")]).unwrap();
        let why = crate::provider::admissible("tcp;ofi_rxm", "eth0", &s).unwrap_err();
        assert!(why.contains("FI_OFI_RXM_USE_RNDV_WRITE"), "{why}");
        assert!(crate::provider::admissible("shm", "shm", &s).is_ok());
    }

    #[test]
    fn choices_ignore_case() {
        assert_eq!(parse(&[(HMEM, "Require")]).unwrap().hmem, HmemMode::Require);
    }
}
