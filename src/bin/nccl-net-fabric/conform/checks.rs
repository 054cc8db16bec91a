//! The checks that need both sides: each is one function both processes run at once, the
//! initiator (which writes the report) and the responder (which follows), with NCCL's calls
//! through the plugin's exported table and a deadline on every wait. Each side returns what
//! it saw as one line of text; the initiator turns both into a row (see `mod.rs`).

use super::link::Link;
use nccl_net_fabric::nccl::PTR_HOST;
use nccl_net_host::{handle_from_hex, handle_to_hex, until, CallError, PluginLib, Ptr, RecvBuffer};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One side of the checks.
pub struct Ctx {
    pub lib: PluginLib,
    pub link: Link,
    pub initiator: bool,
    pub dev: i32,
}

pub type Outcome = Result<String, String>;

pub fn call(e: CallError) -> String {
    format!("{} returned {}", e.call, e.code)
}

/// Swaps one line with the other side: the initiator writes first.
fn swap(
    ctx: &mut Ctx,
    word: &str,
    words: &[String],
    deadline: Instant,
) -> Result<Vec<String>, String> {
    let mut line: Vec<&str> = vec![word];
    line.extend(words.iter().map(String::as_str));
    if ctx.initiator {
        ctx.link.send(&line)?;
        ctx.link.expect(word, deadline)
    } else {
        let got = ctx.link.expect(word, deadline)?;
        ctx.link.send(&line)?;
        Ok(got)
    }
}

/// `n` comm pairs each way: this side's send comm `i` reaches the other side's listen comm
/// `i`, whose accepted comm is the other side's receive comm `i`. Returns the comms and the
/// longest any single connect or accept call took.
pub fn pairs(
    ctx: &mut Ctx,
    n: usize,
    deadline: Instant,
) -> Result<(Vec<Ptr>, Vec<Ptr>, Duration), String> {
    let (lib, dev) = (&ctx.lib, ctx.dev);
    let mut listens = Vec::with_capacity(n);
    let mut mine = Vec::with_capacity(n);
    for _ in 0..n {
        let (h, l) = lib.listen(dev).map_err(call)?;
        listens.push(l);
        mine.push(handle_to_hex(&h));
    }
    let theirs = swap(ctx, "HANDLES", &mine, deadline)?;
    let lib = &ctx.lib;
    let mut handles = theirs
        .iter()
        .map(|h| handle_from_hex(h).ok_or("the other side sent a damaged handle"))
        .collect::<Result<Vec<_>, _>>()?;
    if handles.len() != n {
        return Err(format!(
            "the other side listened {} times, not {n}",
            handles.len()
        ));
    }
    let (mut sends, mut recvs) = (vec![None; n], vec![None; n]);
    let mut longest = Duration::ZERO;
    while sends.iter().chain(&recvs).any(Option::is_none) {
        for i in 0..n {
            if sends[i].is_none() {
                let t = Instant::now();
                sends[i] = lib.connect(dev, &mut handles[i]).map_err(call)?;
                longest = longest.max(t.elapsed());
            }
            if recvs[i].is_none() {
                let t = Instant::now();
                recvs[i] = lib.accept(listens[i]).map_err(call)?;
                longest = longest.max(t.elapsed());
            }
        }
        if Instant::now() > deadline {
            let done = sends.iter().chain(&recvs).filter(|c| c.is_some()).count();
            return Err(format!(
                "{done} of {} comms connected before the deadline",
                2 * n
            ));
        }
    }
    for l in listens {
        lib.close_listen(l).map_err(call)?;
    }
    Ok((
        sends.into_iter().map(Option::unwrap).collect(),
        recvs.into_iter().map(Option::unwrap).collect(),
        longest,
    ))
}

pub fn close_all(lib: &PluginLib, sends: &[Ptr], recvs: &[Ptr]) -> Result<(), String> {
    for &s in sends {
        lib.close_send(s).map_err(call)?;
    }
    for &r in recvs {
        lib.close_recv(r).map_err(call)?;
    }
    Ok(())
}

/// What message `index` of `size` bytes holds.
pub fn fill(buf: &mut [u8], size: usize, index: usize) {
    let seed = (size as u64)
        .wrapping_mul(0x9e37_79b9)
        .wrapping_add(index as u64);
    for (j, b) in buf.iter_mut().enumerate() {
        *b = (seed.wrapping_add(j as u64 * 131) >> 3) as u8;
    }
}

pub fn intact(buf: &[u8], size: usize, index: usize) -> bool {
    let mut want = vec![0u8; buf.len()];
    fill(&mut want, size, index);
    want == buf
}

/// Buffers registered on one comm, freed with their registrations.
pub struct Buffers<'a> {
    lib: &'a PluginLib,
    comm: Ptr,
    pub bufs: Vec<Vec<u8>>,
    pub mrs: Vec<Ptr>,
}

impl<'a> Buffers<'a> {
    pub fn new(lib: &'a PluginLib, comm: Ptr, count: usize, size: usize) -> Result<Self, String> {
        let mut bufs: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; size.max(1)]).collect();
        let mut mrs = Vec::with_capacity(count);
        for b in &mut bufs {
            // SAFETY: each buffer lives in `bufs` until Drop deregisters it first.
            let mr = unsafe { lib.reg_mr(comm, b.as_mut_ptr().cast(), b.len(), PTR_HOST) };
            mrs.push(mr.map_err(call)?);
        }
        Ok(Buffers {
            lib,
            comm,
            bufs,
            mrs,
        })
    }
}

impl Buffers<'_> {
    /// Deregisters now (NCCL deregisters before it closes a comm).
    pub fn deregister(&mut self) {
        for m in self.mrs.drain(..) {
            let _ = self.lib.dereg_mr(self.comm, m);
        }
    }
}

impl Drop for Buffers<'_> {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// Streams `count` messages of `size` bytes from the initiator to the responder on one
/// comm, `window` in flight, every one checked on arrival: (seconds, messages intact).
pub fn stream(
    ctx: &Ctx,
    comm: Ptr,
    size: usize,
    count: usize,
    window: usize,
    deadline: Instant,
) -> Result<(f64, usize), String> {
    stream_checked(ctx, comm, size, count, window, true, deadline)
}

/// [`stream`], with the data written and checked (`verify`) or left as it is (for figures).
pub fn stream_checked(
    ctx: &Ctx,
    comm: Ptr,
    size: usize,
    count: usize,
    window: usize,
    verify: bool,
    deadline: Instant,
) -> Result<(f64, usize), String> {
    let lib = &ctx.lib;
    let sending = ctx.initiator;
    let mut b = Buffers::new(lib, comm, window, size)?;
    let mut pending: VecDeque<(Ptr, usize)> = VecDeque::new();
    let mut intact_count = 0;
    let start = Instant::now();
    let mut finish = |lib: &PluginLib, b: &Buffers, (req, i): (Ptr, usize)| -> Result<(), String> {
        let n = lib.wait(req, deadline).map_err(call)?;
        if !sending
            && n as usize == size
            && (!verify || intact(&b.bufs[i % window][..size], size, i))
        {
            intact_count += 1;
        }
        Ok(())
    };
    for i in 0..count {
        if pending.len() == window {
            let p = pending.pop_front().expect("full");
            finish(lib, &b, p)?;
        }
        let slot = i % window;
        let ptr = b.bufs[slot].as_mut_ptr();
        if sending && verify {
            fill(&mut b.bufs[slot][..size], size, i);
        }
        // SAFETY: the slot's buffer stays allocated and untouched until its request
        // completes (a slot is reused only after `finish`).
        let req = unsafe {
            match sending {
                true => lib.isend_until(comm, ptr.cast(), size as i32, b.mrs[slot], deadline),
                false => lib.irecv_until(comm, ptr.cast(), size as i32, b.mrs[slot], deadline),
            }
        }
        .map_err(call)?;
        pending.push_back((req, i));
    }
    while let Some(p) = pending.pop_front() {
        finish(lib, &b, p)?;
    }
    Ok((
        start.elapsed().as_secs_f64(),
        if sending { count } else { intact_count },
    ))
}

/// Tagged sends and receives of every size NCCL uses, each verified.
pub fn transfers(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let comm = if ctx.initiator { s[0] } else { r[0] };
    let mut out = Vec::new();
    for &(size, count, window) in SIZES {
        let (secs, good) = stream(ctx, comm, size, count, window, deadline)?;
        out.push(format!(
            "{size}:{count}:{good}:{:.3}",
            size as f64 * count as f64 / secs / 1e9
        ));
    }
    close_all(&ctx.lib, &s, &r)?;
    Ok(out.join(","))
}

/// (bytes, messages, in flight) of the transfer check.
pub const SIZES: &[(usize, usize, usize)] = &[
    (0, 64, 32),
    (1, 64, 32),
    (4 << 10, 128, 32),
    (64 << 10, 128, 32),
    (1 << 20, 64, 32),
    (8 << 20, 32, 32),
];

/// 1, 16 or 256 comm pairs at once, a message on each, then closed.
pub fn many(ctx: &mut Ctx, n: usize, deadline: Instant) -> Outcome {
    let t = Instant::now();
    let (s, r, longest) = pairs(ctx, n, deadline)?;
    let connected = t.elapsed();
    for i in 0..n {
        let comm = if ctx.initiator { s[i] } else { r[i] };
        let (_, good) = stream(ctx, comm, 4096, 1, 1, deadline)?;
        if good != 1 {
            return Err(format!("comm {i}: the message arrived damaged"));
        }
    }
    close_all(&ctx.lib, &s, &r)?;
    Ok(format!(
        "{} comms connected in {} ms, longest single connect/accept call {} ms",
        2 * n,
        connected.as_millis(),
        longest.as_millis()
    ))
}

/// Connect, one message, close, `cycles` times.
pub fn cycles(ctx: &mut Ctx, cycles: usize, deadline: Instant) -> Outcome {
    let t = Instant::now();
    for c in 0..cycles {
        let (s, r, _) = pairs(ctx, 1, deadline).map_err(|e| format!("cycle {c}: {e}"))?;
        let comm = if ctx.initiator { s[0] } else { r[0] };
        stream(ctx, comm, 4096, 1, 1, deadline).map_err(|e| format!("cycle {c}: {e}"))?;
        close_all(&ctx.lib, &s, &r)?;
    }
    Ok(format!(
        "{cycles} cycles, {} ms each",
        t.elapsed().as_millis() / cycles as u128
    ))
}

/// A grouped receive of 8 buffers with shuffled tags; the sends come in another order.
pub fn grouped(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    const TAGS: [i32; 8] = [5, 2, 7, 0, 3, 6, 1, 4];
    const SEND_ORDER: [usize; 8] = [3, 6, 1, 4, 0, 7, 2, 5];
    const SIZE: usize = 4096;
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let lib = &ctx.lib;
    let result = if ctx.initiator {
        let mut b = Buffers::new(lib, s[0], 8, SIZE)?;
        let mut reqs = Vec::new();
        for &k in &SEND_ORDER {
            let tag = TAGS[k];
            fill(&mut b.bufs[k], SIZE, tag as usize);
            let ptr = b.bufs[k].as_mut_ptr();
            // SAFETY: the buffer outlives the request (waited for below).
            let req = until("isend", deadline, || unsafe {
                lib.isend_tagged(
                    s[0],
                    ptr.cast(),
                    SIZE,
                    tag,
                    b.mrs[k],
                    Ptr(std::ptr::null_mut()),
                )
            })
            .map_err(call)?;
            reqs.push(req);
        }
        for q in reqs {
            lib.wait(q, deadline).map_err(call)?;
        }
        Ok("8 tagged sends completed".to_string())
    } else {
        let mut b = Buffers::new(lib, r[0], 8, SIZE)?;
        let group: Vec<RecvBuffer> = (0..8)
            .map(|k| RecvBuffer {
                data: b.bufs[k].as_mut_ptr().cast(),
                size: SIZE,
                tag: TAGS[k],
                mhandle: b.mrs[k],
                phandle: Ptr(std::ptr::null_mut()),
            })
            .collect();
        // SAFETY: the buffers outlive the request (tested to completion below).
        let req = until("irecv", deadline, || unsafe {
            lib.irecv_group(r[0], &group)
        })
        .map_err(call)?;
        let sizes = until("test", deadline, || lib.test_group(req, 8)).map_err(call)?;
        let good = (0..8)
            .filter(|&k| sizes[k] as usize == SIZE && intact(&b.bufs[k], SIZE, TAGS[k] as usize))
            .count();
        match good {
            8 => Ok("8 of 8 buffers hold the message of their tag".to_string()),
            n => Err(format!(
                "{n} of 8 buffers hold the message of their tag (sizes {sizes:?})"
            )),
        }
    };
    close_all(lib, &s, &r)?;
    result
}

/// A receive of 4 KiB for a send of 8 KiB: must fail, not complete with half the data.
pub fn truncated(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let lib = &ctx.lib;
    let comm = if ctx.initiator { s[0] } else { r[0] };
    let size = if ctx.initiator { 8192 } else { 4096 };
    let mut b = Buffers::new(lib, comm, 1, size)?;
    let ptr = b.bufs[0].as_mut_ptr();
    // SAFETY: the buffer outlives the request.
    let req = unsafe {
        match ctx.initiator {
            true => lib.isend_until(comm, ptr.cast(), size as i32, b.mrs[0], deadline),
            false => lib.irecv_until(comm, ptr.cast(), size as i32, b.mrs[0], deadline),
        }
    }
    .map_err(call)?;
    let t = Instant::now();
    let got = lib.wait(req, deadline);
    b.deregister();
    let said = match got {
        Ok(n) => format!("completed with {n} bytes"),
        Err(e) if e.code == -1 => format!(
            "did not finish within the deadline ({} s)",
            t.elapsed().as_secs()
        ),
        Err(e) => format!("failed: {} after {} ms", call(e), t.elapsed().as_millis()),
    };
    // Comms with a failed request are closed as NCCL would (it aborts the communicator).
    let _ = close_all(lib, &s, &r);
    Ok(said)
}

/// The receiver posts, then makes no call for `IDLE`; the sender's sends must still finish.
pub fn idle(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    const IDLE: Duration = Duration::from_secs(3);
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let sizes: Vec<usize> = std::iter::repeat(64 << 10)
        .take(16)
        .chain([8 << 20])
        .collect();
    let comm = if ctx.initiator { s[0] } else { r[0] };
    let result = {
        let lib = &ctx.lib;
        let mut bufs: Vec<Buffers> = sizes
            .iter()
            .map(|&n| Buffers::new(lib, comm, 1, n))
            .collect::<Result<_, _>>()?;
        if !ctx.initiator {
            let mut reqs = Vec::new();
            for (i, b) in bufs.iter_mut().enumerate() {
                let ptr = b.bufs[0].as_mut_ptr();
                // SAFETY: the buffer outlives the request.
                let q = unsafe {
                    lib.irecv_until(comm, ptr.cast(), sizes[i] as i32, b.mrs[0], deadline)
                };
                reqs.push(q.map_err(call)?);
            }
            ctx.link.send(&["POSTED"])?;
            std::thread::sleep(IDLE);
            for q in reqs {
                ctx.lib.wait(q, deadline).map_err(call)?;
            }
            Ok("receives done after the idle time".to_string())
        } else {
            ctx.link.expect("POSTED", deadline)?;
            let start = Instant::now();
            let mut reqs = VecDeque::new();
            for (i, b) in bufs.iter_mut().enumerate() {
                fill(&mut b.bufs[0], sizes[i], i);
                let ptr = b.bufs[0].as_mut_ptr();
                // SAFETY: the buffer outlives the request.
                let q = unsafe {
                    lib.isend_until(comm, ptr.cast(), sizes[i] as i32, b.mrs[0], deadline)
                };
                reqs.push_back(q.map_err(call)?);
            }
            let mut done_at = None;
            while !reqs.is_empty() {
                let q = reqs.pop_front().expect("non-empty");
                match lib.test(q).map_err(call)? {
                    Some(_) => {}
                    None => reqs.push_back(q),
                }
                if reqs.is_empty() {
                    done_at = Some(start.elapsed());
                }
                if Instant::now() > deadline {
                    return Err("the sends never finished".into());
                }
            }
            let at = done_at.unwrap_or_default();
            Ok(format!(
                "{} ms {}",
                at.as_millis(),
                if at < IDLE { "within" } else { "after" }
            ))
        }
    };
    close_all(&ctx.lib, &s, &r)?;
    result
}

/// 8 requests of 1 MiB posted each way, the comms closed at once; then a new pair must work.
pub fn close_in_flight(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let lib = &ctx.lib;
    let comm = if ctx.initiator { s[0] } else { r[0] };
    let mut b = Buffers::new(lib, comm, 8, 1 << 20)?;
    for k in 0..8 {
        let ptr = b.bufs[k].as_mut_ptr();
        // SAFETY: the buffers are never freed (see below).
        let q = unsafe {
            match ctx.initiator {
                true => lib.isend(comm, ptr.cast(), 1 << 20, b.mrs[k]),
                false => lib.irecv(comm, ptr.cast(), 1 << 20, b.mrs[k]),
            }
        };
        q.map_err(call)?;
    }
    // As NCCL: deregister, then close with the requests still posted. The buffers stay
    // allocated for the process's life, as NCCL's stay until its communicator is freed.
    b.deregister();
    let t = Instant::now();
    close_all(lib, &s, &r)?;
    let closed = t.elapsed();
    std::mem::forget(std::mem::take(&mut b.bufs));
    drop(b);
    let (s2, r2, _) = pairs(ctx, 1, deadline)?;
    let comm = if ctx.initiator { s2[0] } else { r2[0] };
    let (_, good) = stream(ctx, comm, 1 << 20, 2, 2, deadline)?;
    close_all(&ctx.lib, &s2, &r2)?;
    if good != 2 {
        return Err("after the close, a new pair's messages arrived damaged".into());
    }
    Ok(format!(
        "closed in {} ms; a new pair then moved 2 MiB intact",
        closed.as_millis()
    ))
}

/// 1 MiB x 64, 8 in flight, the data not touched: the plugin's figure beside raw
/// libfabric's (same shape as `raw::measure`), in GB/s.
pub fn bandwidth(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let comm = if ctx.initiator { s[0] } else { r[0] };
    stream_checked(ctx, comm, 1 << 20, 8, 8, false, deadline)?;
    let (secs, _) = stream_checked(ctx, comm, 1 << 20, 64, 8, false, deadline)?;
    close_all(&ctx.lib, &s, &r)?;
    Ok(format!("{:.3}", (64usize << 20) as f64 / secs / 1e9))
}

/// 8-byte ping-pong: half the round trip, in µs.
pub fn latency(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    const ROUNDS: usize = 1000;
    const WARM: usize = 100;
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let lib = &ctx.lib;
    let mut out = Buffers::new(lib, s[0], 1, 8)?;
    let mut inb = Buffers::new(lib, r[0], 1, 8)?;
    let (op, ip) = (out.bufs[0].as_mut_ptr(), inb.bufs[0].as_mut_ptr());
    let mut start = Instant::now();
    for i in 0..ROUNDS + WARM {
        if i == WARM {
            start = Instant::now();
        }
        // SAFETY: both buffers outlive every request (each is waited for at once).
        unsafe {
            if ctx.initiator {
                let q = lib
                    .isend_until(s[0], op.cast(), 8, out.mrs[0], deadline)
                    .map_err(call)?;
                let p = lib
                    .irecv_until(r[0], ip.cast(), 8, inb.mrs[0], deadline)
                    .map_err(call)?;
                lib.wait(q, deadline).map_err(call)?;
                lib.wait(p, deadline).map_err(call)?;
            } else {
                let p = lib
                    .irecv_until(r[0], ip.cast(), 8, inb.mrs[0], deadline)
                    .map_err(call)?;
                lib.wait(p, deadline).map_err(call)?;
                let q = lib
                    .isend_until(s[0], op.cast(), 8, out.mrs[0], deadline)
                    .map_err(call)?;
                lib.wait(q, deadline).map_err(call)?;
            }
        }
    }
    let half = start.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64 / 2.0;
    drop((out, inb));
    close_all(lib, &s, &r)?;
    Ok(format!("{half:.1}"))
}

/// The responder kills itself mid-stream; the initiator's requests must fail.
pub fn peer_killed(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    let (s, r, _) = pairs(ctx, 1, deadline)?;
    let lib = &ctx.lib;
    let comm = if ctx.initiator { s[0] } else { r[0] };
    let mut b = Buffers::new(lib, comm, 4, 1 << 20)?;
    if !ctx.initiator {
        for k in 0..4 {
            let ptr = b.bufs[k].as_mut_ptr();
            // SAFETY: the process ends below, with the buffers alive.
            unsafe { lib.irecv_until(comm, ptr.cast(), 1 << 20, b.mrs[k], deadline) }
                .map_err(call)?;
        }
        std::thread::sleep(Duration::from_millis(100));
        ctx.link.send(&["KILLING"])?;
        // SAFETY: raising SIGKILL on this process ends it at once, as a crash would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!("SIGKILL returned");
    }
    ctx.link.expect("KILLING", deadline)?;
    let killed = Instant::now();
    let mut k = 0usize;
    loop {
        let ptr = b.bufs[k % 4].as_mut_ptr();
        // SAFETY: the buffers outlive every request (each is finished before reuse).
        let q = match unsafe { lib.isend_until(comm, ptr.cast(), 1 << 20, b.mrs[k % 4], deadline) }
        {
            Ok(q) => q,
            Err(e) => {
                return Ok(format!(
                    "{} after {} ms",
                    call(e),
                    killed.elapsed().as_millis()
                ))
            }
        };
        if let Err(e) = lib.wait(q, deadline) {
            return Ok(format!(
                "{} after {} ms",
                call(e),
                killed.elapsed().as_millis()
            ));
        }
        k += 1;
        if Instant::now() > deadline {
            return Err(format!(
                "{k} sends to the dead peer completed and none failed"
            ));
        }
    }
}
