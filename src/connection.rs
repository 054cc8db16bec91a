//! listen / connect / accept as state machines that never block: every call advances them
//! and returns "not yet" (`Ok(None)`) until the comm is established.
//!
//! A connect in progress is kept by the plugin, keyed by the handle's (nonce, listen id), so
//! nothing it needs lives only in NCCL's handle buffer.

use crate::comm::{Comm, Direction, Limits, Peer, Role, SharedEndpoint};
use crate::error::{Error, Result};
use crate::handshake::{Ack, Connect, Handle, MSG_SIZE};
use crate::nccl::NET_HANDLE_MAXSIZE;
use crate::op::{Op, Status};
use crate::plugin::Plugin;
use crate::tags;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

const LISTEN_MAGIC: u64 = 0x4e46_4142_4c49_5354; // "NFABLIST"

/// A control message buffer with the op that carries it.
struct Message {
    op: Op,
    /// Written only while the op is not posted; the provider reads or writes it otherwise.
    buf: Box<Mutex<[u8; MSG_SIZE]>>,
}

impl Message {
    fn new() -> Self {
        Message {
            op: Op::default(),
            buf: Box::new(Mutex::new([0; MSG_SIZE])),
        }
    }
    fn ptr(&self) -> *mut c_void {
        self.buf.data_ptr().cast()
    }
    fn post_recv(&self, ep: &SharedEndpoint, tag: u64) -> Result<bool> {
        // SAFETY: buf and op live in a heap object (listen comm or connect state) that is only
        // freed after `retire` saw the op leave the provider.
        self.op.post(|ctx| unsafe {
            ep.ep
                .trecv(self.ptr(), MSG_SIZE, std::ptr::null_mut(), tag, ctx)
        })
    }
    fn post_send(
        &self,
        ep: &SharedEndpoint,
        dest: crate::sys::fi_addr_t,
        tag: u64,
    ) -> Result<bool> {
        // SAFETY: as in post_recv.
        self.op.post(|ctx| unsafe {
            ep.ep
                .tsend(self.ptr(), MSG_SIZE, std::ptr::null_mut(), dest, tag, ctx)
        })
    }
    /// The op's outcome as a Result; `what` names it in errors.
    fn outcome(&self, what: &str) -> Result<Option<usize>> {
        match self.op.status() {
            Status::Done(n) => Ok(Some(n)),
            Status::Failed => {
                let f = self.op.failure();
                Err(Error::Remote(format!(
                    "{what} failed: {}",
                    f.map_or_else(
                        || "unknown error".into(),
                        |f| format!("{} (err {})", f.text, f.err)
                    )
                )))
            }
            _ => Ok(None),
        }
    }
}

enum AcceptState {
    /// The CONNECT receive could not be posted yet (EAGAIN).
    NeedPost,
    WaitConnect,
    SendAck {
        peer: Peer,
        sender_id: u64,
    },
    WaitAck {
        peer: Peer,
        deadline: Instant,
    },
    Done,
}

/// NCCL's listenComm: serves one accept.
pub struct ListenComm {
    magic: u64,
    ep: Arc<SharedEndpoint>,
    id: u64,
    connect: Message,
    ack: Message,
    state: Mutex<AcceptState>,
    timeout: Duration,
    limits: Limits,
}

/// `listen`: publish a handle and post the receive for the peer's CONNECT.
pub fn listen(
    plugin: &Plugin,
    dev: i32,
    handle: &mut [u8; NET_HANDLE_MAXSIZE],
) -> Result<Box<ListenComm>> {
    let device = plugin.device(dev)?;
    let ep = SharedEndpoint::for_device(plugin, device, Role::Receiving)?;
    let id = ep.next_id();
    Handle {
        listen_id: id,
        nonce: ep.nonce,
        owner: ep.me,
        addr: ep.ep.name.clone(),
    }
    .write(handle)?;
    let listen = Box::new(ListenComm {
        magic: LISTEN_MAGIC,
        ep,
        id,
        connect: Message::new(),
        ack: Message::new(),
        state: Mutex::new(AcceptState::NeedPost),
        timeout: Duration::from_millis(plugin.settings.connect_timeout_ms),
        limits: Limits::from_settings(&plugin.settings),
    });
    let posted = listen
        .connect
        .post_recv(&listen.ep, listen.ep.tags.control(id, tags::CONNECT))?;
    if posted {
        *listen.state.lock() = AcceptState::WaitConnect;
    }
    tracing::debug!("listening on device {dev}, listen id {id}");
    Ok(listen)
}

impl ListenComm {
    /// # Safety
    /// `p` must be NULL or point to readable memory of at least a `u64`.
    pub unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<&'a ListenComm> {
        // SAFETY: readable per the caller; the magic tells ours from anything else.
        let l = unsafe { p.cast::<ListenComm>().as_ref() }
            .ok_or_else(|| Error::InvalidArgument("NULL listenComm".into()))?;
        if l.magic != LISTEN_MAGIC {
            return Err(Error::InvalidArgument(
                "listenComm pointer is not a nccl-net-fabric listen comm".into(),
            ));
        }
        Ok(l)
    }

    /// `accept`: `Ok(Some(comm))` once the peer's CONNECT arrived and our ACK went out.
    pub fn accept(&self) -> Result<Option<Box<Comm>>> {
        let mut state = self.state.lock();
        self.ep.drive()?;
        loop {
            match &*state {
                AcceptState::NeedPost => {
                    if !self
                        .connect
                        .post_recv(&self.ep, self.ep.tags.control(self.id, tags::CONNECT))?
                    {
                        return Ok(None);
                    }
                    *state = AcceptState::WaitConnect;
                }
                AcceptState::WaitConnect => {
                    if self
                        .connect
                        .outcome("receiving the peer's CONNECT")?
                        .is_none()
                    {
                        return Ok(None);
                    }
                    let msg = Connect::read(&self.connect.buf.lock()[..])?;
                    if msg.nonce != self.ep.nonce {
                        return Err(Error::Remote(
                            "CONNECT names another endpoint (stale handle?)".into(),
                        ));
                    }
                    let addr = self.ep.peer(&msg.sender_addr)?;
                    Ack {
                        nonce: self.ep.nonce,
                        receiver: self.ep.me,
                    }
                    .write(&mut self.ack.buf.lock());
                    // The ACK goes to the id the sender listens on.
                    *state = AcceptState::SendAck {
                        peer: Peer {
                            addr,
                            who: msg.sender,
                            endpoint: 0,
                        },
                        sender_id: msg.sender_id,
                    };
                }
                AcceptState::SendAck { peer, sender_id } => {
                    if !self.ack.post_send(
                        &self.ep,
                        peer.addr,
                        self.ep.tags.control(*sender_id, tags::ACK),
                    )? {
                        return Ok(None);
                    }
                    *state = AcceptState::WaitAck {
                        peer: peer.clone(),
                        deadline: Instant::now() + self.timeout,
                    };
                }
                AcceptState::WaitAck { peer, deadline } => {
                    if self.ack.outcome("sending ACK to the peer")?.is_none() {
                        if Instant::now() > *deadline {
                            return Err(Error::Remote(format!(
                                "the peer (pid {}) did not take our ACK within {} ms",
                                peer.who.pid,
                                self.timeout.as_millis()
                            )));
                        }
                        return Ok(None);
                    }
                    let comm = Comm::new(
                        Direction::Recv,
                        self.ep.clone(),
                        self.id,
                        peer.clone(),
                        self.limits,
                    );
                    *state = AcceptState::Done;
                    tracing::debug!("accepted: {}", comm.peer_text());
                    return Ok(Some(comm));
                }
                AcceptState::Done => {
                    return Err(Error::InvalidArgument(
                        "accept called again on a listen comm that already accepted".into(),
                    ))
                }
            }
        }
    }

    /// `closeListen`.
    pub fn close(self: Box<Self>) {
        let ops = [&self.connect.op, &self.ack.op];
        if self.ep.retire(ops.into_iter(), self.limits.close) {
            drop(self);
        } else {
            tracing::warn!("closing a listen comm: its control messages are still in flight; keeping their memory");
            Box::leak(self);
        }
    }
}

enum ConnectState {
    NeedAckRecv,
    NeedConnectSend,
    Wait,
}

/// A connect in progress.
struct Connecting {
    ep: Arc<SharedEndpoint>,
    handle: Handle,
    listener: crate::sys::fi_addr_t,
    sender_id: u64,
    connect: Message,
    ack: Message,
    state: ConnectState,
    deadline: Instant,
}

/// Connects in progress, keyed by the handle's (nonce, listen id).
type ConnectKey = (u64, u64);
static CONNECTING: LazyLock<Mutex<HashMap<ConnectKey, Box<Connecting>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// `connect`: `Ok(Some(comm))` once the listener acknowledged; `Ok(None)`: call again.
pub fn connect(
    plugin: &Plugin,
    dev: i32,
    raw: &[u8; NET_HANDLE_MAXSIZE],
) -> Result<Option<Box<Comm>>> {
    let handle = Handle::read(raw)?;
    let key = (handle.nonce, handle.listen_id);
    let mut map = CONNECTING.lock();
    if let std::collections::hash_map::Entry::Vacant(slot) = map.entry(key) {
        let device = plugin.device(dev)?;
        let ep = SharedEndpoint::for_device(plugin, device, Role::Sending)?;
        let listener = ep.peer(&handle.addr).map_err(|e| {
            Error::InvalidArgument(format!(
                "the handle's address was rejected by {}: {e}",
                device.candidate.provider
            ))
        })?;
        let sender_id = ep.next_id();
        let c = Connecting {
            connect: Message::new(),
            ack: Message::new(),
            state: ConnectState::NeedAckRecv,
            deadline: Instant::now() + Duration::from_millis(plugin.settings.connect_timeout_ms),
            handle,
            listener,
            sender_id,
            ep,
        };
        Connect {
            nonce: c.handle.nonce,
            sender_id,
            sender: c.ep.me,
            sender_addr: c.ep.ep.name.clone(),
        }
        .write(&mut c.connect.buf.lock());
        slot.insert(Box::new(c));
    }
    let c = map.get_mut(&key).expect("inserted above");
    let result = advance(c, plugin);
    match result {
        Ok(None) => Ok(None),
        Ok(Some(comm)) => {
            map.remove(&key);
            Ok(Some(comm))
        }
        Err(e) => {
            let c = map.remove(&key).expect("present");
            drop(map);
            let timeout = Duration::from_millis(plugin.settings.close_timeout_ms);
            if !c.ep.retire([&c.connect.op, &c.ack.op].into_iter(), timeout) {
                // Still in the provider's hands: keep the memory and the endpoint.
                Box::leak(c);
            }
            Err(e)
        }
    }
}

fn advance(c: &mut Connecting, plugin: &Plugin) -> Result<Option<Box<Comm>>> {
    c.ep.drive()?;
    let gone = |c: &Connecting| {
        if Instant::now() > c.deadline {
            return Some(Error::Remote(format!(
                "the listener (pid {}) did not answer within {} ms: it exited, closed its listen \
                 comm, or the handle is stale (raise NCCL_FABRIC_CONNECT_TIMEOUT_MS if peers are \
                 just slow)",
                c.handle.owner.pid, plugin.settings.connect_timeout_ms
            )));
        }
        if c.ep.me.same_host(&c.handle.owner)
            && !crate::handshake::process_alive(c.handle.owner.pid)
        {
            return Some(Error::Remote(format!(
                "the listener process {} exited",
                c.handle.owner.pid
            )));
        }
        None
    };
    loop {
        match c.state {
            ConnectState::NeedAckRecv => {
                if !c
                    .ack
                    .post_recv(&c.ep, c.ep.tags.control(c.sender_id, tags::ACK))?
                {
                    return gone(c).map_or(Ok(None), Err);
                }
                c.state = ConnectState::NeedConnectSend;
            }
            ConnectState::NeedConnectSend => {
                if !c.connect.post_send(
                    &c.ep,
                    c.listener,
                    c.ep.tags.control(c.handle.listen_id, tags::CONNECT),
                )? {
                    return gone(c).map_or(Ok(None), Err);
                }
                c.state = ConnectState::Wait;
            }
            ConnectState::Wait => {
                let sent = c.connect.outcome("sending CONNECT to the listener")?;
                let acked = c.ack.outcome("receiving the listener's ACK")?;
                if sent.is_none() || acked.is_none() {
                    return gone(c).map_or(Ok(None), Err);
                }
                let ack = Ack::read(&c.ack.buf.lock()[..])?;
                if ack.nonce != c.handle.nonce {
                    return Err(Error::Remote(
                        "ACK from another endpoint than the handle names".into(),
                    ));
                }
                let peer = Peer {
                    addr: c.listener,
                    who: ack.receiver,
                    endpoint: c.handle.nonce,
                };
                let comm = Comm::new(
                    Direction::Send,
                    c.ep.clone(),
                    c.handle.listen_id,
                    peer,
                    Limits::from_settings(&plugin.settings),
                );
                tracing::debug!("connected: {}", comm.peer_text());
                return Ok(Some(comm));
            }
        }
    }
}
