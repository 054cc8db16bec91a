//! `nccl-net-fabric doctor`: the provider report, without NCCL.

use nccl_net_fabric::discover::discover;
use nccl_net_fabric::fabric::{runtime_version, version_string, HEADER_VERSION};
use nccl_net_fabric::nic::Description;
use nccl_net_fabric::plugin::describe_devices;
use nccl_net_fabric::provider::{decide, errno_name, CudaApiAnswer, Failure, Pass};
use nccl_net_fabric::settings::Settings;
use std::fmt::Write as _;
use std::process::ExitCode;

pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn run(json: bool, verbose: bool) -> ExitCode {
    nccl_net_fabric::log::init_stderr();
    for warning in nccl_net_fabric::settings::unknown_in_env() {
        eprintln!("nccl-net-fabric doctor: warning: {warning}");
    }
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nccl-net-fabric doctor: {e}");
            return ExitCode::from(2);
        }
    };
    let discovery = match discover(&settings) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("nccl-net-fabric doctor: {e}");
            return ExitCode::from(1);
        }
    };
    let decision = decide(&discovery.candidates, &settings);
    // What each device would tell NCCL about itself, as init describes it.
    let described: Vec<(usize, Description)> = decision
        .devices
        .iter()
        .copied()
        .zip(describe_devices(&discovery, &decision, settings.speed_mbps))
        .collect();
    let runtime = version_string(runtime_version());
    let headers = version_string(HEADER_VERSION);
    let caveat = nccl_net_fabric::quirks::stale_source_after_reconnect(
        &decision.provider,
        discovery.version,
    );
    let failure = decision.failure.as_ref().map(|f| match f {
        Failure::NoProvider(t) | Failure::HmemRequired(t) => t.clone(),
    });
    let staged = nccl_net_fabric::quirks::stages_gpu_memory(
        &decision.provider,
        nccl_net_fabric::nic::Sysfs::default().has_rdma_devices(),
    );
    let gdr = gpu_buffer_predictions(&described, decision.gpu, staged);

    if json {
        let mut out = String::new();
        let _ = write!(
            out,
            "{{\"libfabric_runtime\":{},\"libfabric_headers\":{},\"hmem_setting\":{},\"provider\":{},\"gpu_buffers\":{},\"hmem_reason\":{},\"usable\":{},\"failure\":{},\"caveat\":{},\"candidates\":[",
            json_str(&runtime),
            json_str(&headers),
            json_str(settings.hmem.name()),
            json_str(&decision.provider),
            decision.gpu,
            json_str(&decision.hmem_reason),
            failure.is_none(),
            failure.as_deref().map_or("null".into(), json_str),
            caveat.map_or("null".into(), json_str),
        );
        for (i, (c, v)) in discovery
            .candidates
            .iter()
            .zip(&decision.verdicts)
            .enumerate()
        {
            let setopt = match &c.setopt {
                Some(Ok(r)) => format!("{r}"),
                _ => "null".into(),
            };
            let meaning = match &c.setopt {
                Some(Ok(r)) => json_str(CudaApiAnswer::classify(*r).describe()),
                Some(Err(e)) => json_str(e),
                None => "null".into(),
            };
            let _ = write!(
                out,
                "{}{{\"provider\":{},\"fabric\":{},\"domain\":{},\"pass\":{},\"hmem_offered\":{},\"mr_mode\":{},\"setopt\":{},\"setopt_meaning\":{},\"device\":{},\"verdict\":{}}}",
                if i > 0 { "," } else { "" },
                json_str(&c.provider),
                json_str(&c.fabric),
                json_str(&c.domain),
                json_str(if c.pass == Pass::Hmem { "hmem" } else { "host" }),
                c.hmem_offered(),
                c.mr_mode,
                setopt,
                meaning,
                decision.devices.iter().position(|&d| d == i).map_or("null".into(), |d| d.to_string()),
                json_str(&v.reason),
            );
        }
        out.push_str("],\"devices\":[");
        for (dev, (ci, d)) in described.iter().enumerate() {
            let _ = write!(
                out,
                "{}{{\"device\":{dev},\"domain\":{},\"pci_path\":{},\"pci_source\":{},\"speed_mbps\":{},\"speed_source\":{},\"flow_speed_mbps\":{},\"guid\":{},\"guid_source\":{},\"loopback\":{},\"handshake\":{}}}",
                if dev > 0 { "," } else { "" },
                json_str(&discovery.candidates[*ci].domain),
                d.pci_path.as_ref().map_or("null".into(), |p| json_str(&p.to_string_lossy())),
                json_str(&d.pci_source),
                d.speed_mbps,
                json_str(&d.speed_source),
                d.flow_speed_mbps,
                d.guid,
                json_str(&d.guid_source),
                discovery.candidates[*ci].loopback,
                json_str(&handshake(&discovery.candidates[*ci])),
            );
        }
        out.push_str("],\"gpu_buffers_predicted\":[");
        for (i, line) in gdr.iter().enumerate() {
            let _ = write!(out, "{}{}", if i > 0 { "," } else { "" }, json_str(line));
        }
        out.push_str("]}");
        println!("{out}");
    } else if !verbose {
        // One line per finding; --verbose has every candidate and where each value came from.
        header(&runtime, &headers, &settings);
        match &failure {
            Some(t) => println!("nothing usable: {t}"),
            None => {
                println!(
                    "NCCL would use: {} ({} device(s))",
                    decision.provider,
                    decision.devices.len()
                );
                for (dev, (ci, d)) in described.iter().enumerate() {
                    let c = &discovery.candidates[*ci];
                    let handshake =
                        match c.names.as_ref().and_then(|n| n.control_elsewhere.as_ref()) {
                            Some(_) => "over another provider (its names do not fit NCCL's handle)",
                            None => "over the provider itself",
                        };
                    println!(
                        "dev {dev} {}: {} Mb/s, pciPath {}, handshake {handshake}",
                        c.domain,
                        d.speed_mbps,
                        d.pci_path
                            .as_deref()
                            .map_or("NULL".into(), |p| p.display().to_string()),
                    );
                }
                findings(&decision, caveat, &runtime, &gdr);
                println!(
                    "conform: nccl-net-fabric conform --provider '{}' checks it against NCCL's \
                     call pattern",
                    decision.provider
                );
            }
        }
        println!(
            "candidates: {} fi_getinfo entries, {} chosen (--verbose: each with its verdict)",
            discovery.candidates.len(),
            decision.devices.len()
        );
    } else {
        header(&runtime, &headers, &settings);
        println!();
        println!(
            "{:<4} {:<14} {:<16} {:<6} {:<6} {:<8} {:<24} verdict",
            "dev", "provider", "domain", "pass", "FI_HMEM", "mr_mode", "setopt(CUDA_API=false)"
        );
        let mut rows: Vec<(String, usize)> = Vec::new();
        for (i, (c, v)) in discovery
            .candidates
            .iter()
            .zip(&decision.verdicts)
            .enumerate()
        {
            let setopt = match &c.setopt {
                Some(Ok(r)) => errno_name(*r),
                Some(Err(_)) => "probe failed".into(),
                None => "not probed".into(),
            };
            let dev = decision
                .devices
                .iter()
                .position(|&d| d == i)
                .map_or("-".into(), |d| d.to_string());
            let row = format!(
                "{:<4} {:<14} {:<16} {:<6} {:<7} {:<8} {:<24} {}",
                dev,
                c.provider,
                c.domain,
                if c.pass == Pass::Hmem { "hmem" } else { "host" },
                if c.hmem_offered() { "yes" } else { "no" },
                format!("{:#x}", c.mr_mode),
                setopt,
                v.reason
            );
            // fi_getinfo may list a domain several times (once per address of the
            // interface, per address format): show identical rows once, counted.
            match rows.iter_mut().find(|(r, _)| *r == row) {
                Some((_, n)) => *n += 1,
                None => rows.push((row, 1)),
            }
        }
        for (row, n) in rows {
            match n {
                1 => println!("{row}"),
                n => println!("{row} (x{n}: identical fi_getinfo entries, e.g. one per address)"),
            }
        }
        println!();
        match &failure {
            None => {
                println!(
                    "NCCL would use: {} ({} device(s))",
                    decision.provider,
                    decision.devices.len()
                );
                for (dev, (ci, d)) in described.iter().enumerate() {
                    println!(
                        "dev {dev} {}: {}",
                        discovery.candidates[*ci].domain,
                        d.text()
                    );
                    println!(
                        "dev {dev} handshake: {}",
                        handshake(&discovery.candidates[*ci])
                    );
                }
                findings(&decision, caveat, &runtime, &gdr);
                println!(
                    "To check {} against NCCL's call pattern (two processes, every check with a \
                     deadline): nccl-net-fabric conform --provider '{}'",
                    decision.provider, decision.provider
                );
            }
            Some(t) => println!("nothing usable: {t}"),
        }
    }
    if failure.is_some() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The first line of both reports: libfabric's versions and the FI_HMEM setting.
fn header(runtime: &str, headers: &str, settings: &Settings) {
    println!(
        "libfabric {runtime} (runtime), {headers} (headers); NCCL_FABRIC_HMEM={}",
        settings.hmem.name()
    );
}

/// The findings both reports give after the devices: loopback only, a caveat of this
/// provider and version, the GPU-buffer verdict and NCCL's decision per GPU.
fn findings(
    decision: &nccl_net_fabric::provider::Decision,
    caveat: Option<&str>,
    runtime: &str,
    gdr: &[String],
) {
    if decision.loopback_only {
        println!("{}", nccl_net_fabric::provider::LOOPBACK_ONLY);
    }
    if let Some(why) = caveat {
        println!(
            "caveat: {} on libfabric {runtime}: {why}",
            decision.provider
        );
    }
    println!("{}", decision.hmem_reason);
    for line in gdr {
        println!("{line}");
    }
}

/// Where a device's handshake runs (see `control_domain`).
fn handshake(c: &nccl_net_fabric::provider::Candidate) -> String {
    match c.names.as_ref().and_then(|n| n.control_elsewhere.clone()) {
        Some(why) => why,
        None => format!(
            "over {} itself (its endpoint names fit NCCL's handle)",
            c.provider
        ),
    }
}

/// NCCL's GPU-buffer decision predicted per GPU and device from sysfs (the path type against
/// `NCCL_NET_GDR_LEVEL`), and whether GDRCopy is there (efa and cxi take the CUDA option only
/// with it).
fn gpu_buffer_predictions(
    described: &[(usize, Description)],
    offered: bool,
    staged: Option<&str>,
) -> Vec<String> {
    let sysfs = nccl_net_fabric::nic::Sysfs::default();
    let gpus = sysfs.gpus();
    let env = |k: &str| std::env::var(k).ok();
    let mut out = Vec::new();
    if gpus.is_empty() {
        out.push(
            "GPU buffers: no NVIDIA GPU on this machine's PCI bus, so nothing to predict".into(),
        );
    }
    for gpu in &gpus {
        for (dev, (_, d)) in described.iter().enumerate() {
            out.push(nccl_net_fabric::gdr::prediction(
                gpu,
                dev,
                d.pci_path.as_deref(),
                offered,
                staged,
                env,
            ));
        }
    }
    let gdrdrv = std::path::Path::new("/dev/gdrdrv").exists();
    out.push(format!(
        "GDRCopy: /dev/gdrdrv {}",
        if gdrdrv {
            "present"
        } else {
            "absent (efa and cxi accept FI_OPT_CUDA_API_PERMITTED=false only with GDRCopy)"
        }
    ));
    out
}
