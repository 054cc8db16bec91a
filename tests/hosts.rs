//! Ranks on hosts of their own (network, pid and mount namespaces joined by veth pairs, see
//! `common::hosts`), through the exported C table as NCCL drives it, with no
//! `NCCL_FABRIC_DOMAINS`: what the plugin offers is what a real host would get.
//!
//! - every device the plugin reports carries verified data between two hosts, both ways,
//!   and the devices are the hosts' NIC alone (not `lo`), described as the kernel has it;
//! - four hosts on a bridge connect all-to-all;
//! - faults no single namespace can show: a link that goes down and stays down, a link that
//!   flaps for less than the peer timeout, a host that vanishes while a comm waits, and a
//!   peer host's listener closed (or its process gone) before the connect.
//!
//! Over `tcp;ofi_rxm` and, on libfabric >= 1.18, native `tcp`.

mod common;

use common::hosts::{
    all_to_all_on_hosts, connect_and_accept, connect_to_all, handles_of_all, host_env,
    hosts_or_skip, my_host, pair_on_hosts, providers, Hosts, IFACE,
};
use common::scenario::*;
use common::*;
use nccl_net_fabric::nccl::NcclResult;
use nccl_net_host::{handle_from_hex, handle_to_hex, PluginLib, Ptr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CHILD: f64 = 120.0;
/// `NCCL_FABRIC_PEER_TIMEOUT_MS` in these tests (the default).
const PEER_TIMEOUT_MS: f64 = 3000.0;

// ---------------------------------------------------------------------------------------
// Every device carries data between hosts.

#[test]
#[ignore = "child process of another test"]
fn child_every_device() {
    let lib = init();
    let n = lib.devices().expect("devices");
    let mut names = Vec::new();
    let mut handles = Vec::new();
    let mut listens = Vec::new();
    for dev in 0..n {
        let p = lib.properties(dev).expect("getProperties");
        names.push(format!(
            "{}:{}:{}:{:#x}",
            p.name,
            p.speed,
            p.pci_path.unwrap_or_else(|| "NULL".into()),
            p.guid
        ));
        let (h, l) = lib.listen(dev).expect("listen");
        handles.push(handle_to_hex(&h));
        listens.push(l);
    }
    println!("RESULT devices={n} {}", names.join(","));
    println!("RESULT handle={}", handles.join(","));
    let line = read_stdin_line(scaled(30.0));
    let peers: Vec<_> = line
        .trim()
        .split(',')
        .map(|h| handle_from_hex(h).expect("peer handle"))
        .collect();
    assert_eq!(peers.len(), n as usize, "the peer host has as many devices");
    for (dev, mut peer) in peers.into_iter().enumerate() {
        let dev = dev as i32;
        // 20 s for each device: a device that cannot reach the peer fails here.
        let (send, recv) =
            connect_and_accept(&lib, dev, &mut peer, listens[dev as usize], until(20.0));
        let deadline = until(30.0);
        std::thread::scope(|s| {
            s.spawn(|| recv_n(&lib, recv, 1 << 20, 8, deadline));
            send_n(&lib, send, 1 << 20, 8, deadline);
        });
        lib.close_send(send).expect("closeSend");
        lib.close_recv(recv).expect("closeRecv");
        lib.close_listen(listens[dev as usize])
            .expect("closeListen");
        println!("RESULT dev{dev}=carried");
    }
    lib.finalize().expect("finalize");
    println!("RESULT ok=1");
}

#[test]
fn every_device_carries_data_between_two_hosts() {
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        let hosts = Hosts::new(2);
        let (a, b) = pair_on_hosts(
            &hosts,
            "child_every_device",
            &host_env(p, &[]),
            scaled(CHILD),
        );
        for (name, f) in [("A", a.finish()), ("B", b.finish())] {
            ok(&f, &format!("host {name} over {p}"));
            let devices = f.result("devices").expect("devices line");
            eprintln!("{p}: host {name}: {devices}");
            // One NIC, the host's eth0 (a veth), described as its kernel has it: 10 Gb/s, no PCI device.
            assert!(
                devices.starts_with(&format!("1 {IFACE}:10000:NULL:")),
                "host {name} over {p}: the devices are the NIC alone: {devices}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Four hosts, all to all.

#[test]
#[ignore = "child process of another test"]
fn child_all_to_all() {
    // A listen comm accepts one peer, as NCCL's do: one per other host. This rank prints
    // its listen handle for each host (`-` for itself) and reads, per host, the handle that
    // host made for it.
    let lib = init();
    let me = my_host();
    let hosts: usize = std::env::var("NFAB_HOSTS").unwrap().parse().unwrap();
    let (listens, mut peers) = handles_of_all(&lib, me, hosts, scaled(30.0));
    let deadline = until(40.0);
    let started = Instant::now();
    let (sends, recvs) = connect_to_all(&lib, &listens, &mut peers, deadline);
    println!("RESULT connected_ms={}", started.elapsed().as_millis());
    let len = 256 << 10;
    // Each message starts with its sender and receiver.
    let message = |from: usize, to: usize, i: usize| {
        let mut m = pattern(from * 16 + to * 4 + i, len);
        m[0] = from as u8;
        m[1] = to as u8;
        m
    };
    std::thread::scope(|s| {
        for (k, &(peer, _)) in peers.iter().enumerate() {
            let (send, recv, lib) = (sends[k], recvs[k], &lib);
            s.spawn(move || {
                for i in 0..4 {
                    let mut m = message(me, peer, i);
                    // SAFETY: m outlives the request, waited for right away.
                    let r = unsafe {
                        lib.isend_until(send, m.as_mut_ptr().cast(), len as i32, NULL, deadline)
                    }
                    .expect("isend");
                    lib.wait(r, deadline).expect("send");
                }
            });
            s.spawn(move || {
                for i in 0..4 {
                    let mut buf = vec![0u8; len];
                    // SAFETY: buf outlives the request, waited for right away.
                    let r = unsafe {
                        lib.irecv_until(recv, buf.as_mut_ptr().cast(), len as i32, NULL, deadline)
                    }
                    .expect("irecv");
                    assert_eq!(lib.wait(r, deadline).expect("receive") as usize, len);
                    assert!(
                        buf == message(peer, me, i),
                        "message {i} from host {peer} differs"
                    );
                }
            });
        }
    });
    for c in sends {
        lib.close_send(c).expect("closeSend");
    }
    for c in recvs {
        lib.close_recv(c).expect("closeRecv");
    }
    for l in listens.into_iter().flatten() {
        lib.close_listen(l).expect("closeListen");
    }
    println!("RESULT ok=1");
}

#[test]
fn four_hosts_connect_all_to_all() {
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        let hosts = Hosts::new(4);
        let env = host_env(p, &[]);
        let ranks = all_to_all_on_hosts(&hosts, "child_all_to_all", &env, scaled(CHILD));
        for (i, r) in ranks.into_iter().enumerate() {
            let f = r.finish();
            ok(&f, &format!("host {i} over {p}"));
            eprintln!(
                "{p}: host {i} connected to 3 hosts in {} ms",
                f.result("connected_ms").unwrap_or_default()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Streams between two hosts, for the link faults: each rank sends on its sendComm and
// receives on its recvComm at once, 64 KiB messages numbered by their pattern, until the
// parent says "stop" (then a 0-byte message ends each stream) or a call fails.

/// What one direction of a stream ended with.
struct Ended {
    count: usize,
    error: Option<i32>,
    /// From the last call that succeeded to the error.
    detected_ms: u128,
    close_ms: u128,
}

const STREAM_LEN: usize = 64 << 10;

fn stream_send(lib: &PluginLib, send: Ptr, stop: &AtomicBool, deadline: Instant) -> Ended {
    let mut last_ok = Instant::now();
    let mut count = 0;
    let error = loop {
        let stopping = stop.load(Ordering::Acquire);
        let len = if stopping { 0 } else { STREAM_LEN };
        let mut m = pattern(count, len);
        // SAFETY: m outlives the request, waited for right away.
        let done =
            unsafe { lib.isend_until(send, m.as_mut_ptr().cast(), len as i32, NULL, deadline) }
                .and_then(|r| lib.wait(r, deadline));
        match done {
            Ok(_) if stopping => break None,
            Ok(_) => {
                count += 1;
                last_ok = Instant::now();
            }
            Err(e) => break Some(e.code),
        }
    };
    let detected_ms = last_ok.elapsed().as_millis();
    let closing = Instant::now();
    lib.close_send(send).expect("closeSend");
    Ended {
        count,
        error,
        detected_ms,
        close_ms: closing.elapsed().as_millis(),
    }
}

fn stream_recv(lib: &PluginLib, recv: Ptr, deadline: Instant) -> Ended {
    let mut last_ok = Instant::now();
    let mut count = 0;
    let mut buf = vec![0u8; STREAM_LEN];
    let error = loop {
        buf.fill(0);
        // SAFETY: buf outlives the request, waited for right away.
        let done = unsafe {
            lib.irecv_until(
                recv,
                buf.as_mut_ptr().cast(),
                STREAM_LEN as i32,
                NULL,
                deadline,
            )
        }
        .and_then(|r| lib.wait(r, deadline));
        match done {
            Ok(0) => break None,
            Ok(n) => {
                assert_eq!(n as usize, STREAM_LEN);
                // In order, each once: message `count` is the `count`th sent.
                assert!(
                    buf == pattern(count, STREAM_LEN),
                    "message {count} differs (lost, repeated or damaged)"
                );
                count += 1;
                last_ok = Instant::now();
            }
            Err(e) => break Some(e.code),
        }
    };
    let detected_ms = last_ok.elapsed().as_millis();
    let closing = Instant::now();
    lib.close_recv(recv).expect("closeRecv");
    Ended {
        count,
        error,
        detected_ms,
        close_ms: closing.elapsed().as_millis(),
    }
}

#[test]
#[ignore = "child process of another test"]
fn child_streaming_rank() {
    let lib = init();
    let (send, recv, listen) = meet_peer(&lib, until(30.0), my_host() == 0);
    lib.close_listen(listen).expect("closeListen");
    let stop = AtomicBool::new(false);
    let deadline = until(60.0);
    println!("RESULT streaming=1");
    let (sent, received) = std::thread::scope(|s| {
        s.spawn(|| {
            // "stop", or the end of stdin: the parent waits for the streams to fail.
            if read_stdin_line(scaled(60.0)).trim() == "stop" {
                stop.store(true, Ordering::Release);
            }
        });
        let sender = s.spawn(|| stream_send(&lib, send, &stop, deadline));
        let received = stream_recv(&lib, recv, deadline);
        (sender.join().expect("sender"), received)
    });
    for (dir, e) in [("send", &sent), ("recv", &received)] {
        println!(
            "RESULT {dir}=count:{} error:{} detected_ms:{} close_ms:{}",
            e.count,
            e.error.unwrap_or(0),
            e.detected_ms,
            e.close_ms
        );
    }
    // A rank whose peer is gone has nothing left to stop it: it exits on its own.
    println!("RESULT ok=1");
}

/// Parses `count:N error:E detected_ms:D close_ms:C`.
fn ended(f: &Finished, dir: &str) -> Ended {
    let line = f
        .result(dir)
        .unwrap_or_else(|| panic!("no {dir} line:\n{}\n{}", f.stdout, f.stderr));
    let field = |k: &str| -> u128 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}:")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {line}"))
    };
    let error = field("error") as i32;
    Ended {
        count: field("count") as usize,
        error: (error != 0).then_some(error),
        detected_ms: field("detected_ms"),
        close_ms: field("close_ms"),
    }
}

/// The bound on reporting a dead peer: the peer timeout × 1.25 + 1 s (stretched under valgrind).
fn dead_peer_bound_ms() -> u128 {
    ((PEER_TIMEOUT_MS * 1.25 + 1000.0) * slow()) as u128
}

/// Checks that every stream of `ranks` failed with ncclRemoteError in time and closed at once.
fn all_failed_in_time(ranks: &[(&str, &Finished)], what: &str) {
    for (name, f) in ranks {
        assert!(
            f.success,
            "{what}: host {name} failed\n{}\n{}",
            f.stdout, f.stderr
        );
        for dir in ["send", "recv"] {
            let e = ended(f, dir);
            eprintln!(
                "{what}: host {name} {dir}: error {:?} after {} ms, close {} ms",
                e.error, e.detected_ms, e.close_ms
            );
            assert_eq!(
                e.error,
                Some(NcclResult::RemoteError as i32),
                "{what}: host {name} {dir} ends with ncclRemoteError"
            );
            assert!(
                e.detected_ms <= dead_peer_bound_ms(),
                "{what}: host {name} {dir}: {} ms > {} ms",
                e.detected_ms,
                dead_peer_bound_ms()
            );
            assert!(
                e.close_ms <= (1000.0 * slow()) as u128,
                "{what}: host {name} {dir}: close took {} ms",
                e.close_ms
            );
        }
    }
}

/// Ranks streaming both ways between hosts 0 and 1 over `provider`, for half a second.
fn streaming(hosts: &Hosts, provider: &str) -> (ChildTest, ChildTest) {
    let env = host_env(provider, &[]);
    let (mut a, mut b) = pair_on_hosts(hosts, "child_streaming_rank", &env, scaled(CHILD));
    a.read_result("streaming");
    b.read_result("streaming");
    std::thread::sleep(scaled(0.5));
    (a, b)
}

#[test]
fn a_link_that_goes_down_fails_both_sides_in_time() {
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        let hosts = Hosts::new(2);
        let (a, b) = streaming(&hosts, p);
        hosts.set_link(0, false);
        let (fa, fb) = (a.finish(), b.finish());
        all_failed_in_time(&[("A", &fa), ("B", &fb)], &format!("link down over {p}"));
    }
}

#[test]
fn a_link_that_flaps_loses_nothing() {
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        let hosts = Hosts::new(2);
        let (mut a, mut b) = streaming(&hosts, p);
        // Down for a third of the peer timeout, then up: TCP retransmits what was lost.
        hosts.set_link(0, false);
        std::thread::sleep(Duration::from_millis(1000));
        hosts.set_link(0, true);
        std::thread::sleep(scaled(2.0));
        a.send_line("stop");
        b.send_line("stop");
        let (fa, fb) = (a.finish(), b.finish());
        for f in [&fa, &fb] {
            ok(f, &format!("flap over {p}"));
        }
        let (sa, rb) = (ended(&fa, "send"), ended(&fb, "recv"));
        let (sb, ra) = (ended(&fb, "send"), ended(&fa, "recv"));
        for (s, r, dir) in [(&sa, &rb, "A to B"), (&sb, &ra, "B to A")] {
            eprintln!(
                "flap over {p}: {dir}: {} sent, {} received",
                s.count, r.count
            );
            assert_eq!(
                (s.error, r.error),
                (None, None),
                "flap over {p} {dir}: no error"
            );
            assert_eq!(
                s.count, r.count,
                "flap over {p} {dir}: every message arrives once"
            );
            assert!(s.count > 0);
        }
    }
}

#[test]
fn a_host_that_vanishes_is_reported_in_time() {
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        // On a bridge: the survivor keeps its link, the vanished host takes only its own.
        let mut hosts = Hosts::switched(2);
        let (a, b) = streaming(&hosts, p);
        hosts.vanish(1);
        let fa = a.finish();
        all_failed_in_time(&[("A", &fa)], &format!("vanished host over {p}"));
        let _ = b.finish();
    }
}

// ---------------------------------------------------------------------------------------
// A listener gone before the connect.

#[test]
#[ignore = "child process of another test"]
fn child_listener_gone() {
    let lib = init();
    let (handle, listen) = lib.listen(0).expect("listen");
    let exits = std::env::var("NFAB_LISTENER_EXITS").is_ok();
    if !exits {
        lib.close_listen(listen).expect("closeListen");
    }
    println!("RESULT handle={}", handle_to_hex(&handle));
    if exits {
        // The whole rank ends: nothing listens at the address any more.
        std::process::exit(0);
    }
    let _ = read_stdin_line(scaled(60.0));
    println!("RESULT ok=1");
}

#[test]
#[ignore = "child process of another test"]
fn child_connect_to_gone() {
    let lib = init();
    let line = read_stdin_line(scaled(30.0));
    let mut peer = handle_from_hex(line.trim()).expect("handle");
    let started = Instant::now();
    let give_up = until(30.0);
    let err = loop {
        match lib.connect(0, &mut peer) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("connected to a listener that is gone"),
            Err(e) => break e,
        }
        assert!(Instant::now() < give_up, "the connect never failed");
        std::thread::sleep(Duration::from_millis(1));
    };
    println!(
        "RESULT error={} ms={}",
        err.code,
        started.elapsed().as_millis()
    );
    println!("RESULT ok=1");
}

#[test]
fn a_connect_to_a_listener_gone_is_refused_in_time() {
    if !hosts_or_skip() {
        return;
    }
    for p in providers() {
        for exits in [false, true] {
            let hosts = Hosts::new(2);
            let mut extra = vec![];
            if exits {
                extra.push(("NFAB_LISTENER_EXITS", "1"));
            }
            let env = host_env(p, &extra);
            let mut a = hosts.spawn(0, "child_listener_gone", &env, scaled(CHILD));
            let handle = a.read_result("handle");
            let mut b = hosts.spawn(1, "child_connect_to_gone", &env, scaled(CHILD));
            b.send_line(&handle);
            let fb = b.finish();
            let _ = a.try_send_line("done");
            let fa = a.finish();
            let what = format!(
                "over {p}, {}",
                if exits {
                    "its process gone"
                } else {
                    "listen comm closed"
                }
            );
            ok(&fb, &what);
            assert!(fa.success, "{what}: listener\n{}\n{}", fa.stdout, fa.stderr);
            let code: i32 = fb
                .result("error")
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .expect("error");
            let ms: u128 = fb
                .stdout
                .split("ms=")
                .nth(1)
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .expect("ms");
            eprintln!("{what}: connect failed with {code} after {ms} ms");
            assert_eq!(
                code,
                NcclResult::RemoteError as i32,
                "{what}: ncclRemoteError"
            );
            // The check of a connect that waited a second: 1 s, with slack for a 2-core machine.
            assert!(
                ms <= (2500.0 * slow()) as u128,
                "{what}: refused after {ms} ms"
            );
        }
    }
}

/// Every namespace of a test bed is gone once it is dropped, whatever the ranks did.
#[test]
fn hosts_leave_nothing_behind() {
    if !hosts_or_skip() {
        return;
    }
    let links = || {
        let out = std::process::Command::new("ip")
            .args(["-o", "link"])
            .output()
            .expect("ip link");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut names: Vec<String> = text
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_string()))
            .collect();
        names.sort();
        names
    };
    let before = links();
    let holders = {
        let hosts = Hosts::new(4);
        let mut r = hosts.spawn(
            2,
            "child_listener_gone",
            &host_env("tcp;ofi_rxm", &[]),
            scaled(CHILD),
        );
        r.read_result("handle");
        hosts.holders()
        // Dropped with a rank still running inside host 2.
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in holders {
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                Instant::now() < deadline,
                "holder {pid} outlived its test bed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Other tests' hosts may come and go meanwhile, but never here: none of them has an
    // interface in this namespace.
    assert_eq!(links(), before, "no interface left in this namespace");
}
