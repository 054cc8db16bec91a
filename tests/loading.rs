//! The plugin as NCCL loads it: dlopen with RTLD_NOW|RTLD_LOCAL, the v8 table, exported
//! symbols, init/devices/getProperties with real providers, and init's failures.

mod common;

use common::*;
use nccl_net_fabric::nccl::{NcclResult, PTR_HOST};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// The plugin's path, for dlopen.
fn plugin_path() -> std::ffi::CString {
    let path = nccl_net_host::PluginLib::default_path();
    std::ffi::CString::new(path.to_string_lossy().as_bytes()).unwrap()
}

#[test]
fn only_the_table_is_exported() {
    let path = nccl_net_host::PluginLib::default_path();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&path)
        .output()
        .expect("run nm");
    assert!(
        out.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let symbols: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    let mut sorted = symbols.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["10", "11", "12", "6", "7", "8", "9"]
            .map(|v| format!("ncclNetPlugin_v{v}"))
            .into_iter()
            .collect::<Vec<_>>(),
        "exported: {symbols:?}"
    );
    // Nor does it contain the host side of the ABI (the tool's and the tests' loader).
    let all = Command::new("nm").arg(&path).output().expect("run nm");
    let host: Vec<String> = String::from_utf8_lossy(&all.stdout)
        .lines()
        .filter(|l| {
            ["nccl_net_host", "host_logger", "PluginLib"]
                .iter()
                .any(|s| l.contains(s))
        })
        .map(String::from)
        .collect();
    assert!(
        all.status.success() && host.is_empty(),
        "host code in the plugin: {host:?}"
    );
    let lib = plugin();
    assert!(lib.symbol("ncclNetPlugin_v8"));
    assert!(!lib.symbol("rust_begin_unwind"));
    assert!(!lib.symbol("fi_tsend__extern"));
    assert_eq!(lib.name(), "Fabric");
    assert_eq!(
        lib.optional_entries(),
        (true, true, true),
        "every field filled"
    );
}

#[test]
fn soname_is_what_ld_preload_needs() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(nccl_net_host::PluginLib::default_path())
        .output()
        .expect("readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libnccl-net.so]"), "{text}");
    assert!(
        text.contains("NODELETE"),
        "dlclose must not unload libfabric under NCCL: {text}"
    );
}

/// Prints NCCL's point-to-point chunk, and the rate NCCL 2.30 gives a point-to-point channel,
/// as this process's environment has them now.
fn print_nccl_vars() {
    let var = |k| std::env::var(k).unwrap_or_else(|_| "unset".into());
    println!("RESULT chunk={}", var("NCCL_P2P_NET_CHUNKSIZE"));
    println!("RESULT p2p_bw={}", var("NCCL_P2P_PER_CHANNEL_NET_BW"));
}

/// Child: what NCCL does with a plugin whose init failed: dlclose it, then carry on.
#[test]
#[ignore = "child process of another test"]
fn child_failed_init_then_dlclose() {
    let path = plugin_path();
    // SAFETY: plain dlopen/dlsym/dlclose of the plugin, as NCCL does.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null());
        let table =
            libc::dlsym(h, c"ncclNetPlugin_v8".as_ptr()).cast::<nccl_net_fabric::nccl::NetV8>();
        assert!(!table.is_null());
        let rc = ((*table).init)(None);
        println!("RESULT init={rc}");
        // A failed init leaves NCCL's variables alone: NCCL goes on with another transport.
        print_nccl_vars();
        assert_eq!(libc::dlclose(h), 0);
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Loaded again, init is tried again and fails the same way, without a crash.
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        let table =
            libc::dlsym(h, c"ncclNetPlugin_v8".as_ptr()).cast::<nccl_net_fabric::nccl::NetV8>();
        println!("RESULT init_again={}", ((*table).init)(None));
        assert_eq!(libc::dlclose(h), 0);
    }
    println!("RESULT ok=1");
}

#[test]
fn failed_init_then_dlclose_does_not_crash() {
    let env = env_with(&[("FI_PROVIDER", "doesnotexist")]);
    let f = run_child_ok("child_failed_init_then_dlclose", &env, T);
    assert_eq!(
        f.result("init"),
        Some((NcclResult::SystemError as i32).to_string())
    );
    assert_eq!(
        f.result("init_again"),
        Some((NcclResult::SystemError as i32).to_string())
    );
    assert_eq!(f.result("ok").as_deref(), Some("1"));
    assert_eq!(f.result("chunk").as_deref(), Some("unset"));
    assert_eq!(f.result("p2p_bw").as_deref(), Some("unset"));
}

/// Child: init/devices/getProperties through the table; prints what it saw.
#[test]
#[ignore = "child process of another test"]
fn child_report() {
    let lib = plugin();
    // With an NCCL-style logger, so WARN/INFO lines go through the plugin's NCCL layer.
    match lib.init(true) {
        Ok(()) => println!("RESULT init=0"),
        Err(e) => {
            println!("RESULT init={}", e.code);
            return;
        }
    }
    // NCCL's own variables the plugin sets for its provider (over rxm only).
    print_nccl_vars();
    let n = lib.devices().expect("devices");
    println!("RESULT devices={n}");
    let mut names = Vec::new();
    for d in 0..n {
        let p = lib.properties(d).expect("getProperties");
        assert_eq!(p.max_recvs, 8);
        assert_eq!(p.net_device_type, 0, "host device");
        assert!(p.speed > 0);
        assert!(p.ptr_support & PTR_HOST != 0);
        assert!(p.max_comms > 0);
        names.push(p.name);
    }
    println!("RESULT names={}", names.join(","));
    let first = lib.properties(0).expect("getProperties");
    println!("RESULT ptr_support={}", first.ptr_support);
    println!("RESULT speed={}", first.speed);
    println!(
        "RESULT pci_path={}",
        first.pci_path.unwrap_or_else(|| "NULL".into())
    );
    // Out-of-range devices are an error, not a crash.
    let bad = lib.properties(n).unwrap_err();
    println!("RESULT bad_device={}", bad.code);
    // A second init keeps the first decision.
    lib.init(true).expect("second init");
    assert_eq!(lib.devices().unwrap(), n);
}

fn report(env: &[(&str, &str)]) -> Finished {
    run_child_ok("child_report", &env_with(env), T)
}

#[test]
fn tcp_devices_and_properties() {
    let f = report(&[("FI_PROVIDER", "tcp")]);
    assert_eq!(f.result("init").as_deref(), Some("0"), "{}", f.stderr);
    assert_eq!(
        f.result("devices").as_deref(),
        Some("1"),
        "only lo is allowed: {}",
        f.stdout
    );
    assert_eq!(f.result("names").as_deref(), Some("lo"));
    assert_eq!(
        f.result("chunk").as_deref(),
        Some("524288"),
        "NCCL's point-to-point chunk over rxm"
    );
    assert_eq!(
        f.result("p2p_bw").as_deref(),
        Some("2"),
        "2 point-to-point channels per network peer on NCCL 2.30 over rxm"
    );
    assert_eq!(
        f.result("ptr_support").as_deref(),
        Some("1"),
        "tcp carries host buffers only"
    );
    assert_eq!(
        f.result("pci_path").as_deref(),
        Some("NULL"),
        "lo has no PCI device"
    );
    assert_eq!(
        f.result("speed").as_deref(),
        Some("25000"),
        "lo reports no speed: NCCL is told 25 Gb/s"
    );
    assert_eq!(
        f.result("bad_device"),
        Some((NcclResult::InvalidArgument as i32).to_string())
    );
}

#[test]
fn shm_devices_and_properties() {
    let f = report(&[("FI_PROVIDER", "shm")]);
    assert_eq!(f.result("init").as_deref(), Some("0"), "{}", f.stderr);
    assert_eq!(f.result("devices").as_deref(), Some("1"));
    assert_eq!(f.result("names").as_deref(), Some("shm"));
    assert_eq!(
        f.result("chunk").as_deref(),
        Some("unset"),
        "set over rxm only"
    );
    assert_eq!(
        f.result("p2p_bw").as_deref(),
        Some("unset"),
        "over rxm only"
    );
    assert_eq!(f.result("ptr_support").as_deref(), Some("1"));
    // No link to report: shared memory is announced as 400 Gb/s, so NCCL opens 4 channels.
    assert_eq!(f.result("speed").as_deref(), Some("400000"));
    let set = report(&[("FI_PROVIDER", "shm"), ("NCCL_FABRIC_SPEED_MBPS", "25000")]);
    assert_eq!(set.result("speed").as_deref(), Some("25000"));
}

#[test]
fn device_names_are_unique() {
    let f = report(&[
        ("NCCL_FABRIC_DOMAINS", "*"),
        ("NCCL_FABRIC_PROVIDER", "tcp;ofi_rxm"),
    ]);
    let names = f.result("names").unwrap_or_default();
    let list: Vec<&str> = names.split(',').collect();
    let mut dedup = list.clone();
    dedup.sort_unstable();
    dedup.dedup();
    assert_eq!(list.len(), dedup.len(), "{names}");
    assert!(list.contains(&"lo"), "{names}");
}

#[test]
fn unknown_provider_fails_init_with_a_warning() {
    let f = report(&[("FI_PROVIDER", "doesnotexist")]);
    assert_eq!(
        f.result("init"),
        Some((NcclResult::SystemError as i32).to_string()),
        "{}",
        f.stdout
    );
    assert!(
        f.stderr
            .contains("NCCL WARN NET/Fabric : init: no libfabric provider matched"),
        "{}",
        f.stderr
    );
    assert!(
        f.stderr.contains("FI_PROVIDER=doesnotexist"),
        "the WARN says what was asked for: {}",
        f.stderr
    );
}

#[test]
fn bad_setting_is_invalid_usage_naming_the_variable() {
    let f = report(&[("NCCL_FABRIC_HMEM", "banana")]);
    assert_eq!(
        f.result("init"),
        Some((NcclResult::InvalidUsage as i32).to_string())
    );
    assert!(f.stderr.contains("NCCL_FABRIC_HMEM=banana"), "{}", f.stderr);
    assert!(
        f.stderr.contains("auto, require, off, force"),
        "{}",
        f.stderr
    );
    let f = report(&[("NCCL_FABRIC_CONNECT_TIMEOUT_MS", "soon")]);
    assert_eq!(
        f.result("init"),
        Some((NcclResult::InvalidUsage as i32).to_string())
    );
    assert!(
        f.stderr.contains("NCCL_FABRIC_CONNECT_TIMEOUT_MS=soon"),
        "{}",
        f.stderr
    );
}

#[test]
fn calls_before_init_fail_cleanly() {
    // In this process nobody called init on this copy of the plugin... unless another test
    // did; run it in a child to be sure.
    let f = run_child_ok("child_before_init", &[], T);
    assert_eq!(
        f.result("devices"),
        Some((NcclResult::InternalError as i32).to_string())
    );
}

#[test]
#[ignore = "child process of another test"]
fn child_before_init() {
    let lib = plugin();
    println!("RESULT devices={}", lib.devices().unwrap_err().code);
}

#[test]
fn settings_doc_table_matches_the_code() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md"))
        .expect("docs/settings.md");
    let table = nccl_net_fabric::settings::markdown_table();
    assert!(doc.contains(&table), "docs/settings.md's table is out of date: regenerate it with `scripts/update-settings-doc.sh`\n{table}");
}

/// Child: the v11 table as NCCL 2.28 drives it: init per communicator with a context,
/// v11 properties, size_t sends and receives, finalize.
#[test]
#[ignore = "child process of another test"]
fn child_v11() {
    let lib = plugin();
    let path = plugin_path();
    // SAFETY: the plugin is loaded (above); the v11 table is an immutable static there.
    let t = unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        &*libc::dlsym(h, c"ncclNetPlugin_v11".as_ptr()).cast::<nccl_net_fabric::nccl::NetV11>()
    };
    // SAFETY: each call passes valid out-pointers, as NCCL does.
    unsafe {
        let mut ctx = std::ptr::null_mut();
        let rc = (t.init)(&mut ctx, 0x1234, std::ptr::null_mut(), None, None);
        println!("RESULT init={rc}");
        if rc != 0 {
            assert!(ctx.is_null());
            // NCCL 2.28 calls finalize after a failed init.
            println!("RESULT finalize_after_failure={}", (t.finalize)(ctx));
            return;
        }
        assert!(!ctx.is_null());
        let mut ctx2 = std::ptr::null_mut();
        assert_eq!(
            (t.init)(&mut ctx2, 0x5678, std::ptr::null_mut(), None, None),
            0
        );
        let mut n = 0;
        assert_eq!((t.devices)(&mut n), 0);
        let mut p: nccl_net_fabric::nccl::PropertiesV11 = std::mem::zeroed();
        assert_eq!((t.get_properties)(0, &mut p), 0);
        assert_eq!(p.max_recvs, 8);
        assert_eq!(p.v_props.ndevs, 1);
        assert_eq!(p.v_props.devs[0], 0);
        assert_eq!(p.max_p2p_bytes, i32::MAX as usize);
        assert_eq!(p.max_multi_request_size, 1);
        // A transfer with size_t sizes through the v11 entry points.
        let mut handle = [0u8; 128];
        let mut listen = std::ptr::null_mut();
        assert_eq!(
            (t.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut listen),
            0
        );
        let (mut send, mut recv): (*mut std::ffi::c_void, *mut std::ffi::c_void) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        let deadline = std::time::Instant::now() + T;
        while send.is_null() || recv.is_null() {
            let mut dh = std::ptr::null_mut();
            if send.is_null() {
                assert_eq!(
                    (t.connect)(ctx2, 0, handle.as_mut_ptr().cast(), &mut send, &mut dh),
                    0
                );
            }
            if recv.is_null() {
                assert_eq!((t.accept)(listen, &mut recv, &mut dh), 0);
            }
            assert!(std::time::Instant::now() < deadline);
        }
        assert_eq!((t.close_listen)(listen), 0);
        let mut src = common::pattern(3, 100_000);
        let mut dst = vec![0u8; 100_000];
        let mut sreq: *mut std::ffi::c_void = std::ptr::null_mut();
        // NCCL may pre-set a receive request to 0x1 as a hint; the plugin must overwrite it.
        let mut rreq = 1 as *mut std::ffi::c_void;
        let mut datas = [dst.as_mut_ptr().cast::<std::ffi::c_void>()];
        let mut sizes = [dst.len()];
        let mut tags = [0];
        let mut mhs = [std::ptr::null_mut()];
        let mut phs = [std::ptr::null_mut()];
        while rreq.is_null() || rreq as usize == 1 {
            assert_eq!(
                (t.irecv)(
                    recv,
                    1,
                    datas.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    tags.as_mut_ptr(),
                    mhs.as_mut_ptr(),
                    phs.as_mut_ptr(),
                    &mut rreq
                ),
                0
            );
        }
        while sreq.is_null() {
            assert_eq!(
                (t.isend)(
                    send,
                    src.as_mut_ptr().cast(),
                    src.len(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut sreq
                ),
                0
            );
        }
        // Test both in turn, as NCCL's progress thread does: a provider with manual progress
        // moves the send only while the receiving endpoint is driven too.
        let mut pending = vec![sreq, rreq];
        while !pending.is_empty() {
            pending.retain(|&r| {
                let (mut done, mut size) = (0, 0);
                assert_eq!((t.test)(r, &mut done, &mut size), 0);
                if done != 0 {
                    assert_eq!(size, 100_000);
                }
                done == 0
            });
            assert!(std::time::Instant::now() < deadline, "transfer deadline");
        }
        assert_eq!(dst, src);
        assert_eq!((t.close_send)(send), 0);
        assert_eq!((t.close_recv)(recv), 0);
        assert_eq!((t.set_net_attr.unwrap())(ctx, std::ptr::null_mut()), 0);
        assert_eq!((t.finalize)(ctx), 0);
        assert_eq!((t.finalize)(ctx2), 0);
        // The plugin's state outlives one communicator's finalize: the v8 table still works.
        assert_eq!(lib.devices().unwrap(), n);
    }
    println!("RESULT ok=1");
}

#[test]
fn v11_table_works_and_survives_a_failed_init() {
    for provider in ["tcp", "shm"] {
        let f = report_child("child_v11", &[("FI_PROVIDER", provider)]);
        assert_eq!(
            f.result("ok").as_deref(),
            Some("1"),
            "{provider}: {}",
            f.stderr
        );
    }
    let f = report_child("child_v11", &[("FI_PROVIDER", "doesnotexist")]);
    assert_eq!(
        f.result("init"),
        Some((NcclResult::SystemError as i32).to_string())
    );
    assert_eq!(f.result("finalize_after_failure").as_deref(), Some("0"));
}

fn report_child(name: &str, env: &[(&str, &str)]) -> Finished {
    run_child_ok(name, &env_with(env), T)
}
