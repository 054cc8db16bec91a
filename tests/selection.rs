//! Provider selection against real libfabric: the FI_HMEM attempt, the setopt answer, the
//! host fallback, NCCL_FABRIC_HMEM=require, the log lines and the `doctor` report.

mod common;

use common::*;
use nccl_net_fabric::nccl::NcclResult;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// setopt(FI_OPT_CUDA_API_PERMITTED=false) on shm without a GPU, as measured: -92 on 1.17
/// (option unknown), -22 on 2.1 (no CUDA).
fn shm_answer() -> i32 {
    if libfabric_version() >= (1, 18) {
        -22
    } else {
        -92
    }
}

#[test]
#[ignore = "child process of another test"]
fn child_init() {
    let lib = plugin();
    match lib.init(true) {
        Ok(()) => {
            println!("RESULT init=0");
            println!(
                "RESULT ptr_support={}",
                lib.properties(0).expect("props").ptr_support
            );
        }
        Err(e) => println!("RESULT init={}", e.code),
    }
}

#[test]
fn shm_offers_hmem_but_settles_on_host_buffers() {
    let f = run_child_ok(
        "child_init",
        &env_with(&[("FI_PROVIDER", "shm"), ("NCCL_DEBUG", "INFO")]),
        T,
    );
    assert_eq!(f.result("init").as_deref(), Some("0"), "{}", f.stderr);
    assert_eq!(
        f.result("ptr_support").as_deref(),
        Some("1"),
        "host buffers only"
    );
    let info = f
        .stderr
        .lines()
        .find(|l| l.starts_with("NCCL INFO NET/Fabric : provider shm"))
        .unwrap_or_else(|| panic!("no INFO line: {}", f.stderr));
    let answer = shm_answer();
    assert!(
        info.contains("GPU buffers: no: shm offers FI_HMEM but"),
        "{info}"
    );
    assert!(info.contains(&format!("= {answer} (")), "{info}");
    let meaning = if answer == -92 {
        "does not know the option"
    } else {
        "no CUDA library or device"
    };
    assert!(info.contains(meaning), "{info}");
    assert!(
        info.contains(&format!(
            "libfabric {}.{}",
            libfabric_version().0,
            libfabric_version().1
        )),
        "{info}"
    );
}

/// The plugin's WARN line of a failed init, checked to be one short line.
fn init_warning(stderr: &str) -> &str {
    let warn = stderr
        .lines()
        .find(|l| l.contains("NCCL WARN NET/Fabric"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(warn.len() < 600, "one short line: {warn}");
    warn
}

#[test]
fn require_fails_with_the_reason() {
    let f = run_child_ok(
        "child_init",
        &env_with(&[("FI_PROVIDER", "shm"), ("NCCL_FABRIC_HMEM", "require")]),
        T,
    );
    assert_eq!(
        f.result("init"),
        Some((NcclResult::InvalidUsage as i32).to_string())
    );
    let warn = init_warning(&f.stderr);
    assert!(warn.contains("NCCL_FABRIC_HMEM=require"), "{warn}");
    assert!(
        warn.contains("closest shm on shm (Hmem pass)"),
        "the candidate that came closest: {warn}"
    );
    assert!(warn.contains(&shm_answer().to_string()), "{warn}");
}

/// rxm's write rendezvous would put long messages at the start of NCCL's registrations: init
/// refuses rxm while it is on, in one line that says which variable to unset.
#[test]
fn rxm_writing_long_messages_is_refused() {
    let f = run_child_ok(
        "child_init",
        &env_with(&[
            ("NCCL_FABRIC_PROVIDER", "tcp;ofi_rxm"),
            ("FI_OFI_RXM_USE_RNDV_WRITE", "1"),
        ]),
        T,
    );
    assert_ne!(f.result("init"), Some("0".into()), "{}", f.stderr);
    let warn = init_warning(&f.stderr);
    assert!(
        warn.contains("FI_OFI_RXM_USE_RNDV_WRITE is on") && warn.contains("unset it"),
        "{warn}"
    );
}

#[test]
fn off_and_force_modes() {
    for mode in ["off", "force"] {
        let f = run_child_ok(
            "child_init",
            &env_with(&[
                ("FI_PROVIDER", "shm"),
                ("NCCL_FABRIC_HMEM", mode),
                ("NCCL_DEBUG", "INFO"),
            ]),
            T,
        );
        assert_eq!(
            f.result("init").as_deref(),
            Some("0"),
            "{mode}: {}",
            f.stderr
        );
        let expect_gpu = mode == "force" && shm_answer() == -92;
        let ptr = if expect_gpu { "3" } else { "1" };
        assert_eq!(
            f.result("ptr_support").as_deref(),
            Some(ptr),
            "{mode}: {}",
            f.stderr
        );
        // Forcing GPU buffers on a provider that does not know the option warns that the
        // promise is the user's (1.17, where shm answers -92).
        let warned = f
            .stderr
            .contains("NCCL WARN NET/Fabric : NCCL_FABRIC_HMEM=force");
        assert_eq!(warned, expect_gpu, "{mode}: {}", f.stderr);
    }
}

#[test]
fn tcp_finds_no_hmem_and_falls_back_to_host() {
    let f = run_child_ok(
        "child_init",
        &env_with(&[("FI_PROVIDER", "tcp"), ("NCCL_DEBUG", "TRACE")]),
        T,
    );
    assert_eq!(f.result("init").as_deref(), Some("0"), "{}", f.stderr);
    assert_eq!(f.result("ptr_support").as_deref(), Some("1"));
    let info = f
        .stderr
        .lines()
        .find(|l| l.starts_with("NCCL INFO NET/Fabric : provider tcp;ofi_rxm"))
        .unwrap_or_else(|| panic!("{}", f.stderr));
    assert!(
        info.contains("no provider offers FI_HMEM (hints FI_TAGGED|FI_MSG|FI_HMEM found nothing)"),
        "{info}"
    );
    // TRACE: one line per candidate with its verdict.
    let traces: Vec<&str> = f
        .stderr
        .lines()
        .filter(|l| l.starts_with("NCCL TRACE NET/Fabric : candidate "))
        .collect();
    assert!(!traces.is_empty(), "{}", f.stderr);
    assert!(
        traces
            .iter()
            .any(|l| l.contains("domain lo") && l.contains("chosen")),
        "{traces:#?}"
    );
}

#[test]
fn provider_setting_picks_and_orders() {
    let f = run_child_ok(
        "child_init",
        &env_with(&[
            ("NCCL_FABRIC_PROVIDER", "shm,tcp;ofi_rxm"),
            ("NCCL_DEBUG", "INFO"),
        ]),
        T,
    );
    assert!(
        f.stderr.contains("NCCL INFO NET/Fabric : provider shm "),
        "{}",
        f.stderr
    );
    let f = run_child_ok(
        "child_init",
        &env_with(&[
            ("NCCL_FABRIC_PROVIDER", "tcp;ofi_rxm,shm"),
            ("NCCL_DEBUG", "INFO"),
        ]),
        T,
    );
    assert!(
        f.stderr
            .contains("NCCL INFO NET/Fabric : provider tcp;ofi_rxm "),
        "{}",
        f.stderr
    );
    let f = run_child_ok(
        "child_init",
        &env_with(&[
            ("NCCL_FABRIC_EXCLUDE_DOMAINS", "lo"),
            ("NCCL_FABRIC_DOMAINS", "lo"),
            ("FI_PROVIDER", "tcp"),
        ]),
        T,
    );
    assert_eq!(
        f.result("init"),
        Some((NcclResult::SystemError as i32).to_string()),
        "excluded lo leaves nothing"
    );
    assert!(
        f.stderr
            .contains("domain excluded by NCCL_FABRIC_EXCLUDE_DOMAINS"),
        "{}",
        f.stderr
    );
}

fn doctor(args: &[&str], pairs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nccl-net-fabric"))
        .arg("doctor")
        .args(args)
        .envs(env_with(pairs))
        .output()
        .expect("run doctor");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn doctor_table() {
    let (ok, out, err) = doctor(&["--verbose"], &[("FI_PROVIDER", "shm")]);
    assert!(ok, "{out}{err}");
    let (major, minor) = libfabric_version();
    assert!(
        out.starts_with(&format!("libfabric {major}.{minor} (runtime)")),
        "{out}"
    );
    let hmem_row = out
        .lines()
        .find(|l| l.contains(" shm ") && l.contains(" hmem "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(hmem_row.contains(" yes "), "FI_HMEM offered: {hmem_row}");
    assert!(hmem_row.contains(&shm_answer().to_string()), "{hmem_row}");
    let host_row = out
        .lines()
        .find(|l| l.starts_with("0 ") && l.contains(" shm "))
        .unwrap_or_else(|| panic!("device 0 row: {out}"));
    assert!(
        host_row.contains(" host ") && host_row.contains("chosen"),
        "{host_row}"
    );
    assert!(out.contains("NCCL would use: shm (1 device(s))"), "{out}");
    assert!(out.contains("GPU buffers: no"), "{out}");
}

#[test]
fn doctor_json() {
    let (ok, out, err) = doctor(&["--json"], &[("FI_PROVIDER", "shm")]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["provider"], "shm");
    assert_eq!(v["gpu_buffers"], false);
    assert_eq!(v["usable"], true);
    let cands = v["candidates"].as_array().expect("candidates");
    let hmem = cands
        .iter()
        .find(|c| c["pass"] == "hmem")
        .expect("the FI_HMEM pass found shm");
    assert_eq!(hmem["hmem_offered"], true);
    assert_eq!(hmem["setopt"], shm_answer());
    let dev = cands.iter().find(|c| c["device"] == 0).expect("device 0");
    assert_eq!(dev["pass"], "host");
}

#[test]
fn doctor_fails_when_nothing_is_usable() {
    let (ok, out, _) = doctor(&[], &[("FI_PROVIDER", "doesnotexist")]);
    assert!(!ok);
    assert!(
        out.contains("nothing usable: no libfabric provider matched"),
        "{out}"
    );
    let (ok, out, _) = doctor(
        &["--json"],
        &[("FI_PROVIDER", "shm"), ("NCCL_FABRIC_HMEM", "require")],
    );
    assert!(!ok);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["usable"], false);
    assert!(v["failure"]
        .as_str()
        .unwrap_or("")
        .contains("NCCL_FABRIC_HMEM=require"));
}
