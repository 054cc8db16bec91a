//! The same provider without the plugin: one endpoint per side on the domain the plugin
//! chose, names swapped over the link, tagged messages and completions read directly. What
//! the plugin's figures are measured against.

use super::checks::{Ctx, Outcome};
use nccl_net_fabric::discover::discover;
use nccl_net_fabric::endpoint::{Endpoint, Event, Queue};
use nccl_net_fabric::fabric::{Domain, Fabric};
use nccl_net_fabric::op::{Op, Status};
use nccl_net_fabric::provider::decide;
use nccl_net_fabric::settings::Settings;
use std::time::Instant;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

struct Raw {
    _ep: std::sync::Arc<Endpoint>,
    queue: Queue,
    peer: u64,
}

impl Raw {
    fn drive(&mut self, events: &mut Vec<Event>) -> Result<(), String> {
        events.clear();
        self.queue.poll(events).map_err(|e| e.to_string())?;
        for e in events.drain(..) {
            match e {
                // SAFETY: every context is an Op of this module, alive until its completion.
                Event::Done {
                    context, len, tag, ..
                } => unsafe { &*context.cast::<Op>() }.complete(len, tag),
                // SAFETY: as above.
                Event::Failed(f) => unsafe { &*f.context.cast::<Op>() }.fail(f),
            }
        }
        Ok(())
    }

    /// Posts a send (`send`) or a receive of `len` bytes at `buf` with `tag`.
    fn post(
        &mut self,
        op: &Op,
        send: bool,
        buf: *mut u8,
        len: usize,
        tag: u64,
        deadline: Instant,
    ) -> Result<(), String> {
        let mut events = Vec::new();
        loop {
            op.mark_queued();
            // SAFETY: buf stays valid and op alive until `wait` saw the completion.
            let taken = unsafe {
                if send {
                    self.queue.send(
                        buf.cast(),
                        len,
                        std::ptr::null_mut(),
                        self.peer,
                        tag,
                        op.context(),
                    )
                } else {
                    let iov = [libc::iovec {
                        iov_base: buf.cast(),
                        iov_len: len,
                    }];
                    self.queue.recv(
                        &iov,
                        &mut [std::ptr::null_mut()],
                        nccl_net_fabric::sys::ADDR_UNSPEC,
                        tag,
                        0,
                        op.context(),
                    )
                }
            }
            .map_err(|e| e.to_string())?;
            if taken {
                op.mark_posted();
                return Ok(());
            }
            op.reset();
            self.drive(&mut events)?;
            if Instant::now() > deadline {
                return Err("the provider never took the operation".into());
            }
        }
    }

    fn wait(&mut self, op: &Op, deadline: Instant) -> Result<(), String> {
        let mut events = Vec::new();
        loop {
            match op.status() {
                Status::Done(_) => {
                    op.reset();
                    return Ok(());
                }
                Status::Failed => return Err(format!("{:?}", op.failure())),
                _ => {}
            }
            self.drive(&mut events)?;
            if Instant::now() > deadline {
                return Err("a raw operation did not complete".into());
            }
        }
    }
}

/// An endpoint on the chosen domain, connected to the other side's.
fn open(ctx: &mut Ctx, deadline: Instant) -> Result<Raw, String> {
    let settings = Settings::from_env().map_err(|e| e.to_string())?;
    let d = discover(&settings).map_err(|e| e.to_string())?;
    let decision = decide(&d.candidates, &settings);
    let &first = decision.devices.first().ok_or("no device")?;
    let info = d.info(first);
    let fabric = Fabric::open(info).map_err(|e| e.to_string())?;
    let domain = Domain::open(&fabric, info).map_err(|e| e.to_string())?;
    let (ep, queue) = Endpoint::open(&domain, None).map_err(|e| e.to_string())?;
    let mine = hex(&ep.name);
    let theirs = if ctx.initiator {
        ctx.link.send(&["RAWNAME", &mine])?;
        ctx.link.expect("RAWNAME", deadline)?
    } else {
        let t = ctx.link.expect("RAWNAME", deadline)?;
        ctx.link.send(&["RAWNAME", &mine])?;
        t
    };
    let name = theirs
        .first()
        .and_then(|h| unhex(h))
        .ok_or("the other side sent no name")?;
    let peer = ep.insert(&name).map_err(|e| e.to_string())?;
    Ok(Raw {
        _ep: ep,
        queue,
        peer,
    })
}

/// Raw 8-byte ping-pong (half round trip, µs) and 1 MiB stream (GB/s), initiator to
/// responder, 8 in flight.
pub fn measure(ctx: &mut Ctx, deadline: Instant) -> Outcome {
    const ROUNDS: usize = 1000;
    const WARM: usize = 100;
    const SIZE: usize = 1 << 20;
    const COUNT: usize = 64;
    const WINDOW: usize = 8;
    let mut raw = open(ctx, deadline)?;
    let (a, b) = (Op::default(), Op::default());
    let mut small = [0u8; 8];
    let mut start = Instant::now();
    for i in 0..ROUNDS + WARM {
        if i == WARM {
            start = Instant::now();
        }
        let p = small.as_mut_ptr();
        if ctx.initiator {
            raw.post(&b, false, p, 8, 1, deadline)?;
            raw.post(&a, true, p, 8, 1, deadline)?;
            raw.wait(&a, deadline)?;
            raw.wait(&b, deadline)?;
        } else {
            raw.post(&b, false, p, 8, 1, deadline)?;
            raw.wait(&b, deadline)?;
            raw.post(&a, true, p, 8, 1, deadline)?;
            raw.wait(&a, deadline)?;
        }
    }
    let half = start.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64 / 2.0;
    let mut bufs: Vec<Vec<u8>> = (0..WINDOW).map(|_| vec![7u8; SIZE]).collect();
    let ops: Vec<Op> = (0..WINDOW).map(|_| Op::default()).collect();
    let t = Instant::now();
    let mut inflight = std::collections::VecDeque::new();
    for i in 0..COUNT {
        if inflight.len() == WINDOW {
            let k: usize = inflight.pop_front().expect("full");
            raw.wait(&ops[k], deadline)?;
        }
        let k = i % WINDOW;
        let p = bufs[k].as_mut_ptr();
        raw.post(&ops[k], ctx.initiator, p, SIZE, 2, deadline)?;
        inflight.push_back(k);
    }
    while let Some(k) = inflight.pop_front() {
        raw.wait(&ops[k], deadline)?;
    }
    let gbps = (SIZE * COUNT) as f64 / t.elapsed().as_secs_f64() / 1e9;
    Ok(format!("{half:.1}:{gbps:.3}"))
}
