//! `nccl-net-fabric demo`: the plugin as NCCL sees it, over loopback.

use nccl_net_fabric::nccl::PTR_HOST;
use nccl_net_host::{PluginLib, Ptr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const IN_FLIGHT: usize = 8;

/// The plugin library: the one given, else the first found where this tool is built or
/// installed.
fn locate(given: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(p);
    }
    PluginLib::find().map_err(|tried| {
        format!(
            "no plugin library found beside this tool (looked for {}); give one with --plugin PATH",
            tried
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

pub fn run(plugin: Option<PathBuf>) -> ExitCode {
    exercise(plugin, "demo", true)
}

/// `doctor --selftest`: the demo's transfer, checked, with a one-line verdict.
pub fn selftest(plugin: Option<PathBuf>) -> ExitCode {
    let code = exercise(plugin, "doctor --selftest", false);
    if code == ExitCode::SUCCESS {
        println!("selftest: passed (data moved and verified through the plugin's table)");
    } else {
        println!("selftest: FAILED (see the line above)");
    }
    code
}

/// Loads the plugin as NCCL does, lists its devices and moves data through it over
/// loopback; `info` also shows the plugin's INFO lines.
fn exercise(plugin: Option<PathBuf>, what: &str, info: bool) -> ExitCode {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("nccl-net-fabric {what}: {e}");
        ExitCode::from(1)
    };
    let path = match locate(plugin) {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    if info && std::env::var_os("NCCL_DEBUG").is_none() {
        std::env::set_var("NCCL_DEBUG", "INFO");
    }
    let lib = match PluginLib::open(&path) {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    println!(
        "loaded {} (table ncclNetPlugin_v8, name \"{}\")",
        path.display(),
        lib.name()
    );
    if let Err(e) = lib.init(true) {
        return fail(&format!("{e}: see the WARN line above"));
    }
    let n = match lib.devices() {
        Ok(n) => n,
        Err(e) => return fail(&e),
    };
    for dev in 0..n {
        match lib.properties(dev) {
            Ok(p) => println!(
                "device {dev}: name {} pciPath {} speed {} Mbps ptrSupport {:#x} maxRecvs {} maxComms {}",
                p.name,
                p.pci_path.as_deref().unwrap_or("(none)"),
                p.speed,
                p.ptr_support,
                p.max_recvs,
                p.max_comms
            ),
            Err(e) => return fail(&e),
        }
    }
    match transfer(&lib) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

struct Side {
    send: Ptr,
    recv: Ptr,
}

fn transfer(lib: &PluginLib) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    // Two comm pairs, one per direction, as two NCCL ranks would have.
    let (s1, r1) = lib.connect_pair(0, deadline)?;
    let (s2, r2) = lib.connect_pair(0, deadline)?;
    let a = Side { send: s1, recv: r2 };
    let b = Side { send: s2, recv: r1 };
    // A first exchange sets up the provider's connections (tcp;ofi_rxm connects an endpoint
    // pair on its first message, in a fraction of a second): not part of any figure.
    stream(lib, &a, &b, 4 << 10, 8, deadline)?;
    println!("\nloopback through the plugin table on device 0 ({IN_FLIGHT} requests in flight):");
    println!("{:>10} {:>12} {:>10}", "size", "GB/s", "verified");
    let mut size = 4 << 10;
    while size <= 8 << 20 {
        let iters = ((256 << 20) / size).clamp(8, 512);
        let (gbps, ok) = stream(lib, &a, &b, size, iters, deadline)?;
        println!(
            "{:>10} {:>12.3} {:>10}",
            human(size),
            gbps,
            if ok { "yes" } else { "NO" }
        );
        if !ok {
            return Err("received data differs from what was sent".into());
        }
        size *= 4;
    }
    let lat = ping_pong(lib, &a, &b, 8, 2000, deadline)?;
    println!("\nlatency (8 B ping-pong, half round trip): {lat:.2} us");
    for (s, r) in [(a.send, b.recv), (b.send, a.recv)] {
        lib.close_send(s)?;
        lib.close_recv(r)?;
    }
    Ok(())
}

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

/// Streams `iters` messages of `size` bytes a → b; returns (GB/s, data verified).
fn stream(
    lib: &PluginLib,
    a: &Side,
    b: &Side,
    size: usize,
    iters: usize,
    deadline: Instant,
) -> Result<(f64, bool), Box<dyn std::error::Error>> {
    let mut src: Vec<Vec<u8>> = (0..IN_FLIGHT)
        .map(|i| (0..size).map(|j| (j * 7 + i) as u8).collect())
        .collect();
    let mut dst: Vec<Vec<u8>> = (0..IN_FLIGHT).map(|_| vec![0u8; size]).collect();
    let smr: Vec<Ptr> = src
        .iter_mut()
        .map(|v| {
            // SAFETY: the buffers outlive their registrations (deregistered below).
            unsafe { lib.reg_mr(a.send, v.as_mut_ptr().cast(), size, PTR_HOST) }
        })
        .collect::<Result<_, _>>()?;
    let rmr: Vec<Ptr> = dst
        .iter_mut()
        .map(|v| {
            // SAFETY: as above.
            unsafe { lib.reg_mr(b.recv, v.as_mut_ptr().cast(), size, PTR_HOST) }
        })
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let recv_side = std::thread::scope(|scope| {
        let dst_ptrs: Vec<usize> = dst.iter_mut().map(|v| v.as_mut_ptr() as usize).collect();
        let rmr = &rmr;
        let receiver = scope.spawn(move || -> Result<(), nccl_net_host::CallError> {
            let mut pending = std::collections::VecDeque::new();
            for i in 0..iters {
                if pending.len() == IN_FLIGHT {
                    lib.wait(pending.pop_front().expect("non-empty"), deadline)?;
                }
                let slot = i % IN_FLIGHT;
                // SAFETY: dst buffers outlive the scope; each slot is reused only after its
                // previous receive completed (at most IN_FLIGHT outstanding, FIFO).
                pending.push_back(unsafe {
                    lib.irecv_until(
                        b.recv,
                        dst_ptrs[slot] as *mut _,
                        size as i32,
                        rmr[slot],
                        deadline,
                    )?
                });
            }
            for r in pending {
                lib.wait(r, deadline)?;
            }
            Ok(())
        });
        let mut pending = std::collections::VecDeque::new();
        for i in 0..iters {
            if pending.len() == IN_FLIGHT {
                lib.wait(pending.pop_front().expect("non-empty"), deadline)?;
            }
            let slot = i % IN_FLIGHT;
            // SAFETY: src buffers outlive the scope and are not written while in flight.
            pending.push_back(unsafe {
                lib.isend_until(
                    a.send,
                    src[slot].as_mut_ptr().cast(),
                    size as i32,
                    smr[slot],
                    deadline,
                )?
            });
        }
        for r in pending {
            lib.wait(r, deadline)?;
        }
        receiver.join().expect("receiver thread")
    });
    recv_side?;
    let secs = start.elapsed().as_secs_f64();
    // Each destination slot last received message number (iters-1 - k) with slot = that % IN_FLIGHT.
    let ok = (0..IN_FLIGHT.min(iters)).all(|slot| dst[slot] == src[slot]);
    for m in smr {
        lib.dereg_mr(a.send, m)?;
    }
    for m in rmr {
        lib.dereg_mr(b.recv, m)?;
    }
    Ok(((size * iters) as f64 / secs / 1e9, ok))
}

/// Half round-trip time in microseconds of `size`-byte ping-pongs.
fn ping_pong(
    lib: &PluginLib,
    a: &Side,
    b: &Side,
    size: usize,
    iters: usize,
    deadline: Instant,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut abuf = vec![1u8; size];
    let mut aback = vec![0u8; size];
    let mut bbuf = vec![0u8; size];
    let (abuf_ptr, aback_ptr, bbuf_ptr) = (
        abuf.as_mut_ptr() as usize,
        aback.as_mut_ptr() as usize,
        bbuf.as_mut_ptr() as usize,
    );
    let start = Instant::now();
    std::thread::scope(|scope| {
        let echo = scope.spawn(move || -> Result<(), nccl_net_host::CallError> {
            for _ in 0..iters {
                // SAFETY: bbuf outlives the scope; one operation on it at a time.
                let r = unsafe {
                    lib.irecv_until(
                        b.recv,
                        bbuf_ptr as *mut _,
                        size as i32,
                        Ptr(std::ptr::null_mut()),
                        deadline,
                    )?
                };
                lib.wait(r, deadline)?;
                // SAFETY: as above.
                let s = unsafe {
                    lib.isend_until(
                        b.send,
                        bbuf_ptr as *mut _,
                        size as i32,
                        Ptr(std::ptr::null_mut()),
                        deadline,
                    )?
                };
                lib.wait(s, deadline)?;
            }
            Ok(())
        });
        for _ in 0..iters {
            // SAFETY: abuf and aback outlive the scope; one operation on each at a time.
            let s = unsafe {
                lib.isend_until(
                    a.send,
                    abuf_ptr as *mut _,
                    size as i32,
                    Ptr(std::ptr::null_mut()),
                    deadline,
                )?
            };
            // SAFETY: as above.
            let r = unsafe {
                lib.irecv_until(
                    a.recv,
                    aback_ptr as *mut _,
                    size as i32,
                    Ptr(std::ptr::null_mut()),
                    deadline,
                )?
            };
            lib.wait(s, deadline)?;
            lib.wait(r, deadline)?;
        }
        echo.join().expect("echo thread")
    })?;
    Ok(start.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64)
}
