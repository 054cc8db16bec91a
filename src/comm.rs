//! Send and receive comms: tagged operations on a (possibly shared) endpoint, a bounded
//! request pool per comm, progress, completion and close.
//!
//! Threads: NCCL calls isend/irecv/test from its progress thread and regMr/close from its
//! service thread, and with several GPUs per process several ranks do so at once. A comm's
//! posting order is guarded by its `post` lock; request slots are claimed with atomics;
//! completions are recorded through atomics in [`Op`], so any thread may read the shared
//! completion queue — NCCL's own calls, or a progress thread per endpoint where
//! `NCCL_FABRIC_PROGRESS_THREAD` asks for one. Where there is one, NCCL's isend/irecv only
//! queue their operation ([`crate::handoff`]) and that thread posts it. libfabric objects are
//! opened `FI_THREAD_SAFE`.

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::handoff::{Handoff, Pending, PendingKind};
use crate::handshake::Identity;
use crate::op::{Op, Status};
use crate::plugin::{Device, Plugin};
use crate::settings::{EndpointSharing, PostFrom};
use crate::sys;
use crate::tags::Tags;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Outstanding requests per comm (NCCL keeps at most 8 in flight; its limit is 32).
pub const REQUESTS_PER_COMM: usize = crate::nccl::NET_MAX_REQUESTS;
/// How often a request that waits long checks whether a peer on this host still lives.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(500);
/// How often a close repeats its cancels while waiting for ops to leave the provider.
const CANCEL_INTERVAL: Duration = Duration::from_millis(5);
/// Progress batches read per call before returning to NCCL.
const PROGRESS_ROUNDS: usize = 8;

/// Which side of a comm pair an endpoint serves. With shared endpoints a device has lanes of
/// each, so two ranks of one process never send to their own endpoint (some providers,
/// shm among them, cannot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Listen comms and the receive comms they accept.
    Receiving = 0,
    /// Send comms made by connect.
    Sending = 1,
}

/// An endpoint and what every comm on it shares: the tag layout, the comm-id counter, a
/// nonce that makes this endpoint's handles unique, and the peers already in its address
/// vector (each address is inserted once, so every comm to a peer uses one fi_addr).
pub struct SharedEndpoint {
    /// Shared with the progress thread, which the drop of this struct stops and joins first,
    /// so the endpoint is always closed on the thread that dropped the last comm.
    pub ep: Arc<Endpoint>,
    pub tags: Tags,
    pub nonce: u64,
    pub me: Identity,
    next_id: AtomicU64,
    peers: Mutex<HashMap<Vec<u8>, sys::fi_addr_t>>,
    /// A progress thread reads this endpoint's completions (`NCCL_FABRIC_PROGRESS_THREAD`);
    /// NCCL's calls then only look at their ops.
    driven: AtomicBool,
    /// Set by the progress thread when the completion queue itself failed.
    broken: Arc<Mutex<Option<String>>>,
    /// Sends and receives for the progress thread to post (`NCCL_FABRIC_POST_FROM`).
    handoff: Arc<Handoff>,
    /// Whether posts go through `handoff`: set once the progress thread runs.
    hands_off: AtomicBool,
    progress_thread: Mutex<Option<ProgressThread>>,
    /// Whether peers in this process may point into this endpoint's memory (shm, sm2).
    shares_memory: bool,
    /// Sending endpoints of this process whose messages this endpoint may still hold: they
    /// are closed after it (fields drop in order: `ep` first). See [`Comm::close`].
    parked: Mutex<Vec<Arc<SharedEndpoint>>>,
}

/// This process's endpoints by nonce, so a closing send comm can find its receiver's.
static ENDPOINTS: Mutex<Option<HashMap<u64, Weak<SharedEndpoint>>>> = Mutex::new(None);

/// A running progress thread and the flag that stops it.
struct ProgressThread {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<()>,
}

impl Drop for SharedEndpoint {
    fn drop(&mut self) {
        if let Some(map) = ENDPOINTS.lock().as_mut() {
            map.remove(&self.nonce);
        }
        if let Some(t) = self.progress_thread.get_mut().take() {
            t.stop.store(true, Ordering::Release);
            t.handle.thread().unpark();
            if t.handle.join().is_err() {
                tracing::warn!("a progress thread panicked");
            }
        }
    }
}

impl SharedEndpoint {
    /// The endpoint a new comm on `device` uses: the next of the device's lanes for `role`
    /// (opened on first use), or a new one (`NCCL_FABRIC_ENDPOINTS=comm`). Each endpoint
    /// opens its own domain unless `NCCL_FABRIC_DOMAIN_PER_ENDPOINT=no`.
    pub fn for_device(plugin: &Plugin, device: &Device, role: Role) -> Result<Arc<Self>> {
        let open = || -> Result<Arc<Self>> {
            // With GPU buffers allowed, every endpoint must answer as the probe did.
            let probe_answer = device.candidate.setopt.clone().and_then(Result::ok);
            let domain = match plugin.settings.domain_per_endpoint {
                true => device.domain.sibling()?,
                false => device.domain.clone(),
            };
            let ep = Endpoint::open(&domain, probe_answer.filter(|_| plugin.gpu))?;
            let cuda_api_answer = crate::provider::errno_name(ep.cuda_api_answer);
            let tags = Tags::new(device.domain.info.info().mem_tag_format());
            let ep = Arc::new(SharedEndpoint {
                ep: Arc::new(ep),
                tags,
                nonce: random_u64(),
                me: Identity::current(),
                next_id: AtomicU64::new(1),
                peers: Mutex::new(HashMap::new()),
                driven: AtomicBool::new(false),
                broken: Arc::default(),
                handoff: Arc::default(),
                hands_off: AtomicBool::new(false),
                progress_thread: Mutex::new(None),
                shares_memory: device.candidate.local_only(),
                parked: Mutex::new(Vec::new()),
            });
            ENDPOINTS
                .lock()
                .get_or_insert_with(HashMap::new)
                .insert(ep.nonce, Arc::downgrade(&ep));
            let mut threads = "NCCL's calls post and progress";
            if plugin.settings.progress_thread && ep.spawn_progress_thread() {
                let hand_off = plugin.settings.post_from == PostFrom::Progress;
                ep.hands_off.store(hand_off, Ordering::Release);
                threads = match hand_off {
                    true => "its progress thread posts and progresses",
                    false => "NCCL's calls post, its progress thread progresses",
                };
            }
            tracing::debug!(
                "endpoint opened on {} (setopt FI_OPT_CUDA_API_PERMITTED=false answered \
                 {cuda_api_answer}; {threads})",
                device.candidate.domain,
            );
            Ok(ep)
        };
        match plugin.sharing(device) {
            EndpointSharing::PerComm => open(),
            EndpointSharing::PerDevice | EndpointSharing::Auto => {
                let mut lanes = device.shared_endpoints.lock();
                let lanes = &mut lanes[role as usize];
                let count = plugin.settings.lanes.max(1);
                lanes.endpoints.resize_with(count, Weak::new);
                let lane = lanes.next % count;
                lanes.next = lanes.next.wrapping_add(1);
                if let Some(ep) = lanes.endpoints[lane].upgrade() {
                    return Ok(ep);
                }
                let ep = open()?;
                lanes.endpoints[lane] = Arc::downgrade(&ep);
                Ok(ep)
            }
        }
    }

    /// The fi_addr of a peer address, inserting it into the address vector the first time.
    pub fn peer(&self, addr: &[u8]) -> Result<sys::fi_addr_t> {
        let mut peers = self.peers.lock();
        if let Some(&a) = peers.get(addr) {
            return Ok(a);
        }
        let a = self.ep.insert(addr)?;
        peers.insert(addr.to_vec(), a);
        Ok(a)
    }

    /// A comm id unique on this endpoint for its lifetime.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) & self.tags.id_mask()
    }

    /// Keeps `sender` open until this endpoint is closed (see [`Comm::close`]).
    fn park(&self, sender: &Arc<SharedEndpoint>) {
        let mut parked = self.parked.lock();
        if !parked.iter().any(|p| Arc::ptr_eq(p, sender)) {
            parked.push(sender.clone());
        }
    }

    /// Progress on behalf of an NCCL call: reads completions, unless a progress thread does.
    pub fn drive(&self) -> Result<()> {
        if self.driven.load(Ordering::Relaxed) {
            return match &*self.broken.lock() {
                Some(e) => Err(Error::Remote(format!(
                    "the endpoint's completion queue failed: {e}"
                ))),
                None => Ok(()),
            };
        }
        self.progress().map(|_| ())
    }

    /// Starts a thread that posts what NCCL's calls queued and reads this endpoint's
    /// completions until the endpoint is dropped: it spins while work comes, then yields, then
    /// naps (20 µs, later 200 µs) when idle, woken early by new work. Returns whether it runs.
    fn spawn_progress_thread(&self) -> bool {
        let stop = Arc::new(AtomicBool::new(false));
        let (ep, handoff, broken, stopped) = (
            self.ep.clone(),
            self.handoff.clone(),
            self.broken.clone(),
            stop.clone(),
        );
        let started = std::thread::Builder::new()
            .name("nfab-progress".into())
            .spawn(move || {
                let mut idle = 0u32;
                while !stopped.load(Ordering::Acquire) {
                    let posted = handoff.drain(&ep);
                    match progress(&ep) {
                        Ok(0) if posted == 0 => idle = idle.saturating_add(1),
                        Ok(_) => idle = 0,
                        Err(e) => {
                            *broken.lock() = Some(e.to_string());
                            tracing::warn!("progress thread stopped: {e}");
                            return;
                        }
                    }
                    match idle {
                        0..=4_000 => std::hint::spin_loop(),
                        4_001..=40_000 => std::thread::yield_now(),
                        // About a second of 20 µs naps, then 200 µs: an endpoint idle between
                        // NCCL operations costs little CPU and wakes within a fraction of a ms.
                        40_001..=90_000 => std::thread::park_timeout(Duration::from_micros(20)),
                        _ => std::thread::park_timeout(Duration::from_micros(200)),
                    }
                }
            });
        match started {
            Ok(handle) => {
                self.handoff.set_worker(handle.thread().clone());
                *self.progress_thread.lock() = Some(ProgressThread { stop, handle });
                self.driven.store(true, Ordering::Relaxed);
                true
            }
            Err(e) => {
                tracing::warn!("no progress thread ({e}); NCCL's calls drive progress");
                false
            }
        }
    }

    /// Reads completions and records them in their ops; returns how many it read.
    pub fn progress(&self) -> Result<usize> {
        progress(&self.ep)
    }

    /// Cancels the in-flight ops among `ops` and drives progress until none is in flight or
    /// `timeout` passes. Returns whether all of them are out of the provider's hands.
    ///
    /// Ops still queued for the progress thread are withdrawn; one the thread was posting
    /// meanwhile is cancelled on a later round (cancels repeat every few milliseconds).
    pub fn retire<'a>(&self, ops: impl Iterator<Item = &'a Op> + Clone, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut next_cancel = Instant::now();
        loop {
            if Instant::now() >= next_cancel {
                self.handoff
                    .withdraw(|queued| ops.clone().any(|op| std::ptr::eq(op, queued)));
                for op in ops.clone().filter(|op| op.in_flight()) {
                    // SAFETY: op is one of ours; cancel only looks its context up.
                    unsafe { self.ep.cancel(op.context()) };
                }
                next_cancel = Instant::now() + CANCEL_INTERVAL;
            }
            if let Err(e) = self.progress() {
                tracing::warn!("while closing: {e}");
                return false;
            }
            if !ops.clone().any(Op::in_flight) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }
}

/// Reads `ep`'s completions and records them in their ops; returns how many it read. Errors
/// of the queue itself are returned; a failed operation is recorded in its op.
fn progress(ep: &Endpoint) -> Result<usize> {
    let mut total = 0;
    for _ in 0..PROGRESS_ROUNDS {
        let n = ep.poll(
            // SAFETY: every operation on our endpoints is posted with an `Op` context that
            // lives until its completion is read (see `retire`).
            |c| unsafe { Op::complete(&c) },
            // SAFETY: as above.
            |f| unsafe { Op::fail(f) },
        )?;
        total += n;
        if n < crate::endpoint::CQ_BATCH {
            break;
        }
    }
    Ok(total)
}

pub fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != 8 {
        // Fall back to time and pid: uniqueness, not secrecy, is what matters.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32);
    }
    u64::from_ne_bytes(buf)
}

/// Time limits a comm works with, from the settings.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long close waits for requests in flight (`NCCL_FABRIC_CLOSE_TIMEOUT_MS`).
    pub close: Duration,
    /// After how long an unfinished request is reported (`NCCL_FABRIC_STALL_WARN_MS`; 0 = never).
    pub stall_warn: Option<Duration>,
}

impl Limits {
    pub fn from_settings(s: &crate::settings::Settings) -> Self {
        Limits {
            close: Duration::from_millis(s.close_timeout_ms),
            stall_warn: (s.stall_warn_ms > 0).then(|| Duration::from_millis(s.stall_warn_ms)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Send,
    Recv,
}

const COMM_MAGIC: u64 = 0x4e46_4142_434f_4d4d; // "NFABCOMM"
const REQUEST_MAGIC: u64 = 0x4e46_4142_5245_5155; // "NFABREQU"

/// A request NCCL holds between isend/irecv and the `test` that reports it done.
#[repr(C)]
pub struct Request {
    /// First field: the provider's context points here.
    pub op: Op,
    magic: u64,
    comm: *const Comm,
    in_use: AtomicBool,
    /// Bytes posted (send size or receive buffer size).
    posted: AtomicUsize,
    /// When it was posted, and whether it was reported as stalled since.
    posted_at: Mutex<Instant>,
    stall_reported: AtomicBool,
}

/// The other end of a comm.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: sys::fi_addr_t,
    pub who: Identity,
    /// The nonce of the peer's endpoint where known (a send comm's receiver), else 0.
    pub endpoint: u64,
}

/// A send or receive comm (NCCL's sendComm / recvComm).
pub struct Comm {
    magic: u64,
    pub dir: Direction,
    pub ep: Arc<SharedEndpoint>,
    /// The listen id that tags this comm pair's data.
    pub data_id: u64,
    pub peer: Peer,
    /// Next sequence number; held while posting so tags follow posting order.
    post: Mutex<u64>,
    requests: Box<[Request]>,
    last_liveness_check: Mutex<Instant>,
    peer_dead: AtomicBool,
    limits: Limits,
}

// SAFETY: the raw `comm` back-pointers in `requests` point into this same heap object, which
// NCCL shares between its threads; all mutable state is atomic or locked.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    pub fn new(
        dir: Direction,
        ep: Arc<SharedEndpoint>,
        data_id: u64,
        peer: Peer,
        limits: Limits,
    ) -> Box<Self> {
        let requests = (0..REQUESTS_PER_COMM)
            .map(|_| Request {
                op: Op::default(),
                magic: REQUEST_MAGIC,
                comm: std::ptr::null(),
                in_use: AtomicBool::new(false),
                posted: AtomicUsize::new(0),
                posted_at: Mutex::new(Instant::now()),
                stall_reported: AtomicBool::new(false),
            })
            .collect();
        let mut comm = Box::new(Comm {
            magic: COMM_MAGIC,
            dir,
            ep,
            data_id,
            peer,
            post: Mutex::new(0),
            requests,
            last_liveness_check: Mutex::new(Instant::now()),
            peer_dead: AtomicBool::new(false),
            limits,
        });
        let me: *const Comm = &*comm;
        for r in comm.requests.iter_mut() {
            r.comm = me;
        }
        comm
    }

    /// Checks that a pointer NCCL gave back is one of our comms.
    ///
    /// # Safety
    /// `p` must be NULL or point to readable memory at least the size of a `u64`.
    pub unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<&'a Comm> {
        // SAFETY: the caller guarantees p is readable; the magic tells ours from anything else.
        let comm = unsafe { p.cast::<Comm>().as_ref() }
            .ok_or_else(|| Error::InvalidArgument("NULL comm".into()))?;
        if comm.magic != COMM_MAGIC {
            return Err(Error::InvalidArgument(
                "comm pointer is not a nccl-net-fabric comm".into(),
            ));
        }
        Ok(comm)
    }

    pub fn peer_text(&self) -> String {
        let side = if self.dir == Direction::Send {
            "to"
        } else {
            "from"
        };
        if self.ep.me.same_host(&self.peer.who) {
            format!("{side} pid {} on this host", self.peer.who.pid)
        } else {
            format!("{side} peer pid {} on another host", self.peer.who.pid)
        }
    }

    fn claim(&self) -> Option<&Request> {
        self.requests.iter().find(|r| {
            r.in_use
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Posts one send or receive. `Ok(None)`: no slot or the provider said EAGAIN; NCCL
    /// retries. `desc` is the memory registration's descriptor (or NULL).
    ///
    /// # Safety
    /// `buf` must be valid for `len` bytes (readable for a send, writable for a receive)
    /// until `test` reports the request done, and `desc` NULL or a descriptor of this domain.
    pub unsafe fn post(
        &self,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
    ) -> Result<Option<*mut Request>> {
        if self.peer_dead.load(Ordering::Relaxed) {
            return Err(self.dead_peer_error());
        }
        // Progress first: manual-progress providers move data only when we call in.
        self.ep.drive()?;
        let Some(req) = self.claim() else {
            return Ok(None);
        };
        let mut seq = self.post.lock();
        let tag = self.ep.tags.data(self.data_id, *seq);
        req.posted.store(len, Ordering::Relaxed);
        *req.posted_at.lock() = Instant::now();
        req.stall_reported.store(false, Ordering::Relaxed);
        if self.ep.hands_off.load(Ordering::Acquire) {
            req.op.mark_posted();
            self.ep.handoff.push(Pending {
                op: &req.op,
                kind: match self.dir {
                    Direction::Send => PendingKind::Send {
                        dest: self.peer.addr,
                    },
                    Direction::Recv => PendingKind::Recv,
                },
                buf,
                len,
                desc,
                tag,
            });
            *seq = seq.wrapping_add(1);
            return Ok(Some((req as *const Request).cast_mut()));
        }
        // SAFETY: the caller keeps `buf` valid until test() reports the request done; the
        // request's Op lives in this comm, which close() only frees once the provider has let
        // go of it.
        let posted = req.op.post(|ctx| unsafe {
            match self.dir {
                Direction::Send => self.ep.ep.tsend(buf, len, desc, self.peer.addr, tag, ctx),
                Direction::Recv => self.ep.ep.trecv(buf, len, desc, tag, ctx),
            }
        });
        match posted {
            Ok(true) => {
                *seq = seq.wrapping_add(1);
                Ok(Some((req as *const Request).cast_mut()))
            }
            Ok(false) => {
                req.in_use.store(false, Ordering::Release);
                // A peer that died with our messages unread stops taking new ones.
                if !self.check_peer() {
                    return Err(self.dead_peer_error());
                }
                Ok(None)
            }
            Err(e) => {
                req.in_use.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    fn dead_peer_error(&self) -> Error {
        Error::Remote(format!(
            "peer process {} exited ({}); the job cannot continue on this comm",
            self.peer.who.pid,
            self.peer_text()
        ))
    }

    /// For a request that waits: is a peer on this host gone? Checked at most every
    /// [`LIVENESS_INTERVAL`]; peers elsewhere are watched by the provider's own errors.
    fn check_peer(&self) -> bool {
        if !self.ep.me.same_host(&self.peer.who) {
            return true;
        }
        let mut last = self.last_liveness_check.lock();
        if last.elapsed() < LIVENESS_INTERVAL {
            return true;
        }
        *last = Instant::now();
        let gone = !crate::handshake::process_alive(self.peer.who.pid);
        if gone {
            self.peer_dead.store(true, Ordering::Relaxed);
        }
        !gone
    }

    /// Closes the comm: cancels what is in flight and frees everything once the provider has
    /// let go of it. If it does not within the close timeout, the comm is leaked, and with it
    /// its endpoint: neither its memory nor the endpoint is closed under the provider's feet.
    /// (Closing an endpoint with sends still in flight is not safe either: libfabric 2.1's
    /// shm then crashes in `smr_discard` when the receiving endpoint closes later.)
    ///
    /// A send comm whose receiver is an shm endpoint of this same process parks its endpoint
    /// on the receiver's: shm hands a receiver in the same process a pointer into the sending
    /// endpoint's memory, and libfabric 2.1 writes there when the receiver closes while it
    /// still holds messages nobody received (segfault in `smr_discard` if the sender was
    /// closed first).
    pub fn close(self: Box<Self>) {
        let ops = self.requests.iter().map(|r| &r.op);
        if self.ep.retire(ops, self.limits.close) {
            if self.dir == Direction::Send && self.ep.shares_memory && self.peer.who == self.ep.me {
                let receiver = ENDPOINTS
                    .lock()
                    .as_ref()
                    .and_then(|m| m.get(&self.peer.endpoint))
                    .and_then(Weak::upgrade);
                if let Some(receiver) = receiver {
                    receiver.park(&self.ep);
                }
            }
            drop(self);
        } else {
            tracing::warn!(
                "closing a {:?} comm {}: requests still in flight after {} ms; their memory is \
                 kept to stay safe (raise NCCL_FABRIC_CLOSE_TIMEOUT_MS if this repeats)",
                self.dir,
                self.peer_text(),
                self.limits.close.as_millis()
            );
            Box::leak(self);
        }
    }
}

impl Request {
    /// Checks a request pointer NCCL handed back.
    ///
    /// # Safety
    /// `p` must be NULL or point to readable memory of at least a `Request`'s size.
    pub unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<&'a Request> {
        // SAFETY: guaranteed readable by the caller; the magic tells ours from anything else.
        let r = unsafe { p.cast::<Request>().as_ref() }
            .ok_or_else(|| Error::InvalidArgument("NULL request".into()))?;
        if r.magic != REQUEST_MAGIC || !r.in_use.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(
                "request is not an outstanding nccl-net-fabric request".into(),
            ));
        }
        Ok(r)
    }

    /// One WARN for a request unfinished past `NCCL_FABRIC_STALL_WARN_MS`: a peer that is
    /// slow or gone, or a provider that stopped making progress.
    fn report_stall(&self, comm: &Comm) {
        let Some(limit) = comm.limits.stall_warn else {
            return;
        };
        let waited = self.posted_at.lock().elapsed();
        if waited < limit || self.stall_reported.swap(true, Ordering::Relaxed) {
            return;
        }
        let op = if comm.dir == Direction::Send {
            "send"
        } else {
            "receive"
        };
        tracing::warn!(
            "a {op} of {} bytes {} has not finished after {} ms: the peer is slow or stopped, or \
             the provider {} is not making progress (known for native tcp, ofiwg/libfabric#8963)",
            self.posted.load(Ordering::Relaxed),
            comm.peer_text(),
            waited.as_millis(),
            comm.ep.ep.domain.info.info().provider()
        );
    }

    fn comm(&self) -> &Comm {
        // SAFETY: set at comm creation to the comm that owns this request, which lives at
        // least as long as the request is in use.
        unsafe { &*self.comm }
    }

    /// `test`: `Ok(Some(bytes))` when done (the slot is then free again), `Ok(None)` if not.
    pub fn test(&self) -> Result<Option<usize>> {
        let comm = self.comm();
        if self.op.status() == Status::Posted {
            comm.ep.drive()?;
        }
        match self.op.status() {
            Status::Idle | Status::Posted => {
                self.report_stall(comm);
                if comm.peer_dead.load(Ordering::Relaxed) || !comm.check_peer() {
                    // SAFETY: the context is this request's own posted Op.
                    unsafe { comm.ep.ep.cancel(self.op.context()) };
                    self.op
                        .fail_locally(libc::ECONNRESET, "peer process exited".into());
                    return Err(comm.dead_peer_error());
                }
                Ok(None)
            }
            Status::Done(len) => {
                let n = if comm.dir == Direction::Send {
                    self.posted.load(Ordering::Relaxed)
                } else {
                    len
                };
                self.op.reset();
                self.in_use.store(false, Ordering::Release);
                Ok(Some(n))
            }
            Status::Failed => {
                let f = self.op.failure();
                let posted = self.posted.load(Ordering::Relaxed);
                let op = if comm.dir == Direction::Send {
                    "send"
                } else {
                    "receive"
                };
                Err(match f {
                    // Providers differ in the sign of `err` (shm reports -FI_ETRUNC).
                    Some(f) if f.err.unsigned_abs() == sys::FI_ETRUNC => Error::Truncated {
                        posted,
                        peer: comm.peer_text(),
                    },
                    Some(f) => Error::Completion {
                        op,
                        len: posted,
                        peer: comm.peer_text(),
                        code: f.err,
                        prov_errno: f.prov_errno,
                        text: if f.text.is_empty() {
                            crate::error::fi_strerror(f.err)
                        } else {
                            f.text
                        },
                    },
                    None => Error::Remote(format!("{op} {} failed", comm.peer_text())),
                })
            }
        }
    }
}
