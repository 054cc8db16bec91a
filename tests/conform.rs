//! `nccl-net-fabric conform` against real providers: two processes on this host, two hosts
//! (network namespaces), and providers made to misbehave, whose rows must fail with the
//! right reason.

mod common;

use common::hosts::{hosts_or_skip, Hosts, IFACE};
use common::{libfabric_version, run_command};
use serde_json::Value;
use std::process::{Command, Output};
use std::time::Duration;

fn tool() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nccl-net-fabric"));
    c.arg("conform")
        .arg("--plugin")
        .arg(nccl_net_host::PluginLib::default_path());
    c
}

fn report(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {text}\nstderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn rows(v: &Value) -> &Vec<Value> {
    v["rows"].as_array().expect("rows")
}

/// The row named `check`.
fn row<'a>(v: &'a Value, check: &str) -> &'a Value {
    rows(v)
        .iter()
        .find(|r| r["check"] == check)
        .unwrap_or_else(|| panic!("no row {check:?} in {v:#}"))
}

/// Every row NCCL needs passed, and the checks that must be there are.
fn assert_conforms(v: &Value, what: &str) {
    for r in rows(v) {
        if r["needed"] == true {
            assert_eq!(r["verdict"], "pass", "{what}: {r:#}");
        }
    }
    assert_eq!(v["passed"], true, "{what}");
    for check in [
        "the plugin's choice",
        "256 comm pair(s) each way",
        "reconnect cycles",
        "tagged send/recv 0 B",
        "tagged send/recv 8 MiB",
        "grouped receive of 8",
        "receive smaller than its send",
        "closes with requests in flight",
        "a peer killed mid-stream",
    ] {
        assert_eq!(row(v, check)["verdict"], "pass", "{what}: {check}");
    }
    // Figures beside raw libfabric, and the idle check, whatever their outcome.
    for check in [
        "8-byte latency (plugin)",
        "bandwidth (plugin)",
        "raw libfabric beside the plugin",
        "sends while the receiver makes no calls",
    ] {
        assert!(
            row(v, check)["observed"]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "{what}: {check}"
        );
    }
}

/// Providers the plugin runs on here (2.1's native tcp needs its opt-in, which the tool
/// sets for `--provider tcp`).
fn providers() -> Vec<&'static str> {
    let mut p = vec!["tcp;ofi_rxm", "shm", "udp;ofi_rxd"];
    if libfabric_version() < (1, 18) {
        p.push("sockets");
    } else {
        p.push("tcp");
    }
    // ucx where scripts/test.sh built it in (see tests/datapath.rs).
    if std::env::var_os("NFAB_UCX").is_some_and(|v| v == "1") {
        p.push("ucx");
    }
    p
}

/// The environment one provider's conform run gets.
fn provider_env(c: &mut Command, provider: &str) {
    match provider {
        // ucx's endpoints live in domain `ucx`; its handshake goes over loopback.
        "ucx" => c.envs([
            ("NCCL_FABRIC_DOMAINS", "ucx"),
            ("NCCL_SOCKET_IFNAME", "lo"),
            ("FI_UCX_DEVICES", "lo"),
            ("UCX_TLS", "sm,self"),
        ]),
        _ => c.env("NCCL_FABRIC_DOMAINS", "lo,shm"),
    };
}

#[test]
fn conform_passes_on_every_provider() {
    for p in providers() {
        let mut c = tool();
        c.args(["--provider", p, "--json"]);
        provider_env(&mut c, p);
        let out = run_command(&mut c, Duration::from_secs(300));
        let v = report(&out);
        assert_conforms(&v, p);
        assert!(out.status.success(), "{p}: exit {:?}", out.status);
    }
}

/// Runs conform over tcp;ofi_rxm with the attribute shim (`tests/fault/attrs.c`) set by
/// `shim`: the report and the exit code.
fn with_attributes(shim: &[(&str, &str)], checks: &str) -> (Value, Option<i32>) {
    let lib = common::preload_library("attrs");
    let mut c = tool();
    c.args(["--provider", "tcp;ofi_rxm", "--json"])
        .env("NCCL_FABRIC_DOMAINS", "lo")
        .env("LD_PRELOAD", &lib)
        .env("NFAB_CONFORM_CHECKS", checks)
        .envs(shim.iter().copied());
    let out = run_command(&mut c, Duration::from_secs(120));
    (report(&out), out.status.code())
}

/// Providers that ask for what the plugin does not do: each is refused with the reason in
/// the choice row, and the tool exits 1.
#[test]
fn conform_names_the_attribute_a_provider_lacks() {
    for (shim, reason) in [
        (("NFAB_SHIM_TAG_BITS", "16"), "its tags have 16 bits"),
        (
            ("NFAB_SHIM_MAX_MSG", "65536"),
            "its largest message is 65536 bytes",
        ),
        (
            ("NFAB_SHIM_MODE", "0x400000000000000"),
            "it requires mode bits 0x400000000000000",
        ),
        (("NFAB_SHIM_MR_MODE", "0x8"), "it requires mr_mode bits 0x8"),
    ] {
        let (v, code) = with_attributes(&[shim], "none");
        let choice = row(&v, "the plugin's choice");
        assert_eq!(choice["verdict"], "FAIL", "{shim:?}: {v:#}");
        assert!(
            choice["observed"]
                .as_str()
                .is_some_and(|s| s.contains(reason)),
            "{shim:?}: {choice:#}"
        );
        assert_eq!(code, Some(1), "{shim:?}");
    }
}

/// A provider whose messages are smaller than the plugin's largest (1 MiB here) is used, and
/// NCCL is told the size: the row says so and a transfer within it passes.
#[test]
fn conform_accepts_a_provider_with_smaller_messages() {
    let (v, code) = with_attributes(&[("NFAB_SHIM_MAX_MSG", "1048576")], "comms1");
    let sizes = row(&v, "message sizes");
    assert_eq!(sizes["verdict"], "pass", "{v:#}");
    assert!(
        sizes["observed"]
            .as_str()
            .is_some_and(|s| s.contains("max_msg_size 1048576")),
        "{sizes:#}"
    );
    assert_eq!(
        row(&v, "1 comm pair(s) each way")["verdict"],
        "pass",
        "{v:#}"
    );
    assert_eq!(code, Some(0), "{v:#}");
}

/// A provider whose completion queues fail (the preload of the faults tests, its trigger
/// present from the start): the first two-process check fails with the provider's error.
#[test]
fn conform_reports_a_provider_whose_completion_queue_fails() {
    let shim = common::preload_library("cq_fails");
    let trigger = std::env::temp_dir().join(format!("nfab-conform-cq-{}", std::process::id()));
    std::fs::write(&trigger, b"now").expect("trigger");
    let mut c = tool();
    c.args(["--provider", "tcp;ofi_rxm", "--json"])
        .env("NCCL_FABRIC_DOMAINS", "lo")
        .env("LD_PRELOAD", &shim)
        .env("NFAB_CQ_FAIL_FILE", &trigger)
        .env("NFAB_CONFORM_CHECKS", "comms1");
    let out = run_command(&mut c, Duration::from_secs(180));
    let _ = std::fs::remove_file(&trigger);
    let v = report(&out);
    let first = row(&v, "1 comm pair(s) each way");
    assert_eq!(first["verdict"], "FAIL", "{v:#}");
    let said = first["observed"].as_str().unwrap_or_default();
    assert!(
        said.contains("Input/output error") || said.contains("completion queue"),
        "{first:#}"
    );
    assert_eq!(out.status.code(), Some(1));
}

/// The two sides on two hosts: `--listen` on one, `--peer` on the other, over the hosts' own
/// link.
#[test]
fn conform_between_two_hosts() {
    if !hosts_or_skip() {
        return;
    }
    const PORT: &str = "47123";
    let hosts = Hosts::new(2);
    let inside = |i: usize, args: &[&str]| {
        let mut c = Command::new(&hosts.wrapper(i)[0]);
        c.args(&hosts.wrapper(i)[1..])
            .arg(env!("CARGO_BIN_EXE_nccl-net-fabric"))
            .arg("conform")
            .arg("--plugin")
            .arg(nccl_net_host::PluginLib::default_path())
            .args(args)
            .env("NCCL_FABRIC_DOMAINS", IFACE);
        c
    };
    let mut listener = inside(1, &["--listen", PORT]);
    let listening = listener
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the listening side");
    let peer = format!("{}:{PORT}", hosts.hosts[1].addr);
    let mut c = inside(0, &["--peer", &peer, "--provider", "tcp;ofi_rxm", "--json"]);
    let out = run_command(&mut c, Duration::from_secs(300));
    let mut listening = listening;
    let _ = listening.kill();
    let _ = listening.wait();
    let v = report(&out);
    assert_conforms(&v, "two hosts");
    assert!(
        row(&v, "the plugin's choice")["observed"]
            .as_str()
            .is_some_and(|s| s.contains(IFACE)),
        "{v:#}"
    );
}
