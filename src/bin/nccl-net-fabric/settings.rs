//! `nccl-net-fabric settings`: every `NCCL_FABRIC_*` setting as this environment has it.

use nccl_net_fabric::nic;
use nccl_net_fabric::settings::{self, Settings};
use nccl_net_fabric::sizing;
use std::process::ExitCode;
use std::time::Duration;

/// What `auto` (or 0) of a setting resolves to on this machine, if it has such a value.
fn resolved(name: &str, effective: &str, parsed: Option<&Settings>) -> Option<String> {
    let s = parsed?;
    match (name, effective) {
        (settings::LANES, "0") => Some(format!(
            "as many lanes per direction as the device's flows, up to {} on one NIC; {} where \
             messages go whole ({} CPUs for this rank)",
            sizing::MAX_FLOW_LANES,
            s.lanes,
            s.cpus.per_rank()
        )),
        (settings::FLOWS, "0") => Some(format!(
            "by each device's speed: {} flows for {} Gbps (and for a link that reports no \
             speed), {} for 10 Gbps, {} for 1 Gbps",
            sizing::flows_for(nic::DEFAULT_FLOW_SPEED_MBPS),
            nic::DEFAULT_FLOW_SPEED_MBPS / 1000,
            sizing::flows_for(10_000),
            sizing::flows_for(1000)
        )),
        (settings::THREADS, "0") => Some(format!(
            "{} progress thread(s) per device ({} CPUs for this rank)",
            s.threads,
            s.cpus.per_rank()
        )),
        (settings::PROGRESS_THREAD, "auto") => Some(
            match s.progress_thread {
                true => "yes",
                false => "no",
            }
            .to_string(),
        ),
        (settings::PROGRESS_SPIN_US, _)
            if s.spin_auto
                && s.progress_thread
                && s.progress_spin != Some(Duration::from_micros(sizing::SPIN_US)) =>
        {
            Some(format!(
                "{} µs: progress threads forced onto fewer CPUs than they need sleep sooner",
                s.progress_spin.map_or(0, |d| d.as_micros())
            ))
        }
        (settings::ENDPOINTS, "auto") => Some(
            "an endpoint per comm with shm and sm2 (one host), shared lanes per device with \
             the network providers"
                .to_string(),
        ),
        _ => None,
    }
}

pub fn run() -> ExitCode {
    let lookup = |name: &str| std::env::var(name).ok();
    let parsed = Settings::from_lookup(lookup).ok();
    let mut invalid = 0;
    for c in settings::current(lookup) {
        let line = match &c.effective {
            Ok(v) => {
                let shown = match (&c.raw, v.is_empty()) {
                    (Some(raw), _) => raw.clone(),
                    (None, true) => "(empty, the default)".to_string(),
                    (None, false) => format!("{v} (default)"),
                };
                match resolved(c.setting.name, v, parsed.as_ref()) {
                    Some(r) => format!("{shown} -> {r}"),
                    None => shown,
                }
            }
            Err(e) => {
                invalid += 1;
                format!("INVALID: {e}")
            }
        };
        println!("{:<32} {line}", c.setting.name);
    }
    for warning in settings::unknown_in_env() {
        println!("warning: {warning}");
    }
    println!("\n`nccl-net-fabric settings --markdown` prints what each setting means.");
    match invalid {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}
