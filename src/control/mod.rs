//! The control plane: per device, one small endpoint of this process that carries the
//! handshake (CONNECT, ACK, NACK) and liveness probes (PING, PONG), all driven by one
//! process-wide thread, which also finishes the endpoints of retired lanes that the provider
//! still held operations on.
//!
//! NCCL's calls never wait for it: listen/connect/accept hand it messages to send and look
//! at slots it fills ([`ListenSlot`], [`ConnectSlot`]); a comm's `test` asks it to probe a
//! peer ([`Peer::watch`]). Handshakes between two ranks of this same process are delivered
//! directly, without libfabric. The thread naps 20 ms when idle and polls every 20 µs while
//! a handshake is under way (connect and accept hurry it along).
//!
//! Liveness: a request that has waited `NCCL_FABRIC_PEER_TIMEOUT_MS`/4 makes its comm probe
//! the peer process's control endpoint, and again every quarter timeout while it keeps
//! waiting; the peer's control thread answers whatever NCCL is doing. A peer that leaves
//! probes unanswered for the whole timeout, or whose probe the provider fails, is dead: the
//! comm's requests fail with `ncclRemoteError`. Nothing depends on pids or on peers sharing a
//! host.

use crate::address::Shape;
use crate::driver::{Driver, Health, Inbox, Post, Transfer};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::fabric::Domain;
use crate::handshake::{Identity, Kind, Message, Record, MSG_SIZE};
use crate::op::{Op, Status};
use crate::sys;
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

mod station;
mod thread;

use station::Station;
pub use thread::{adopt, flush, hurry, later, Chore};
use thread::{mailbox, Job};

/// The tag of every control message (control endpoints carry nothing else).
pub const CONTROL_TAG: u64 = 0x4e46;
/// Receives kept posted on each control endpoint.
const RECEIVES: usize = 16;
/// Answers (NACK, PONG) in flight at most per control endpoint.
const MAX_REPLIES: usize = 8;
/// Peer addresses a control endpoint keeps in its address vector at most.
const MAX_PEERS: usize = 4096;
/// At most one WARN about dropped control messages per this long.
const WARN_EVERY: Duration = Duration::from_secs(30);
/// How long connect/accept keep the thread polling fast after their last call.
const HURRY_MS: u64 = 200;
/// A retired endpoint's sinks are cancelled once they took nothing in for this long.
const SINKS_QUIET: Duration = Duration::from_millis(200);
/// How long finalize lets retired endpoints finish before closing them regardless.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Milliseconds on a monotonic clock (since the first call; never 0).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// How peers are watched (`NCCL_FABRIC_PEER_TIMEOUT_MS`).
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub timeout: Duration,
}

impl Liveness {
    /// How long a request waits before its peer is probed, and between probes.
    pub fn probe_after(&self) -> Duration {
        (self.timeout / 4).max(Duration::from_millis(50))
    }
}

// ---------------------------------------------------------------------------------------
// Peers

/// Liveness of one peer process (its control endpoint on this device), shared by every
/// comm with it.
pub struct Peer {
    pub address: Vec<u8>,
    token: u64,
    /// In this process: always alive, never probed.
    local: bool,
    /// When the oldest unanswered probe went out (ms, 0: none).
    probing_since: AtomicU64,
    last_probe: AtomicU64,
    /// The unanswered probe (its `probing_since`) for which the peer's address was checked
    /// for a refusal (0: none).
    refusal_checked: AtomicU64,
    dead: OnceLock<String>,
    control: Weak<Control>,
    liveness: Liveness,
}

impl Peer {
    /// A peer in this process.
    pub fn local() -> Arc<Peer> {
        Arc::new(Peer {
            address: Vec::new(),
            token: 0,
            local: true,
            probing_since: AtomicU64::new(0),
            last_probe: AtomicU64::new(0),
            refusal_checked: AtomicU64::new(0),
            dead: OnceLock::new(),
            control: Weak::new(),
            liveness: Liveness {
                timeout: Duration::MAX,
            },
        })
    }

    /// How long it may leave probes unanswered (`NCCL_FABRIC_PEER_TIMEOUT_MS`; forever for a
    /// peer in this process).
    pub fn timeout(&self) -> Duration {
        self.liveness.timeout
    }

    /// Why the peer is known dead, if it is.
    pub fn dead(&self) -> Option<&str> {
        self.dead.get().map(String::as_str)
    }

    /// For a request that has waited `waited`: probes the peer when it is time (at once when
    /// `urgent`: the endpoint just reported an error of its own), and says whether it is dead.
    pub fn watch(
        self: &Arc<Self>,
        waited: Duration,
        urgent: bool,
    ) -> std::result::Result<(), String> {
        if self.local {
            return Ok(());
        }
        if let Some(why) = self.dead() {
            return Err(why.to_string());
        }
        let every = self.liveness.probe_after();
        if waited < every && !urgent {
            return Ok(());
        }
        let now = now_ms();
        let since = self.probing_since.load(Ordering::Acquire);
        if since != 0 {
            let silent = now.saturating_sub(since);
            if silent > self.liveness.timeout.as_millis() as u64 {
                self.lost(format!(
                    "the peer did not answer liveness probes for {silent} ms (its process \
                     exited, or its host is unreachable; NCCL_FABRIC_PEER_TIMEOUT_MS={} sets \
                     how long to wait)",
                    self.liveness.timeout.as_millis()
                ));
                return Err(self.dead().unwrap_or_default().to_string());
            }
            // A probe unanswered for a quarter timeout: once, whether the peer's host refuses
            // connections to its control endpoint (over TCP, a process that exited leaves its
            // kernel refusing them), which tells at once what the timeout would tell later.
            if silent >= every.as_millis() as u64
                && self.refusal_checked.swap(since, Ordering::AcqRel) != since
            {
                let refusal = self
                    .control
                    .upgrade()
                    .and_then(|c| crate::quirks::refused(&c.provider, &self.address));
                if let Some(refusal) = refusal {
                    self.lost(format!(
                        "the peer did not answer a liveness probe for {silent} ms and its \
                         address refuses connections ({refusal}): its process exited"
                    ));
                    return Err(self.dead().unwrap_or_default().to_string());
                }
            }
        }
        // At most one probe per quarter timeout, answered or not: a peer that answers at once
        // while a request keeps waiting (a slow rank) is asked again a quarter timeout later,
        // not at the next `test`.
        let last = self.last_probe.load(Ordering::Acquire);
        let due = last == 0 || now.saturating_sub(last) >= every.as_millis() as u64;
        if due
            && self
                .last_probe
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // The oldest unanswered probe, unless one is out already.
            let _ =
                self.probing_since
                    .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
            self.probe();
        }
        Ok(())
    }

    fn probe(self: &Arc<Self>) {
        let Some(control) = self.control.upgrade() else {
            return;
        };
        let ping = Record {
            kind: Kind::Ping,
            a: self.token,
            b: 0,
            who: control.me,
            fields: vec![control.address.clone()],
        };
        tracing::trace!(
            "liveness probe to {}",
            crate::fabric::address_text(&self.address)
        );
        control.send(&self.address, ping, Purpose::Ping(self.clone()));
    }

    fn answered(&self) {
        self.probing_since.store(0, Ordering::Release);
    }

    fn lost(&self, why: String) {
        if self.dead.set(why).is_ok() {
            tracing::debug!(
                "peer control endpoint {} declared dead: {}",
                crate::fabric::address_text(&self.address),
                self.dead().unwrap_or_default()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Handshake slots

/// A CONNECT that reached a listen comm (its addresses checked).
pub struct Incoming {
    pub conn: u64,
    pub who: Identity,
    /// The connector's control endpoint (empty for a connect from this process).
    pub reply_to: Vec<u8>,
    /// The connector's sending endpoint.
    pub data: Vec<u8>,
    /// The piece size the connector offers (see `handshake::agreed_piece`).
    pub piece: u64,
    /// The addresses of the connector's further sending flows (see `comm`: pieces spread
    /// over them).
    pub flows: Vec<Vec<u8>>,
    /// Set for a connect from this same process.
    pub local: Option<LocalConnect>,
}

/// What a connect from this process hands the listener directly.
pub struct LocalConnect {
    pub reply: Arc<ConnectSlot>,
    /// The sending lane's endpoint.
    pub sender: Weak<Endpoint>,
}

/// Where a listen comm's CONNECT arrives.
#[derive(Default)]
pub struct ListenSlot {
    incoming: Mutex<Option<Incoming>>,
    used: AtomicBool,
}

impl ListenSlot {
    /// Takes the CONNECT, once.
    pub fn take(&self) -> Option<Incoming> {
        self.incoming.lock().take()
    }

    fn offer(&self, i: Incoming) -> std::result::Result<(), &'static str> {
        if self.used.swap(true, Ordering::AcqRel) {
            return Err("the listen comm already has its peer");
        }
        *self.incoming.lock() = Some(i);
        Ok(())
    }
}

/// The listener's answer to a connect.
pub enum Answer {
    Ack {
        /// The receiving comm's id, process and endpoint address (checked).
        id: u64,
        who: Identity,
        data: Vec<u8>,
        /// The piece size both ends use.
        piece: u64,
        /// The listener's further receiving flows: comm id and address of each.
        flows: Vec<(u64, Vec<u8>)>,
        /// For a listener in this process: its receiving lane's endpoint.
        receiver: Option<Weak<Endpoint>>,
    },
    Refused(String),
}

/// Where a connect's answer arrives.
#[derive(Default)]
pub struct ConnectSlot {
    answer: Mutex<Option<Answer>>,
}

impl ConnectSlot {
    pub fn take(&self) -> Option<Answer> {
        self.answer.lock().take()
    }
    pub fn answer(&self, a: Answer) {
        let mut slot = self.answer.lock();
        if slot.is_none() {
            *slot = Some(a);
        }
    }
}

/// The outcome of sending one message (an ACK).
#[derive(Default)]
pub struct Sent {
    outcome: Mutex<Option<std::result::Result<(), String>>>,
}

impl Sent {
    /// A message handed over directly (to a rank of this process).
    pub fn delivered() -> Arc<Sent> {
        let s = Sent::default();
        s.set(Ok(()));
        Arc::new(s)
    }
    pub fn outcome(&self) -> Option<std::result::Result<(), String>> {
        self.outcome.lock().clone()
    }
    fn set(&self, r: std::result::Result<(), String>) {
        *self.outcome.lock() = Some(r);
    }
}

/// What a sent message is for: who hears how it went.
enum Purpose {
    Connect { conn: u64, slot: Arc<ConnectSlot> },
    Ack(Arc<Sent>),
    Ping(Arc<Peer>),
    Reply,
}

// ---------------------------------------------------------------------------------------
// A device's control endpoint, as NCCL's threads see it

/// One device's control endpoint of this process.
pub struct Control {
    /// Random: tells this process's own handles apart.
    pub nonce: u64,
    pub address: Vec<u8>,
    pub provider: String,
    /// What peer addresses must look like on this provider.
    pub shape: Shape,
    /// What the data endpoints' addresses in CONNECT and ACK must look like (`shape` where
    /// the control endpoint lives on the data domain).
    pub data_shape: Shape,
    pub me: Identity,
    liveness: Liveness,
    listeners: Mutex<HashMap<u64, Arc<ListenSlot>>>,
    connects: Mutex<HashMap<u64, Arc<ConnectSlot>>>,
    peers: Mutex<HashMap<Vec<u8>, Weak<Peer>>>,
}

impl Control {
    /// Opens the control endpoint on `domain` and hands it to the control thread; the data
    /// endpoints it introduces have addresses of `data_shape` (`None`: of this domain).
    pub fn open(
        domain: &Arc<Domain>,
        expected_answer: Option<i32>,
        liveness: Liveness,
        label: &str,
        data_shape: Option<Shape>,
    ) -> Result<Arc<Control>> {
        let (endpoint, queue) = Endpoint::open(domain, expected_answer)?;
        let inbox = Arc::new(Inbox::default());
        let driver = Driver::new(
            queue,
            inbox.clone(),
            Arc::new(Health::default()),
            format!("{} control endpoint on {label}", endpoint.provider),
        );
        let control = Arc::new(Control {
            nonce: crate::random::u64(),
            address: endpoint.name.clone(),
            provider: endpoint.provider.clone(),
            shape: endpoint.shape.clone(),
            data_shape: data_shape.unwrap_or_else(|| endpoint.shape.clone()),
            me: Identity::current(),
            liveness,
            listeners: Mutex::new(HashMap::new()),
            connects: Mutex::new(HashMap::new()),
            peers: Mutex::new(HashMap::new()),
        });
        tracing::debug!(
            "control endpoint opened on {label} ({})",
            crate::fabric::address_text(&control.address)
        );
        mailbox().push(Job::Attach(Box::new(Station::new(
            control.clone(),
            driver,
            inbox,
        ))));
        Ok(control)
    }

    /// Refuses a peer address this control endpoint must not be given (wrong shape, or an
    /// endpoint of this process that is closed).
    pub fn check_peer(&self, addr: &[u8]) -> Result<()> {
        crate::endpoint::check_peer_address(&self.shape, &self.provider, addr)
    }

    /// A slot for the CONNECT of listen `token`.
    pub fn listen(&self, token: u64) -> Arc<ListenSlot> {
        let slot = Arc::new(ListenSlot::default());
        self.listeners.lock().insert(token, slot.clone());
        slot
    }

    pub fn unlisten(&self, token: u64) {
        self.listeners.lock().remove(&token);
    }

    /// Delivers a CONNECT from this process to listen `token` of this process.
    pub fn connect_locally(
        &self,
        token: u64,
        incoming: Incoming,
    ) -> std::result::Result<(), String> {
        let slot = self.listeners.lock().get(&token).cloned();
        match slot {
            Some(s) => s.offer(incoming).map_err(str::to_string),
            None => Err("no listen comm of this process has that handle (closed, or stale)".into()),
        }
    }

    /// Sends a CONNECT to `to`; the answer arrives in `slot`.
    pub fn send_connect(self: &Arc<Self>, to: &[u8], connect: Record, slot: Arc<ConnectSlot>) {
        let conn = connect.b;
        self.connects.lock().insert(conn, slot.clone());
        self.send(to, connect, Purpose::Connect { conn, slot });
    }

    /// Stops waiting for the answer to connect `conn`.
    pub fn forget_connect(&self, conn: u64) {
        self.connects.lock().remove(&conn);
    }

    /// Sends an ACK (or any answer) to `to`; how it went arrives in the returned slot.
    pub fn send_answer(self: &Arc<Self>, to: &[u8], answer: Record) -> Arc<Sent> {
        let sent = Arc::new(Sent::default());
        self.send(to, answer, Purpose::Ack(sent.clone()));
        sent
    }

    /// The liveness record of the peer process whose control endpoint is `address`.
    pub fn peer(self: &Arc<Self>, address: &[u8]) -> Arc<Peer> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(address).and_then(Weak::upgrade) {
            return p;
        }
        peers.retain(|_, p| p.strong_count() > 0);
        let p = Arc::new(Peer {
            address: address.to_vec(),
            token: crate::random::u64(),
            local: false,
            probing_since: AtomicU64::new(0),
            last_probe: AtomicU64::new(0),
            refusal_checked: AtomicU64::new(0),
            dead: OnceLock::new(),
            control: Arc::downgrade(self),
            liveness: self.liveness,
        });
        peers.insert(address.to_vec(), Arc::downgrade(&p));
        p
    }

    fn send(self: &Arc<Self>, to: &[u8], record: Record, purpose: Purpose) {
        mailbox().push(Job::Send {
            control: self.clone(),
            to: to.to_vec(),
            record,
            purpose,
        });
    }
}
