//! Faults as they happen in production, driven through the exported C table in separate
//! processes, on every provider the data path runs over (`tcp;ofi_rxm`, `shm`, and native
//! `tcp` on libfabric >= 1.18):
//!
//! 1. a receive smaller than its send (two processes, another comm on the same endpoints);
//! 2. a peer killed on "another host" (its own pid namespace), in both directions;
//! 3. a connect that gave up before the listener (same process) called accept;
//! 4. comm pairs closing while another pair streams on the same endpoints (progress threads);
//! 5. handles naming this process's own closed endpoints; abandoned connects;
//! 6. closes with sends nobody will receive, and release after finalize;
//! 7. a stranger speaking raw libfabric to the endpoints;
//! 8. a stale request pointer.
//!
//! Every wait has a deadline (stretched by `NFAB_SLOW` under valgrind); times the issue
//! cares about are printed as `RESULT` lines and in the test output, not asserted tightly.

mod common;

use common::scenario::*;
use common::stranger::Stranger;
use common::*;
use nccl_net_fabric::handshake::{Handle, Identity, Kind, Record, MSG_SIZE};
use nccl_net_fabric::nccl::{NcclResult, NET_HANDLE_MAXSIZE, PTR_HOST};
use nccl_net_host::{handle_from_hex, handle_to_hex, CallError, PluginLib, Ptr};
use std::time::{Duration, Instant};

const CHILD: f64 = 120.0;

// ---------------------------------------------------------------------------------------
// 1. Truncation: a 64 KiB send into a 4 KiB receive, between two processes.

#[test]
#[ignore = "child process of another test"]
fn child_truncation_receiver() {
    let lib = init();
    let deadline = until(60.0);
    let (ha, la) = lib.listen(0).expect("listen");
    let (hb, lb) = lib.listen(0).expect("listen");
    println!(
        "RESULT handles={} {}",
        handle_to_hex(&ha),
        handle_to_hex(&hb)
    );
    let a = lib.accept_until(la, deadline).expect("accept a");
    let b = lib.accept_until(lb, deadline).expect("accept b");
    lib.close_listen(la).expect("closeListen");
    lib.close_listen(lb).expect("closeListen");
    let mut small = vec![0u8; 4096];
    // SAFETY: small outlives the registration, released below.
    let mh =
        unsafe { lib.reg_mr(a, small.as_mut_ptr().cast(), small.len(), PTR_HOST) }.expect("regMr");
    // SAFETY: small outlives the request, waited for below.
    let r = unsafe { lib.irecv_until(a, small.as_mut_ptr().cast(), 4096, mh, deadline) }
        .expect("irecv");
    println!("RESULT posted=1");
    let started = Instant::now();
    let e = lib
        .wait(r, deadline)
        .expect_err("a 4 KiB receive of a 64 KiB send fails");
    println!(
        "RESULT truncated={} after_ms={}",
        e.code,
        started.elapsed().as_millis()
    );
    assert_ne!(e.code, -1, "failed by error code, not by deadline");
    lib.dereg_mr(a, mh).expect("deregMr after the truncation");
    // The other comm on the same endpoints carries on.
    recv_n(&lib, b, 65_536, 16, deadline);
    lib.close_recv(a).expect("closeRecv a");
    lib.close_recv(b).expect("closeRecv b");
    println!("RESULT ok=1");
}

#[test]
#[ignore = "child process of another test"]
fn child_truncation_sender() {
    let lib = init();
    let deadline = until(60.0);
    let line = read_stdin_line(scaled(30.0));
    let mut handles = line
        .split_whitespace()
        .map(|h| handle_from_hex(h).expect("handle"));
    let (mut ha, mut hb) = (handles.next().unwrap(), handles.next().unwrap());
    let a = lib.connect_until(0, &mut ha, deadline).expect("connect a");
    let b = lib.connect_until(0, &mut hb, deadline).expect("connect b");
    read_stdin_line(scaled(30.0)); // "go": the receive is posted
    let mut big = pattern(1, 65_536);
    // SAFETY: big outlives the request, waited for right away.
    let s = unsafe { lib.isend_until(a, big.as_mut_ptr().cast(), 65_536, NULL, deadline) }
        .expect("isend");
    // The send completes or fails, within the deadline either way.
    println!(
        "RESULT send={:?}",
        lib.wait(s, deadline).map_err(|e| e.code)
    );
    send_n(&lib, b, 65_536, 16, deadline);
    lib.close_send(a).expect("closeSend a");
    lib.close_send(b).expect("closeSend b");
    println!("RESULT ok=1");
}

/// A 64 KiB send into a 4 KiB receive between ranks 0 (receiver) and 1 (sender).
fn truncation(case: &str, env: &[(String, String)], spawn: &Spawner) {
    let mut r = spawn(0, "child_truncation_receiver", env);
    let mut s = spawn(1, "child_truncation_sender", env);
    s.send_line(&r.read_result("handles"));
    r.read_result("posted");
    s.send_line("go");
    let (fr, fs) = (r.finish(), s.finish());
    ok(&fr, &format!("receiver over {case}"));
    ok(&fs, &format!("sender over {case}"));
    let line = fr.result("truncated").expect("truncated");
    eprintln!(
        "{case}: truncated receive: {line}; sender: {:?}",
        fs.result("send")
    );
    assert!(
        line.starts_with(&format!("{} ", NcclResult::InternalError as i32)),
        "over {case}: {line}"
    );
    assert!(
        fr.stderr.contains("receive of 4096 bytes") && fr.stderr.contains("65536 bytes were sent"),
        "over {case}: the WARN names both sizes: {}",
        fr.stderr
    );
}

#[test]
fn a_truncated_receive_fails_alone() {
    let mut cases = envs(&[]);
    // shm gives each comm an endpoint by default: also on shared endpoints.
    let mut shared = provider_env("shm");
    shared.push(("NCCL_FABRIC_ENDPOINTS".into(), "device".into()));
    cases.push(("shm on shared endpoints".into(), shared));
    for (p, env) in cases {
        truncation(&p, &env, &|_, name, env| {
            spawn_child(name, env, scaled(CHILD))
        });
    }
}

/// Runs `scenario` between two test hosts, once per provider that reaches other hosts and
/// per environment in `extras`.
fn across_hosts(scenario: fn(&str, &[(String, String)], &Spawner), extras: &[&[(&str, &str)]]) {
    use common::hosts::{host_env, hosts_or_skip, providers, Hosts};
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        for extra in extras {
            let hosts = Hosts::new(2);
            let spawn =
                |i, name: &str, env: &[(String, String)]| hosts.spawn(i, name, env, scaled(CHILD));
            scenario(&format!("{p} across hosts"), &host_env(p, extra), &spawn);
        }
    }
}

#[test]
fn a_truncated_receive_fails_alone_across_hosts() {
    across_hosts(truncation, &[&[]]);
}

// ---------------------------------------------------------------------------------------
// 2. A peer killed on another host (a pid namespace of its own), both directions.

#[test]
#[ignore = "child process of another test"]
fn child_doomed_peer() {
    // Connects both ways, then streams (sends or receives, as told) until it is killed.
    let lib = init();
    let (send, recv, _) = meet_peer(&lib, until(60.0), false);
    // Its shm files, for the parent to remove (pids in its namespace are small).
    let mine = format!("{}-", std::process::id());
    let files: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&mine))
                .collect()
        })
        .unwrap_or_default();
    println!("RESULT files={}", files.join(","));
    println!("RESULT streaming=1");
    let forever = Instant::now() + Duration::from_secs(600);
    if std::env::var("NFAB_DOOMED_SENDS").is_ok() {
        send_n(&lib, send, 1 << 20, usize::MAX, forever);
    } else {
        recv_n(&lib, recv, 1 << 20, usize::MAX, forever);
    }
}

#[test]
#[ignore = "child process of another test"]
fn child_survivor() {
    let lib = init();
    // The control endpoint opens with the first listen and stays: what is open then is what
    // must be left after finalize.
    let (_, first) = lib.listen(0).expect("listen");
    lib.close_listen(first).expect("closeListen");
    let fds = open_fds();
    let (send, recv, listen) = meet_peer(&lib, until(60.0), true);
    lib.close_listen(listen).expect("closeListen");
    let receiving = std::env::var("NFAB_DOOMED_SENDS").is_ok();
    let comm = if receiving { recv } else { send };
    let (err, since_ok) = transfer_until_error(&lib, comm, receiving, until(120.0));
    assert_ne!(
        err.code, -1,
        "the dead peer was never reported (deadline passed)"
    );
    println!(
        "RESULT error={} detected_ms={}",
        err.code,
        since_ok.as_millis()
    );
    let closing = Instant::now();
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT close_ms={}", closing.elapsed().as_millis());
    // Everything given back, the dead peer's operations included: endpoints that still hold
    // operations close in the background within 2 s (the parent sets no linger).
    lib.finalize().expect("finalize");
    let released = until(4.0);
    while open_fds() > fds && Instant::now() < released {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("RESULT fds={fds}->{}", open_fds());
    println!("RESULT ok=1");
}

/// Receives (or sends) 1 MiB messages on `comm`, each waited for, until one fails; returns
/// the error and how long after the last transfer that completed it came.
fn transfer_until_error(
    lib: &PluginLib,
    comm: Ptr,
    receiving: bool,
    give_up: Instant,
) -> (CallError, Duration) {
    let mut buf = vec![0u8; 1 << 20];
    let mut last_ok = Instant::now();
    loop {
        // SAFETY: buf outlives the request, waited for right away.
        let posted = unsafe {
            if receiving {
                lib.irecv_until(comm, buf.as_mut_ptr().cast(), 1 << 20, NULL, give_up)
            } else {
                lib.isend_until(comm, buf.as_mut_ptr().cast(), 1 << 20, NULL, give_up)
            }
        };
        match posted.and_then(|r| lib.wait(r, give_up)) {
            Ok(_) => last_ok = Instant::now(),
            Err(e) => return (e, last_ok.elapsed()),
        }
    }
}

/// `tests/fault/cq_fails.c` built (a preload that breaks every completion queue of a process
/// once a trigger file exists).
fn cq_fault_library() -> std::path::PathBuf {
    common::preload_library("cq_fails")
}

#[test]
#[ignore = "child process of another test"]
fn child_broken_queue() {
    // Receives a stream until its completion queues break, then tries its send comm too.
    let lib = init();
    let deadline = until(60.0);
    let (send, recv, listen) = meet_peer(&lib, deadline, true);
    lib.close_listen(listen).expect("closeListen");
    println!("RESULT streaming=1");
    let (err, since_ok) = transfer_until_error(&lib, recv, true, deadline);
    println!(
        "RESULT recv_error={} after_ms={}",
        err.code,
        since_ok.as_millis()
    );
    // The other comm of the process: its send fails too, at the post or at its test.
    let mut buf = vec![0u8; 4096];
    let started = Instant::now();
    // SAFETY: buf outlives the request, waited for right away.
    let r = unsafe { lib.isend_until(send, buf.as_mut_ptr().cast(), 4096, NULL, deadline) };
    let code = match r.and_then(|r| lib.wait(r, deadline)) {
        Ok(_) => 0,
        Err(e) => e.code,
    };
    println!(
        "RESULT send_error={code} after_ms={}",
        started.elapsed().as_millis()
    );
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

/// docs/faults.md's row "the provider's completion queue fails": a rank whose completion queues
/// start failing (`fi_cq_read` itself returns an error, made so by a preloaded library that
/// wraps the provider's queue) reports `ncclRemoteError` on every comm at once, with a WARN.
#[test]
fn a_failing_completion_queue_fails_every_comm() {
    let library = cq_fault_library();
    for (p, env) in envs(&[]) {
        let trigger = std::env::temp_dir().join(format!("nfab-cq-broken-{}", std::process::id()));
        let _ = std::fs::remove_file(&trigger);
        let mut broken_env = env.clone();
        broken_env.push(("LD_PRELOAD".into(), library.display().to_string()));
        broken_env.push(("NFAB_CQ_FAIL_FILE".into(), trigger.display().to_string()));
        let mut rank = spawn_child("child_broken_queue", &broken_env, scaled(CHILD));
        let mut peer = spawn_child(
            "child_doomed_peer",
            &{
                let mut e = env.clone();
                e.push(("NFAB_DOOMED_SENDS".into(), "1".into()));
                e
            },
            scaled(CHILD),
        );
        let hr = rank.read_result("handle");
        let hp = peer.read_result("handle");
        rank.send_line(&hp);
        peer.send_line(&hr);
        rank.read_result("streaming");
        let files = peer.read_result("files");
        peer.read_result("streaming");
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(&trigger, b"").expect("trigger");
        let f = rank.finish();
        peer.kill();
        remove_files(&files);
        let _ = std::fs::remove_file(&trigger);
        ok(&f, &p);
        let field = |key: &str, n: &str| -> u64 {
            f.result(key)
                .and_then(|v| {
                    v.split_whitespace()
                        .find_map(|w| w.strip_prefix(n).or(Some(w).filter(|_| n.is_empty())))
                        .and_then(|x| x.parse().ok())
                })
                .unwrap_or_else(|| panic!("{p}: no {key} {n}: {}", f.stdout))
        };
        let remote = NcclResult::RemoteError as u64;
        eprintln!(
            "{p}: receive {:?}, send {:?}",
            f.result("recv_error"),
            f.result("send_error")
        );
        assert_eq!(field("recv_error", ""), remote, "{p}: {}", f.stderr);
        assert_eq!(field("send_error", ""), remote, "{p}: {}", f.stderr);
        // "At once": the driver's next turn; 1 s of slack on a loaded 2-core machine.
        assert!(
            field("recv_error", "after_ms=") <= scaled(1.0).as_millis() as u64,
            "{p}: {}",
            f.stdout
        );
        assert!(
            field("send_error", "after_ms=") <= scaled(1.0).as_millis() as u64,
            "{p}: {}",
            f.stdout
        );
        assert!(
            f.stderr.contains("completion queue failed"),
            "{p}: no WARN naming the queue: {}",
            f.stderr
        );
    }
    let _ = std::fs::remove_file(&library);
}

/// Whether this machine lets us make pid namespaces (root, or user namespaces allowed).
fn can_unshare() -> bool {
    std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

fn remove_files(list: &str) {
    for f in list
        .split(',')
        .filter(|f| !f.is_empty() && !f.contains('/'))
    {
        let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
    }
}

/// Rank 1 (doomed) streams to or from rank 0 (survivor) and is killed; the survivor's
/// comm must fail with ncclRemoteError in time, with a WARN saying why.
fn peer_killed(case: &str, env: &[(String, String)], spawn: &Spawner) {
    let survivor_receives = env.iter().any(|(k, _)| k == "NFAB_DOOMED_SENDS");
    let native_tcp = env
        .iter()
        .any(|(k, v)| k == "NCCL_FABRIC_PROVIDER" && v == "tcp");
    let mut env = env.to_vec();
    env.push(("NCCL_FABRIC_LANE_LINGER_MS".into(), "0".into()));
    let env = &env[..];
    let mut survivor = spawn(0, "child_survivor", env);
    let mut doomed = spawn(1, "child_doomed_peer", env);
    let hs = survivor.read_result("handle");
    let hd = doomed.read_result("handle");
    survivor.send_line(&hd);
    doomed.send_line(&hs);
    let files = doomed.read_result("files");
    doomed.read_result("streaming");
    std::thread::sleep(Duration::from_millis(300));
    doomed.kill();
    remove_files(&files);
    let f = survivor.finish();
    let case = format!(
        "{case}, survivor {}",
        if survivor_receives {
            "receiving"
        } else {
            "sending"
        }
    );
    ok(&f, &case);
    let line = f.result("error").expect("error");
    eprintln!("{case}: {line}, close {:?} ms", f.result("close_ms"));
    let code: i32 = line.split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(code, NcclResult::RemoteError as i32, "{case}: {line}");
    // docs/faults.md: 1.5 s where the peer's kernel refuses connections to its address (two
    // quarters of the 3 s timeout: a probe, then the refusal), 3.75 s (a quarter and the
    // whole timeout) where nothing answers at all, at once when the provider reports the
    // broken connection itself; 1 s of slack.
    let ms: u128 = line
        .split("detected_ms=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("detected_ms");
    assert!(
        ms <= scaled(4.75).as_millis(),
        "{case}: reported after {ms} ms"
    );
    if native_tcp && !survivor_receives {
        // docs/faults.md's row "the provider fails an operation": native tcp fails the send itself
        // once the dead peer's kernel resets the connection an operation is on, and the WARN
        // carries the provider's own text and codes. Where no operation was on it (a
        // message's pieces take the flows in turn), the provider drops the connection and
        // answers the next send with EAGAIN while it reconnects, which the dead peer's kernel
        // refuses: the liveness check finds the refusal after one unanswered probe.
        let provider_failed = f.stderr.contains(" failed: ") && f.stderr.contains("provider err");
        let refused = f.stderr.contains("refuses connections");
        assert!(
            (provider_failed && ms <= scaled(1.0).as_millis())
                || (refused && ms <= scaled(2.0).as_millis()),
            "{case}: reported after {ms} ms, by neither the provider nor a refusal: {}",
            f.stderr
        );
    }
    // Nothing of the dead peer's is left open after finalize but the control endpoint's
    // connection to it (that endpoint stays for the next init): rxm kept its own
    // registrations of the sends the dead peer never read, and its domain then refused to
    // close, with its sockets and epoll set (9 fds).
    let fds = f.result("fds").expect("fds");
    let (before, after) = fds.split_once("->").expect("a->b");
    assert!(
        after.parse::<usize>().unwrap() <= before.parse::<usize>().unwrap() + 1
            && !f.stderr.contains("closing the domain failed"),
        "{case}: left open after finalize: fds {fds}: {}",
        f.stderr
    );
    // The WARN says the peer is gone (liveness), or gives the provider's own text for the
    // failed operation.
    assert!(
        f.stderr.contains("is gone") || f.stderr.contains("failed: "),
        "{case}: no WARN saying what happened: {}",
        f.stderr
    );
}

#[test]
fn a_peer_killed_on_another_host_is_reported() {
    // Liveness looks at no pid, so a peer in this pid namespace exercises the same code; a
    // machine that forbids new pid namespaces still runs the test, and says so.
    let unshare: &[&str] = if can_unshare() {
        &["unshare", "--pid", "--fork", "--kill-child"]
    } else {
        eprintln!("WARNING: unshare --pid is not permitted here: the doomed peers share our pid namespace");
        &[]
    };
    let spawn = |i, name: &str, env: &[(String, String)]| match i {
        0 => spawn_child(name, env, scaled(CHILD)),
        _ => spawn_child_in(name, env, scaled(CHILD), unshare),
    };
    for (p, base) in envs(&[]) {
        for threads in ["no", "yes"] {
            for survivor_receives in [true, false] {
                let mut env = base.clone();
                env.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), threads.into()));
                if survivor_receives {
                    env.push(("NFAB_DOOMED_SENDS".into(), "1".into()));
                }
                peer_killed(&format!("{p}, progress threads {threads}"), &env, &spawn);
            }
        }
    }
}

/// The doomed peer on a host of its own (network, pid and mount namespaces): killed there,
/// the survivor hears nothing from the kernel of its host, only silence.
#[test]
fn a_peer_killed_on_another_network_host_is_reported() {
    across_hosts(peer_killed, &[&[("NFAB_DOOMED_SENDS", "1")], &[]]);
}

/// A peer that is alive but slow: it answers every probe at once and sends only after 10 s.
#[test]
#[ignore = "child process of another test"]
fn child_slow_sender() {
    let lib = init();
    let (send, recv, listen) = meet_peer(&lib, until(30.0), false);
    lib.close_listen(listen).expect("closeListen");
    let _ = read_stdin_line(scaled(60.0));
    send_n(&lib, send, 4096, 1, until(30.0));
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
#[ignore = "child process of another test"]
fn child_patient_receiver() {
    let lib = init();
    let (send, recv, listen) = meet_peer(&lib, until(30.0), true);
    lib.close_listen(listen).expect("closeListen");
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf outlives the request, waited for below.
    let r = unsafe { lib.irecv_until(recv, buf.as_mut_ptr().cast(), 4096, NULL, until(30.0)) }
        .expect("irecv");
    let waiting = Instant::now();
    while waiting.elapsed() < Duration::from_secs(10) {
        assert_eq!(lib.test(r).expect("test of a waiting receive"), None);
        std::thread::sleep(Duration::from_micros(50));
    }
    eprintln!("NFAB waited 10 s");
    println!("RESULT waited=1");
    assert_eq!(
        lib.wait(r, until(30.0)).expect("the slow peer's message"),
        4096
    );
    assert!(buf == pattern(0, 4096));
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

/// A receive that waits 10 s on a live peer probes it once per quarter timeout, not at every
/// `test` (a PONG must not make the next `test` probe again).
#[test]
fn a_waiting_receive_probes_a_live_peer_once_per_quarter_timeout() {
    for (p, base) in envs(&[("NCCL_DEBUG", "TRACE"), ("NCCL_FABRIC_LOG", "trace")]) {
        let mut receiver = spawn_child("child_patient_receiver", &base, scaled(CHILD));
        let mut sender = spawn_child("child_slow_sender", &base, scaled(CHILD));
        let hr = receiver.read_result("handle");
        let hs = sender.read_result("handle");
        receiver.send_line(&hs);
        sender.send_line(&hr);
        receiver.read_result("waited");
        sender.send_line("send");
        let (fr, fs) = (receiver.finish(), sender.finish());
        ok(&fr, &format!("receiver over {p}"));
        ok(&fs, &format!("sender over {p}"));
        let waited = fr
            .stderr
            .split("NFAB waited 10 s")
            .next()
            .unwrap_or_default();
        let probes = waited.matches("liveness probe to").count();
        // One probe per quarter timeout after the first quarter: 13 in 10 s with the 3 s
        // default (valgrind runs set a longer timeout); test calls under valgrind come
        // slower, never faster.
        let timeout_s = std::env::var("NCCL_FABRIC_PEER_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(3.0, |ms| ms / 1000.0);
        let expected = 4.0 * 10.0 / timeout_s;
        let bounds =
            ((expected / 2.0).floor() as usize).max(1)..=(expected * 1.5).ceil() as usize + 1;
        eprintln!("{p}: {probes} probes in 10 s (about {expected:.0} expected)");
        assert!(
            bounds.contains(&probes),
            "over {p}: {probes} liveness probes in 10 s, expected about {expected:.0}"
        );
        assert!(!fr.stderr.contains("NCCL WARN"), "over {p}: {}", fr.stderr);
    }
}

// ---------------------------------------------------------------------------------------
// 3. A connect that gave up before its listener (same process) called accept.

#[test]
#[ignore = "child process of another test"]
fn child_late_accept() {
    let lib = init();
    let (mut handle, listen) = lib.listen(0).expect("listen");
    let gave_up = until(30.0);
    let e = loop {
        match lib.connect(0, &mut handle) {
            Err(e) => break e,
            Ok(Some(_)) => panic!("connected without an accept"),
            Ok(None) => assert!(Instant::now() < gave_up, "connect never gave up"),
        }
    };
    println!("RESULT connect={}", e.code);
    // The listener comes late: whatever accept says, nothing breaks.
    let late = until(5.0);
    let accepted = loop {
        match lib.accept(listen) {
            Ok(Some(c)) => break Ok(c),
            Ok(None) if Instant::now() < late => continue,
            Ok(None) => {
                break Err(CallError {
                    call: "accept",
                    code: -1,
                })
            }
            Err(e) => break Err(e),
        }
    };
    println!(
        "RESULT accept={:?}",
        accepted.map(|_| ()).map_err(|e| e.code)
    );
    if let Ok(c) = accepted {
        lib.close_recv(c).expect("closeRecv");
    }
    lib.close_listen(listen).expect("closeListen");
    // The process still connects and carries data.
    a_pair_carries_data(&lib, 65_536, 8, until(30.0));
    println!("RESULT ok=1");
}

#[test]
fn a_connect_that_gave_up_leaves_a_late_listener_intact() {
    let timeout = short_connect_timeout();
    for (p, env) in envs(&[("NCCL_FABRIC_CONNECT_TIMEOUT_MS", &timeout)]) {
        let f = run_child("child_late_accept", &env, scaled(CHILD));
        ok(&f, &p);
        assert_eq!(
            f.result("connect"),
            Some((NcclResult::RemoteError as i32).to_string()),
            "over {p}: {}",
            f.stderr
        );
        eprintln!("{p}: late accept: {:?}", f.result("accept"));
    }
}

// ---------------------------------------------------------------------------------------
// 4. Comm pairs closing while another pair streams on the same endpoints.

#[test]
#[ignore = "child process of another test"]
fn child_close_while_streaming() {
    let lib = init();
    let deadline = until(90.0);
    let (send, recv) = lib.connect_pair(0, deadline).expect("connect_pair");
    let lib = &lib;
    // Fewer of each under valgrind, which looks for bad accesses, not volume.
    let (messages, max_cycles) = if slow() > 1.0 { (60, 10) } else { (300, 40) };
    std::thread::scope(|s| {
        let streaming = s.spawn(move || {
            std::thread::scope(|t| {
                t.spawn(|| recv_n(lib, recv, 65_536, messages, deadline));
                send_n(lib, send, 65_536, messages, deadline);
            });
        });
        // Meanwhile: pairs on the same endpoints opened, used, and closed, with their
        // requests still in flight or (NFAB_IN_FLIGHT=0) once they finished.
        let in_flight = std::env::var("NFAB_IN_FLIGHT").map_or(true, |v| v != "0");
        let mut cycles = 0;
        while !streaming.is_finished() && cycles < max_cycles {
            let (s2, r2) = lib.connect_pair(0, deadline).expect("connect_pair");
            let bufs: &'static mut [Vec<u8>] =
                Vec::leak((0..4).map(|_| vec![0u8; 65_536]).collect());
            let mut requests = Vec::new();
            for (i, b) in bufs.iter_mut().enumerate() {
                let p = b.as_mut_ptr().cast();
                // SAFETY: leaked buffers stay valid for as long as anyone may touch them.
                let r = unsafe {
                    if i % 2 == 0 {
                        lib.irecv_until(r2, p, 65_536, NULL, deadline)
                    } else {
                        lib.isend_until(s2, p, 65_536, NULL, deadline)
                    }
                };
                requests.push(r.expect("post"));
            }
            if !in_flight {
                for r in requests {
                    lib.wait(r, deadline).expect("a closing pair's request");
                }
            }
            lib.close_send(s2).expect("closeSend");
            lib.close_recv(r2).expect("closeRecv");
            cycles += 1;
        }
        streaming.join().expect("the streaming pair survives");
        println!("RESULT cycles={cycles}");
    });
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
fn closing_pairs_do_not_disturb_a_pair_streaming_on_the_same_endpoints() {
    for (p, env) in envs(&[
        ("NCCL_FABRIC_ENDPOINTS", "device"),
        ("NCCL_FABRIC_PROGRESS_THREAD", "yes"),
    ]) {
        let f = run_child("child_close_while_streaming", &env, scaled(CHILD));
        ok(&f, &p);
        says_when_it_does_not_share(&f, &p);
        assert!(
            !f.stderr.contains("completion queue failed"),
            "over {p}: {}",
            f.stderr
        );
        eprintln!("{p}: {:?} pairs closed while streaming", f.result("cycles"));
    }
}

/// A receive comm closed with a receive still posted, its peer sending after the close: the
/// message goes to the sink, not into the buffer NCCL may already have freed.
#[test]
#[ignore = "child process of another test"]
fn child_closed_receive_leaves_its_buffer_alone() {
    let lib = init();
    let deadline = until(60.0);
    let provider = std::env::var("NCCL_FABRIC_PROVIDER").unwrap();
    let (send, recv) = lib.connect_pair(0, deadline).expect("connect_pair");
    let (s2, r2) = lib.connect_pair(0, deadline).expect("connect_pair");
    let buf: &'static mut [u8] = Vec::leak(vec![0u8; 65_536]);
    let p = buf.as_mut_ptr();
    // SAFETY: the buffer is leaked: it stays valid whatever the provider does with it.
    unsafe { lib.irecv_until(r2, p.cast(), 65_536, NULL, deadline) }.expect("irecv");
    lib.close_recv(r2).expect("closeRecv");
    // SAFETY: as above; the test reads what the provider may have written meanwhile.
    unsafe { std::ptr::write_bytes(p, 0xab, 65_536) };
    let sent: &'static mut [u8] = Vec::leak(vec![0x11u8; 65_536]);
    // SAFETY: leaked, the buffer outlives the send, which may never finish.
    unsafe { lib.isend_until(s2, sent.as_mut_ptr().cast(), 65_536, NULL, deadline) }
        .expect("isend");
    // The other pair on the same endpoints carries data meanwhile, and time passes.
    a_pair_carries_data_on(&lib, send, recv, 8, until(20.0));
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: as above.
    let now = unsafe { std::slice::from_raw_parts(p, 65_536) };
    let written = now.iter().filter(|&&b| b != 0xab).count();
    println!("RESULT written={written}");
    // shm before 1.19 keeps the receive posted (`quirks::cancel_at_close`).
    let version = nccl_net_fabric::fabric::runtime_version();
    if nccl_net_fabric::quirks::cancel_at_close(&provider, version) {
        assert_eq!(
            written, 0,
            "over {provider}: a closed comm's buffer was written after its close"
        );
    }
    lib.close_send(s2).expect("closeSend");
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

/// Both ways on an open pair, `count` messages of 64 KiB.
fn a_pair_carries_data_on(lib: &PluginLib, send: Ptr, recv: Ptr, count: usize, by: Instant) {
    std::thread::scope(|t| {
        t.spawn(|| recv_n(lib, recv, 65_536, count, by));
        send_n(lib, send, 65_536, count, by);
    });
}

#[test]
fn a_closed_receive_leaves_its_buffer_alone() {
    for (p, env) in envs(&[("NCCL_FABRIC_ENDPOINTS", "device")]) {
        let f = run_child(
            "child_closed_receive_leaves_its_buffer_alone",
            &env,
            scaled(CHILD),
        );
        ok(&f, &p);
        eprintln!("{p}: bytes written after close: {:?}", f.result("written"));
    }
}

/// A receive comm closed while its peer's sends wait at its endpoint unreceived (they came
/// before any receive was posted): the sink left on the endpoint must take them in, or the
/// provider may hold every later message between the two endpoints behind them.
#[test]
#[ignore = "child process of another test"]
fn child_close_with_unreceived_sends() {
    let lib = init();
    let deadline = until(60.0);
    // The first pair opens the shared endpoints and keeps them open.
    let (send, recv) = lib.connect_pair(0, deadline).expect("connect_pair");
    for round in 0..4 {
        let (s2, r2) = lib.connect_pair(0, deadline).expect("connect_pair");
        let bufs: &'static mut [Vec<u8>] = Vec::leak((0..3).map(|_| vec![7u8; 65_536]).collect());
        for b in bufs.iter_mut() {
            // SAFETY: leaked buffers stay valid for as long as anyone may touch them.
            unsafe { lib.isend_until(s2, b.as_mut_ptr().cast(), 65_536, NULL, deadline) }
                .expect("isend");
        }
        // Time for the messages to reach the receiving endpoint, where nothing takes them.
        std::thread::sleep(Duration::from_millis(200));
        lib.close_send(s2).expect("closeSend");
        lib.close_recv(r2).expect("closeRecv");
        // The first pair still moves messages both ways on the same endpoints.
        let by = until(20.0);
        std::thread::scope(|t| {
            t.spawn(|| recv_n(&lib, recv, 65_536, 8, by));
            send_n(&lib, send, 65_536, 8, by);
        });
        println!("RESULT round{round}=1");
    }
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
fn sends_nobody_received_do_not_block_the_endpoints_after_close() {
    for (p, env) in envs(&[("NCCL_FABRIC_ENDPOINTS", "device")]) {
        let f = run_child("child_close_with_unreceived_sends", &env, scaled(CHILD));
        ok(&f, &p);
        says_when_it_does_not_share(&f, &p);
    }
}

/// Where the provider cannot share endpoints between comms (shm before 1.19), the plugin
/// gives each comm its own despite `NCCL_FABRIC_ENDPOINTS=device`, and says why.
fn says_when_it_does_not_share(f: &common::Finished, p: &str) {
    let version = nccl_net_fabric::fabric::runtime_version();
    let unshared = nccl_net_fabric::quirks::sharing_stalls(p, version).is_some();
    assert_eq!(
        f.stderr.contains(&format!(
            "NCCL_FABRIC_ENDPOINTS=device is not followed over {p}"
        )),
        unshared,
        "over {p}: {}",
        f.stderr
    );
}

// ---------------------------------------------------------------------------------------
// 5. Handles naming this process's own closed endpoints, and abandoned connects.

/// The handle with its address changed to one of this process that nobody listens on:
/// another counter of this process's shm names (the probe endpoints opened and closed at
/// init), or port 1 of the same IP address.
fn crafted(handle: &[u8; NET_HANDLE_MAXSIZE], provider: &str) -> Vec<[u8; NET_HANDLE_MAXSIZE]> {
    let h = Handle::read(handle).expect("our own handle");
    let mut addrs = Vec::new();
    if provider == "shm" {
        let text = String::from_utf8_lossy(&h.addr)
            .trim_end_matches('\0')
            .to_string();
        let base = &text[..text.rfind(':').expect("shm name with a counter")];
        for n in 0..2 {
            let mut a = format!("{base}:{n}").into_bytes();
            a.push(0);
            addrs.push(a);
        }
    } else {
        let mut a = h.addr.clone();
        a[2..4].copy_from_slice(&1u16.to_be_bytes());
        addrs.push(a);
    }
    addrs
        .into_iter()
        .map(|addr| {
            let mut out = [0u8; NET_HANDLE_MAXSIZE];
            Handle {
                token: h.token ^ 1,
                nonce: h.nonce ^ 1,
                owner: h.owner,
                addr,
            }
            .write(&mut out)
            .expect("encode");
            out
        })
        .collect()
}

#[test]
#[ignore = "child process of another test"]
fn child_crafted_handles() {
    let lib = init();
    let provider = std::env::var("NCCL_FABRIC_PROVIDER").unwrap();
    let (good, listen) = lib.listen(0).expect("listen");
    let lib = &lib;
    std::thread::scope(|s| {
        // Meanwhile another thread connects and streams normally.
        let normal = s.spawn(|| a_pair_carries_data(lib, 4096, 16, until(60.0)));
        let mut slowest = Duration::ZERO;
        for (i, mut h) in crafted(&good, &provider).into_iter().enumerate() {
            let started = Instant::now();
            let give_up = until(30.0);
            let code = loop {
                let call = Instant::now();
                let r = lib.connect(0, &mut h);
                slowest = slowest.max(call.elapsed());
                match r {
                    Err(e) => break e.code,
                    Ok(Some(_)) => panic!("connected through a crafted handle"),
                    Ok(None) => {
                        assert!(Instant::now() < give_up, "crafted handle {i} never failed")
                    }
                }
            };
            println!(
                "RESULT crafted{i}={code} after_ms={}",
                started.elapsed().as_millis()
            );
        }
        println!("RESULT slowest_call_ms={}", slowest.as_millis());
        normal.join().expect("the normal pair connects meanwhile");
    });
    // An abandoned connect: one call, then never again; the next connect, after the
    // connect timeout and a grace period, reclaims it.
    let (mut quiet, quiet_listen) = lib.listen(0).expect("listen");
    assert!(lib.connect(0, &mut quiet).expect("first call").is_none());
    let timeout: u64 = short_connect_timeout().parse().unwrap();
    std::thread::sleep(Duration::from_millis(timeout) + Duration::from_secs(2) + scaled(0.5));
    let mut again = good;
    let _ = lib.connect(0, &mut again);
    lib.close_listen(quiet_listen).expect("closeListen");
    lib.close_listen(listen).expect("closeListen");
    println!("RESULT ok=1");
}

#[test]
fn crafted_handles_fail_fast_and_block_no_other_connect() {
    for (p, env) in envs(&[
        ("NCCL_FABRIC_CONNECT_TIMEOUT_MS", &short_connect_timeout()),
        ("NCCL_DEBUG", "TRACE"),
    ]) {
        let f = run_child("child_crafted_handles", &env, scaled(CHILD));
        ok(&f, &p);
        eprintln!(
            "{p}: {:?} {:?}, slowest connect call {:?} ms",
            f.result("crafted0"),
            f.result("crafted1"),
            f.result("slowest_call_ms")
        );
        assert!(
            f.stderr.contains("reclaimed an abandoned connect"),
            "over {p}: the abandoned connect was not reclaimed: {}",
            f.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------
// 6. Closes with sends nobody will receive: prompt, and released after finalize.

fn shm_files() -> usize {
    let mine = format!("{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                .count()
        })
        .unwrap_or(0)
}

#[test]
#[ignore = "child process of another test"]
fn child_prompt_closes() {
    let lib = plugin_version(11);
    let deadline = until(60.0);
    // The control endpoint opens with the first listen and stays: what is open then is
    // what must be left at the end.
    let ctx = lib.init_v11(6, true).expect("init (v11)");
    let (_, listen) = lib.listen(0).expect("listen");
    lib.close_listen(listen).expect("closeListen");
    let (fds, files) = (open_fds(), shm_files());
    // A first communicator, whose lanes the second one may find still open.
    let (s, r) = lib.connect_pair(0, deadline).expect("connect_pair");
    lib.close_send(s).expect("closeSend");
    lib.close_recv(r).expect("closeRecv");
    lib.finalize_v11(ctx).expect("finalize");
    let ctx = lib.init_v11(7, true).expect("init (v11)");
    let pairs: Vec<(Ptr, Ptr)> = (0..8)
        .map(|_| lib.connect_pair(0, deadline).expect("connect_pair"))
        .collect();
    let bufs: &'static mut [Vec<u8>] = Vec::leak((0..8 * 6).map(|_| vec![0u8; 1 << 20]).collect());
    let mut chunks = bufs.chunks_mut(6);
    let mut sends_in_flight = 0;
    for &(send, recv) in &pairs {
        let mine = chunks.next().unwrap();
        for (i, b) in mine.iter_mut().enumerate() {
            let p = b.as_mut_ptr().cast();
            // SAFETY: leaked buffers stay valid for as long as anyone may touch them.
            unsafe {
                if i < 4 {
                    // Sends nobody receives: what the provider takes within 200 ms.
                    let posted = lib.isend_until(
                        send,
                        p,
                        1 << 20,
                        NULL,
                        Instant::now() + Duration::from_millis(200),
                    );
                    sends_in_flight += usize::from(posted.is_ok());
                } else {
                    lib.irecv_until(recv, p, 1 << 20, NULL, deadline)
                        .expect("irecv");
                }
            }
        }
    }
    // Every pair closes with at least one send the provider took and nobody will receive.
    assert!(
        sends_in_flight >= pairs.len(),
        "{sends_in_flight} sends in flight over {} pairs",
        pairs.len()
    );
    let closing = Instant::now();
    for &(send, recv) in &pairs {
        lib.close_send(send).expect("closeSend");
        lib.close_recv(recv).expect("closeRecv");
    }
    println!("RESULT close_all_ms={}", closing.elapsed().as_millis());
    lib.finalize_v11(ctx).expect("finalize");
    // Finalize returns at once; endpoints that still hold operations close in the
    // background within 2 s, and shared lanes outlive their last comm by the linger time
    // (for the next communicator), then close like any other.
    let linger: u64 =
        std::env::var("NCCL_FABRIC_LANE_LINGER_MS").map_or(5000, |v| v.parse().unwrap());
    let released = Instant::now() + Duration::from_millis(linger + 2000) + scaled(3.0);
    while (open_fds() > fds || shm_files() > files) && Instant::now() < released {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (fds2, files2) = (open_fds(), shm_files());
    println!("RESULT fds={fds}->{fds2} shm_files={files}->{files2}");
    assert!(
        fds2 <= fds,
        "file descriptors left after finalize: {fds} -> {fds2}"
    );
    assert!(
        files2 <= files,
        "shm files left after finalize: {files} -> {files2}"
    );
    println!("RESULT ok=1");
}

#[test]
fn closing_comms_with_unreceived_sends_is_prompt_and_released_after_finalize() {
    for (p, env) in envs(&[]) {
        for (threads, linger) in [("no", "0"), ("yes", "0"), ("no", "300"), ("yes", "300")] {
            let mut env = env.clone();
            env.push(("NCCL_FABRIC_PROGRESS_THREAD".into(), threads.into()));
            env.push(("NCCL_FABRIC_LANE_LINGER_MS".into(), linger.into()));
            let f = run_child("child_prompt_closes", &env, scaled(CHILD));
            ok(&f, &p);
            eprintln!(
                "{p}, progress threads {threads}, linger {linger} ms: closing 8 pairs took {:?} ms; {:?}",
                f.result("close_all_ms"),
                f.result("fds")
            );
            let ms: u64 = f.result("close_all_ms").unwrap().parse().unwrap();
            // docs/faults.md: under 50 ms in all; ten times that for a loaded 2-core machine. Not
            // under valgrind, whose one lock the spinning progress threads hold most of the
            // time (30 s seen): there the test looks for bad accesses only.
            assert!(
                slow() > 1.0 || Duration::from_millis(ms) <= Duration::from_millis(500),
                "over {p}: closing 8 pairs took {ms} ms"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 7. A stranger speaking raw libfabric to the endpoints.

#[test]
#[ignore = "child process of another test"]
fn child_stranger_target() {
    let lib = init();
    let deadline = until(60.0);
    let (h, l) = lib.listen(0).expect("listen");
    println!("RESULT handle={}", handle_to_hex(&h));
    // The stranger's CONNECT is accepted like anyone's (it spoke the protocol); its comm
    // then waits on a peer that never answers liveness probes.
    let strange = lib.accept_until(l, deadline).expect("accept the stranger");
    lib.close_listen(l).expect("closeListen");
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf outlives the request, waited for below.
    let r = unsafe { lib.irecv_until(strange, buf.as_mut_ptr().cast(), 4096, NULL, deadline) }
        .expect("irecv");
    // A real pair keeps working on the same device meanwhile.
    a_pair_carries_data(&lib, 65_536, 8, deadline);
    let started = Instant::now();
    let e = lib
        .wait(r, deadline)
        .expect_err("the stranger never answers");
    println!(
        "RESULT stranger={} after_ms={}",
        e.code,
        started.elapsed().as_millis()
    );
    lib.close_recv(strange).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
#[ignore = "child process of another test"]
fn child_stranger() {
    let provider = std::env::var("NCCL_FABRIC_PROVIDER").unwrap();
    let domain = match provider.as_str() {
        "shm" => "shm",
        _ if common::hosts::on_a_host() => common::hosts::IFACE,
        _ => "lo",
    };
    let h = handle_from_hex(&read_stdin_line(scaled(30.0))).expect("handle");
    let h = Handle::read(&h).expect("decode");
    let mut s = Stranger::open(&provider, domain);
    let me = s.name();
    let control = s.insert(&h.addr);
    let tag = nccl_net_fabric::control::CONTROL_TAG;
    let mut msg = [0u8; MSG_SIZE];
    // Garbage first, then a CONNECT of its own making.
    let t = scaled(10.0);
    println!(
        "RESULT garbage={:?}",
        s.send(control, tag, &[0xa5; MSG_SIZE], t)
    );
    Record {
        kind: Kind::Connect,
        a: h.token,
        b: 77,
        who: Identity::current(),
        fields: vec![me.clone(), me],
    }
    .write(&mut msg)
    .expect("encode");
    println!("RESULT connect={:?}", s.send(control, tag, &msg, t));
    let ack = s.recv(tag, MSG_SIZE, t).expect("an ACK");
    let ack = Record::read(&ack, "ACK").expect("decode ACK");
    assert_eq!(ack.kind, Kind::Ack);
    // Remote writes with made-up keys at the data endpoint it was told about.
    let lane = s.insert(&ack.fields[0]);
    println!(
        "RESULT write={:?}",
        s.write(lane, 0x5eed, &[1u8; 256], scaled(2.0))
    );
    // Stay alive (not answering probes) until the target has given up on us.
    let _ = read_stdin_line(scaled(60.0));
    println!("RESULT ok=1");
}

/// Rank 1 speaks raw libfabric to rank 0's endpoints: its comm fails by liveness, and rank
/// 0 carries data meanwhile.
fn stranger(case: &str, env: &[(String, String)], spawn: &Spawner) {
    let mut target = spawn(0, "child_stranger_target", env);
    let mut stranger = spawn(1, "child_stranger", env);
    stranger.send_line(&target.read_result("handle"));
    let ft = target.finish();
    stranger.try_send_line("done");
    let fs = stranger.finish();
    ok(&ft, &format!("target over {case}"));
    ok(&fs, &format!("stranger over {case}"));
    eprintln!(
        "{case}: stranger's comm failed with {:?}; its remote write: {:?}",
        ft.result("stranger"),
        fs.result("write")
    );
    let code: i32 = ft
        .result("stranger")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("the stranger's comm's error");
    assert_eq!(
        code,
        NcclResult::RemoteError as i32,
        "over {case}: {}",
        ft.stderr
    );
}

#[test]
fn a_stranger_on_raw_libfabric_disturbs_nothing() {
    for (p, env) in envs(&[]) {
        stranger(&p, &env, &|_, name, env| {
            spawn_child(name, env, scaled(CHILD))
        });
    }
}

/// The stranger on another host, reaching the target over the link between them.
#[test]
fn a_stranger_on_another_host_disturbs_nothing() {
    across_hosts(stranger, &[&[]]);
}

// ---------------------------------------------------------------------------------------
// 8. A stale request pointer.

#[test]
#[ignore = "child process of another test"]
fn child_stale_request() {
    let lib = init();
    let deadline = until(30.0);
    let (send, recv) = lib.connect_pair(0, deadline).expect("connect_pair");
    let mut a = vec![0u8; 4096];
    let mut b = pattern(0, 4096);
    let stale = |lib: &PluginLib, r: Ptr| {
        let e = lib.test(r).expect_err("a request already reported done");
        assert_eq!(e.code, NcclResult::InvalidArgument as i32);
    };
    let mut old = Vec::new();
    for round in 0..3 {
        // SAFETY: both buffers outlive their requests, waited for right away.
        let (r, s) = unsafe {
            (
                lib.irecv_until(recv, a.as_mut_ptr().cast(), 4096, NULL, deadline)
                    .expect("irecv"),
                lib.isend_until(send, b.as_mut_ptr().cast(), 4096, NULL, deadline)
                    .expect("isend"),
            )
        };
        // Earlier rounds' pointers are stale, even when their slot is in use again.
        for &p in &old {
            stale(&lib, p);
        }
        assert_eq!(
            lib.wait(r, deadline).expect("receive"),
            4096,
            "round {round}"
        );
        assert_eq!(lib.wait(s, deadline).expect("send"), 4096, "round {round}");
        stale(&lib, r);
        stale(&lib, s);
        old.extend([r, s]);
    }
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
    println!("RESULT ok=1");
}

#[test]
fn a_stale_request_pointer_is_refused() {
    for (p, env) in envs(&[]) {
        ok(&run_child("child_stale_request", &env, scaled(CHILD)), &p);
    }
}
