//! Installing: `scripts/install.sh` into a scratch prefix and the Debian package from
//! `scripts/package-deb.sh` unpacked into a scratch root, each then checked with its
//! installed tool (`doctor --selftest`, `demo`) finding its installed library. Each builds
//! the plugin in release mode first.

mod common;

use common::run_command;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Builds take minutes on a small machine.
const BUILD: Duration = Duration::from_secs(1200);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nfab-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The libfabric this test run builds against: LIBFABRIC_DIR's (2.1 here), else Debian's.
fn expected_libfabric() -> String {
    if std::env::var_os("LIBFABRIC_DIR").is_some() {
        return "2.1".into();
    }
    let o = Command::new("pkg-config")
        .args(["--modversion", "libfabric"])
        .output()
        .expect("pkg-config");
    let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
    v.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// The installed tool's self-test and demo, over loopback.
fn check_installed(tool: &Path) {
    for args in [&["doctor", "--selftest"][..], &["demo"]] {
        let o = run_command(
            Command::new(tool)
                .args(args)
                .env("NCCL_FABRIC_DOMAINS", "lo,shm"),
            Duration::from_secs(180),
        );
        assert!(
            o.status.success(),
            "{} {args:?}: {}",
            tool.display(),
            text(&o)
        );
    }
}

#[test]
fn install_script_installs_what_it_built_and_says_which_libfabric() {
    let prefix = scratch("prefix");
    let o = run_command(
        Command::new("bash")
            .arg(repo().join("scripts/install.sh"))
            .arg(&prefix),
        BUILD,
    );
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    let want = expected_libfabric();
    assert!(
        said.contains(&format!("built against {want} (headers)")),
        "expected libfabric {want}: {said}"
    );
    assert!(
        said.contains(&format!("version {want}")),
        "the installed library loads libfabric {want}: {said}"
    );
    for f in [
        "lib/libnccl-net-fabric.so",
        "lib/libnccl-net.so",
        "bin/nccl-net-fabric",
    ] {
        assert!(prefix.join(f).exists(), "{f} installed");
    }
    check_installed(&prefix.join("bin/nccl-net-fabric"));
    let _ = std::fs::remove_dir_all(&prefix);
}

#[test]
fn debian_package_installs_a_working_plugin() {
    if std::env::var_os("LIBFABRIC_DIR").is_some() {
        eprintln!("skipped: the package is built against Debian's libfabric only");
        return;
    }
    let out = scratch("deb");
    let o = run_command(
        Command::new("bash")
            .arg(repo().join("scripts/package-deb.sh"))
            .arg(&out),
        BUILD,
    );
    assert!(o.status.success(), "{}", text(&o));
    let deb = PathBuf::from(
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .lines()
            .last()
            .unwrap(),
    );
    let name = deb.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with(&format!("nccl-net-fabric_{}_", env!("CARGO_PKG_VERSION")))
            && name.ends_with(".deb"),
        "{name}"
    );
    let depends = run_command(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&deb)
            .arg("Depends"),
        Duration::from_secs(60),
    );
    assert!(
        String::from_utf8_lossy(&depends.stdout).contains("libfabric1 (>= "),
        "{}",
        text(&depends)
    );
    let root = out.join("root");
    let x = run_command(
        Command::new("dpkg").arg("-x").arg(&deb).arg(&root),
        Duration::from_secs(60),
    );
    assert!(x.status.success(), "{}", text(&x));
    let lib = root.join(format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH));
    assert!(lib.join("libnccl-net-fabric.so").exists());
    assert_eq!(
        std::fs::read_link(lib.join("libnccl-net.so")).unwrap(),
        Path::new("libnccl-net-fabric.so")
    );
    check_installed(&root.join("usr/bin/nccl-net-fabric"));
    let _ = std::fs::remove_dir_all(&out);
}

/// A folder of stand-ins for `dpkg-query`, `apt-get` and `sudo` (every package missing; apt
/// prints what Debian's mirrors make it print, and succeeds or fails as told).
fn fake_apt(dir: &Path, apt_fails: bool) {
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write stand-in");
        let _ = Command::new("chmod").arg("+x").arg(&p).status();
    };
    write("dpkg-query", "exit 1");
    write("sudo", "exec \"$@\"");
    write(
        "apt-get",
        &format!(
            "echo 'W: Download is performed unsandboxed as root' >&2\n\
             echo 'E: Failed to fetch http://mirror/x.dsc  404  Not Found' >&2\n\
             exit {}",
            if apt_fails { 100 } else { 0 }
        ),
    );
}

#[test]
fn setup_keeps_apt_output_in_a_log_unless_it_fails() {
    for fails in [false, true] {
        let dir = scratch(if fails { "apt-fails" } else { "apt-ok" });
        fake_apt(&dir, fails);
        let path = format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let o = run_command(
            Command::new("bash")
                .arg(repo().join("scripts/setup-debian.sh"))
                .env("PATH", path)
                .env("TMPDIR", &dir),
            Duration::from_secs(60),
        );
        let said = text(&o);
        let log = std::fs::read_to_string(dir.join("nccl-net-fabric-setup-debian.log"))
            .unwrap_or_default();
        assert!(
            log.contains("E: Failed to fetch"),
            "apt's output is logged: {log}"
        );
        if fails {
            assert_eq!(o.status.code(), Some(1), "{said}");
            assert!(
                said.contains("E: Failed to fetch"),
                "a failure shows apt's words: {said}"
            );
        } else {
            assert!(o.status.success(), "{said}");
            assert!(said.contains("setup-debian: installing"), "{said}");
            assert!(
                !said.contains("E: ") && !said.contains("W: "),
                "no apt noise: {said}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
