//! The `nccl-net-fabric` tool as a user runs it: the built binary, its arguments, exit
//! codes and messages, and what the plugin says about the settings it is given.

mod common;

use common::{run_command, wait_output};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs the tool; `demo` and `doctor --selftest` get the plugin this test build made.
fn tool(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nccl-net-fabric"));
    c.args(args);
    if args == ["demo"] || args == ["doctor", "--selftest"] {
        c.arg("--plugin")
            .arg(nccl_net_host::PluginLib::default_path());
    }
    c.env("NCCL_FABRIC_DOMAINS", "lo,shm")
        .envs(env.iter().copied());
    run_command(&mut c, Duration::from_secs(120))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_and_version_succeed() {
    let h = tool(&["--help"], &[]);
    assert!(h.status.success(), "{h:?}");
    for cmd in ["doctor", "demo", "settings"] {
        assert!(text(&h.stdout).contains(cmd), "--help lists {cmd}");
    }
    let v = tool(&["--version"], &[]);
    assert!(v.status.success());
    assert!(text(&v.stdout).contains(env!("CARGO_PKG_VERSION")));
    let d = tool(&["doctor", "--help"], &[]);
    assert!(d.status.success() && text(&d.stdout).contains("--selftest"));
}

#[test]
fn bad_arguments_are_refused() {
    for args in [
        &["doctor", "--bogus"][..],
        &["demo", "--plugin"],
        &["frobnicate"],
        &[],
        &["doctor", "--plugin", "/x.so"],
    ] {
        let o = tool(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        let said = text(&o.stderr);
        assert!(
            said.contains("error") || said.contains("Usage"),
            "{args:?}: {o:?}"
        );
    }
}

#[test]
fn a_closed_pipe_ends_the_tool_quietly() {
    for args in [&["doctor"][..], &["settings"], &["demo"]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nccl-net-fabric"));
        cmd.args(args);
        if args == ["demo"] {
            cmd.arg("--plugin")
                .arg(nccl_net_host::PluginLib::default_path());
        }
        let mut child = cmd
            .env("NCCL_FABRIC_DOMAINS", "lo,shm")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // Read nothing: close our end at once, like `| head -0`.
        drop(child.stdout.take());
        let out = wait_output(child, &format!("{args:?}"), Duration::from_secs(120));
        assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {out:?}");
        assert!(!text(&out.stderr).contains("panicked"), "{args:?}: {out:?}");
    }
}

#[test]
fn settings_shows_values_resolutions_and_mistakes() {
    let o = tool(&["settings"], &[("NCCL_FABRIC_HEMM", "off")]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(out.contains("NCCL_FABRIC_HEMM is not a setting"), "{out}");
    assert!(out.contains("did you mean NCCL_FABRIC_HMEM?"), "{out}");
    assert!(
        out.contains("lanes per direction as the device's flows"),
        "auto lanes resolved: {out}"
    );
    assert!(
        out.contains(
            "33 flows for 100 Gbps (and for a link that reports no speed), 20 for 10 Gbps"
        ),
        "auto flows resolved: {out}"
    );
    assert!(
        out.contains("progress thread(s) per device"),
        "auto threads resolved: {out}"
    );
    let progress = out
        .lines()
        .find(|l| l.starts_with("NCCL_FABRIC_PROGRESS_THREAD"))
        .expect("progress line");
    assert!(
        progress.ends_with("-> yes") || progress.ends_with("-> no"),
        "{progress}"
    );
    let o = tool(&["settings"], &[("NCCL_FABRIC_LANES", "99")]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        text(&o.stdout).contains("INVALID: NCCL_FABRIC_LANES=99"),
        "{o:?}"
    );
    let o = tool(&["settings", "--markdown"], &[]);
    assert!(text(&o.stdout).starts_with("| variable | values | default | meaning |"));
}

#[test]
fn doctor_names_the_setting_as_written() {
    let o = tool(&["doctor"], &[("NCCL_FABRIC_HMEM", "Off")]);
    assert!(text(&o.stdout).contains("NCCL_FABRIC_HMEM=off"), "{o:?}");
    let j = tool(&["doctor", "--json"], &[]);
    assert!(
        text(&j.stdout).contains("\"hmem_setting\":\"auto\""),
        "{j:?}"
    );
}

/// The one line saying why nothing is usable: short, naming the setting to change.
fn failure_line(o: &Output) -> String {
    text(&o.stdout)
        .lines()
        .find(|l| l.starts_with("nothing usable"))
        .unwrap_or_else(|| panic!("no failure line: {o:?}"))
        .to_string()
}

#[test]
fn failures_are_one_short_line_naming_the_setting() {
    let cases: [(&[(&str, &str)], &str); 3] = [
        (&[("NCCL_FABRIC_HMEM", "require")], "NCCL_FABRIC_HMEM=auto"),
        (
            &[("NCCL_FABRIC_DOMAINS", "eth9")],
            "NCCL_FABRIC_DOMAINS=eth9",
        ),
        (
            &[("NCCL_FABRIC_PROVIDER", "nonexistent")],
            "NCCL_FABRIC_PROVIDER=nonexistent",
        ),
    ];
    for (env, named) in cases {
        let o = tool(&["doctor"], env);
        assert_eq!(o.status.code(), Some(1), "{env:?}: {o:?}");
        let line = failure_line(&o);
        assert!(line.contains(named), "{env:?}: {line}");
        assert!(
            line.len() < 500,
            "{env:?}: {} characters: {line}",
            line.len()
        );
        // Inside NCCL: init fails with one WARN line of the same kind.
        let d = tool(&["demo"], env);
        assert_eq!(d.status.code(), Some(1), "{env:?}: {d:?}");
        let warn = text(&d.stderr)
            .lines()
            .find(|l| l.contains("WARN"))
            .unwrap_or_else(|| panic!("no WARN: {d:?}"))
            .to_string();
        assert!(warn.contains(named), "{env:?}: {warn}");
        assert!(
            warn.len() < 600,
            "{env:?}: {} characters: {warn}",
            warn.len()
        );
    }
}

#[test]
fn the_plugin_warns_about_a_misspelled_setting() {
    let o = tool(&["demo"], &[("NCCL_FABRIC_HEMM", "off")]);
    assert!(o.status.success(), "{o:?}");
    let warn: Vec<String> = text(&o.stderr)
        .lines()
        .filter(|l| l.contains("WARN"))
        .map(String::from)
        .collect();
    assert_eq!(warn.len(), 1, "{warn:?}");
    assert!(
        warn[0].contains("did you mean NCCL_FABRIC_HMEM?"),
        "{warn:?}"
    );
}

/// NCCL's GPU-buffer decision: predicted per GPU and device, or, on a machine without an
/// NVIDIA GPU (CI), said to be nothing to predict; GDRCopy's presence either way.
#[test]
fn doctor_predicts_nccls_gpu_buffer_decision() {
    let o = tool(&["doctor"], &[]);
    let out = text(&o.stdout);
    let gpus = std::fs::read_dir("/sys/bus/pci/devices")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("vendor"))
                        .is_ok_and(|v| v.trim() == "0x10de")
                })
                .count()
        })
        .unwrap_or(0);
    if gpus == 0 {
        assert!(out.contains("GPU buffers: no NVIDIA GPU"), "{o:?}");
    } else {
        assert!(out.contains(" - dev 0: path "), "{o:?}");
    }
    assert!(out.contains("GDRCopy: /dev/gdrdrv "), "{o:?}");
    let j = tool(&["doctor", "--json"], &[]);
    assert!(
        text(&j.stdout).contains("\"gpu_buffers_predicted\":[\""),
        "{j:?}"
    );
}

/// Without --verbose: one line per finding, every candidate summed up in one line.
#[test]
fn doctor_says_one_line_per_finding() {
    let short = text(&tool(&["doctor"], &[]).stdout);
    let long = text(&tool(&["doctor", "--verbose"], &[]).stdout);
    assert!(short.contains("NCCL would use: "), "{short}");
    assert!(
        short.contains("candidates: ") && short.contains("--verbose"),
        "{short}"
    );
    assert!(
        !short.contains("setopt(CUDA_API=false)"),
        "the table: {short}"
    );
    assert!(!short.lines().any(str::is_empty), "{short}");
    assert!(long.contains("setopt(CUDA_API=false)"), "{long}");
    assert!(
        short.lines().count() < long.lines().count(),
        "{short}\n{long}"
    );
}

#[test]
fn doctor_selftest_moves_data_through_the_table() {
    let o = tool(&["doctor", "--selftest"], &[]);
    assert!(o.status.success(), "{o:?}");
    assert!(text(&o.stdout).contains("selftest: passed"), "{o:?}");
    let bad = tool(
        &["doctor", "--selftest", "--plugin", "/nonexistent.so"],
        &[],
    );
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(text(&bad.stdout).contains("selftest: FAILED"), "{bad:?}");
}

#[test]
fn reports_read_plainly() {
    let o = tool(&["doctor"], &[]);
    let out = text(&o.stdout);
    assert!(!out.contains("one per address format"), "{out}");
    assert!(!out.contains("Some(") && !out.contains("Ok("), "{out}");
    let t = tool(&["demo"], &[("NCCL_DEBUG", "TRACE")]);
    let candidates: Vec<&str> = std::str::from_utf8(&t.stderr)
        .unwrap_or("")
        .lines()
        // Discovery's lines (with the endpoint's answers), not init's verdicts.
        .filter(|l| l.contains("TRACE NET/Fabric : candidate") && l.contains(": caps 0x"))
        .collect::<Vec<_>>();
    assert!(!candidates.is_empty(), "{t:?}");
    for l in candidates {
        assert!(
            l.contains("setopt(FI_OPT_CUDA_API_PERMITTED=false) "),
            "{l}"
        );
        assert!(!l.contains("Some(") && !l.contains("Ok("), "{l}");
    }
}

/// A link that reports no speed (lo) is told to NCCL at 25 Gb/s while its flows are sized for
/// 100; a speed the user sets is both.
#[test]
fn doctor_gives_the_speed_told_and_the_speed_flows_are_sized_for() {
    let device = |extra: &[(&str, &str)]| {
        let mut env = vec![
            ("NCCL_FABRIC_PROVIDER", "tcp;ofi_rxm"),
            ("NCCL_FABRIC_DOMAINS", "lo"),
        ];
        env.extend_from_slice(extra);
        let o = tool(&["doctor", "--json"], &env);
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor --json");
        let d = j["devices"][0].clone();
        assert_eq!(d["domain"], "lo", "{j}");
        (d["speed_mbps"].as_u64(), d["flow_speed_mbps"].as_u64(), d)
    };
    let (told, flows, d) = device(&[]);
    assert_eq!((told, flows), (Some(25_000), Some(100_000)), "{d}");
    assert!(
        d["speed_source"]
            .as_str()
            .is_some_and(|s| s.contains("reports no speed for lo")),
        "{d}"
    );
    let (told, flows, d) = device(&[("NCCL_FABRIC_SPEED_MBPS", "40000")]);
    assert_eq!((told, flows), (Some(40_000), Some(40_000)), "{d}");
}

/// The caveat about 1.17 rxm's stale sources appears exactly where it applies.
#[test]
fn doctor_names_the_stale_source_caveat_where_it_applies() {
    let o = tool(
        &["doctor", "--json"],
        &[("NCCL_FABRIC_PROVIDER", "tcp;ofi_rxm")],
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor --json");
    let affected = common::libfabric_version() < (2, 1);
    assert_eq!(j["caveat"].is_string(), affected, "{j}");
    let plain = text(&tool(&["doctor"], &[("NCCL_FABRIC_PROVIDER", "tcp;ofi_rxm")]).stdout);
    assert_eq!(plain.contains("caveat: tcp;ofi_rxm"), affected, "{plain}");
    let shm = tool(&["doctor", "--json"], &[("NCCL_FABRIC_PROVIDER", "shm")]);
    let j: serde_json::Value = serde_json::from_slice(&shm.stdout).expect("doctor --json");
    assert!(j["caveat"].is_null(), "{j}");
}

/// The provider variables (and NCCL's) the plugin sets at init are named in INFO lines for
/// the provider in use, and one the user set is left alone.
#[test]
fn the_plugin_names_the_provider_defaults_it_sets() {
    let info = |provider: &str, env: &[(&str, &str)]| -> String {
        let mut all = vec![
            ("NCCL_FABRIC_PROVIDER", provider),
            ("NCCL_FABRIC_LOG", "info"),
        ];
        all.extend_from_slice(env);
        let o = tool(&["demo"], &all);
        assert!(o.status.success(), "{provider}: {o:?}");
        text(&o.stderr)
    };
    let rxd = info("udp;ofi_rxd", &[]);
    assert!(rxd.contains("FI_OFI_RXD_MAX_UNACKED=32"), "{rxd}");
    assert!(!rxd.contains("FI_OFI_RXM_BUFFER_SIZE"), "{rxd}");
    assert!(!rxd.contains("NCCL_P2P_NET_CHUNKSIZE"), "{rxd}");
    assert!(!rxd.contains("NCCL_P2P_PER_CHANNEL_NET_BW"), "{rxd}");
    let rxm = info("tcp;ofi_rxm", &[]);
    assert!(rxm.contains("FI_OFI_RXM_BUFFER_SIZE=33792"), "{rxm}");
    assert!(!rxm.contains("FI_OFI_RXD_MAX_UNACKED"), "{rxm}");
    // NCCL's own chunk for point-to-point transfers, and its channels per network peer on
    // 2.30, set only over rxm.
    assert!(rxm.contains("NCCL_P2P_NET_CHUNKSIZE=524288"), "{rxm}");
    assert!(rxm.contains("NCCL_P2P_PER_CHANNEL_NET_BW=2"), "{rxm}");
    let own = info("udp;ofi_rxd", &[("FI_OFI_RXD_MAX_UNACKED", "64")]);
    assert!(!own.contains("FI_OFI_RXD_MAX_UNACKED"), "{own}");
    let own = info("tcp;ofi_rxm", &[("NCCL_P2P_NET_CHUNKSIZE", "131072")]);
    assert!(!own.contains("NCCL_P2P_NET_CHUNKSIZE"), "{own}");
    assert!(own.contains("NCCL_P2P_PER_CHANNEL_NET_BW=2"), "{own}");
    assert!(own.contains("FI_OFI_RXM_BUFFER_SIZE=33792"), "{own}");
}
