//! listen / connect / accept as state machines that never block: every call advances them
//! and returns "not yet" (`Ok(None)`) until the comm is established.
//!
//! ```text
//! listen : a random token registered on the device's control endpoint; the handle names both
//! connect: [open sending lanes] → CONNECT to the handle's control endpoint → wait for ACK
//! accept : wait for CONNECT → [open receiving lanes] → ACK → wait until the ACK went out
//! ```
//! Lanes not open yet open on a thread of their own (`LanePool::prepare`), from `listen` on,
//! while the calls answer "not yet", so that no call waits for endpoints to set up their
//! buffers.
//! A comm that sends long messages in pieces has several flows (see `comm`): its own lane
//! and the device's lanes after it, each its own connection to the peer. The CONNECT names
//! the sender's further lanes, the ACK as many of the receiver's (with the comm id each
//! chose), and the sender lets go of those the receiver did not match.
//! A connect in progress lives in the device's table, keyed by the handle, so nothing it needs
//! lives only in NCCL's handle buffer; one NCCL stops calling for is reclaimed. Between two
//! ranks of this process the messages are handed over directly. No lock shared between
//! connects is held while libfabric is called.

use crate::comm::{Comm, CommId, Direction, PeerInfo, Terms, Wire};
use crate::control::{self, Answer, Control, Incoming, ListenSlot, LocalConnect, Peer, Sent};
use crate::device::{ConnectEntry, Connecting, Device};
use crate::error::{Error, Result};
use crate::handshake::{
    agreed_piece, flows_field, piece_field, Handle, Kind, Record, MAX_FURTHER_FLOWS, MIN_PIECE,
};
use crate::lane::{Lane, Opening, Role};
use crate::nccl::NET_HANDLE_MAXSIZE;
use crate::plugin::Plugin;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a CONNECT waits for its answer before the listener's address is checked.
const REFUSAL_CHECK_AFTER: Duration = Duration::from_secs(1);
/// How long after NCCL's last call a connect in progress is reclaimed, beyond its timeout.
const ABANDONED_AFTER: Duration = Duration::from_secs(2);

enum AcceptState {
    WaitConnect,
    /// The CONNECT came; the receiving lanes its comm takes are being opened.
    WaitLanes {
        incoming: Box<Incoming>,
        opening: Arc<Opening>,
    },
    /// The ACK is on its way to a peer in another process.
    WaitAckSent {
        comm: Arc<Comm>,
        sent: Arc<Sent>,
        deadline: Instant,
    },
    Done,
}

/// NCCL's listenComm: serves one accept.
pub struct ListenComm {
    device: usize,
    control: Arc<Control>,
    token: u64,
    slot: Arc<ListenSlot>,
    state: Mutex<AcceptState>,
    timeout: Duration,
}

impl crate::opaque::Kind for ListenComm {
    const MAGIC: u64 = 0x4e46_4142_4c49_5332; // "NFABLIS2"
    const NAME: &'static str = "listenComm";
}

/// `listen`: publish a handle naming the device's control endpoint and a fresh token.
pub fn listen(
    plugin: &Plugin,
    dev: i32,
    handle: &mut [u8; NET_HANDLE_MAXSIZE],
) -> Result<ListenComm> {
    let device = plugin.device(dev)?;
    let control = device.control()?;
    let token = crate::random::u64();
    Handle {
        token,
        nonce: control.nonce,
        owner: control.me,
        addr: control.address.clone(),
    }
    .write(handle)?;
    let slot = control.listen(token);
    // An accept follows, and under NCCL a connect of this rank too: their lanes start
    // opening now, while the handle travels to the peer.
    let wanted = flows_wanted(device, device.piece);
    for role in [Role::Receiving, Role::Sending] {
        device.lanes.prepare(role, wanted);
    }
    tracing::debug!("listening on device {dev}, token {token:#x}");
    Ok(ListenComm {
        device: device.index,
        control,
        token,
        slot,
        state: Mutex::new(AcceptState::WaitConnect),
        timeout: Duration::from_millis(plugin.settings.connect_timeout_ms),
    })
}

/// How many flows a comm of `device` asks for: its own lane, and those its pieces may
/// spread over when it sends in pieces at all (pieces of `piece` bytes, offered or agreed).
fn flows_wanted(device: &Device, piece: u64) -> usize {
    match piece < MIN_PIECE {
        true => 1,
        false => device.flows.min(1 + MAX_FURTHER_FLOWS),
    }
}

/// The piece size a comm accepted for `incoming` takes (both ends' offers agreed), and how
/// many flows it asks for: no more than the connector offered.
fn accepted_terms(device: &Device, incoming: &Incoming) -> (u64, usize) {
    let piece = agreed_piece(device.piece, incoming.piece);
    (
        piece,
        flows_wanted(device, piece).min(1 + incoming.flows.len()),
    )
}

/// The further flows of `lanes` as a record field: their addresses, each with the comm id
/// this end chose there (`ids`) or 0. Lanes whose names do not fit the field are let go.
fn further(lanes: &mut Vec<Arc<Lane>>, ids: &[u64]) -> Vec<u8> {
    let flows: Vec<(u64, Vec<u8>)> = lanes[1..]
        .iter()
        .enumerate()
        .map(|(k, l)| (ids.get(k).copied().unwrap_or(0), l.endpoint.name.clone()))
        .collect();
    let (field, taken) = flows_field(&flows);
    lanes.drain(1 + taken..).for_each(|l| l.release_user());
    field
}

/// One flow a comm is to have: the lane, the peer's endpoint address there, the comm id.
type FlowPlan = (Arc<Lane>, Vec<u8>, CommId);

/// Makes a comm on `flows` (its own lane first), giving every lane's user back if that
/// fails.
fn comm_on(
    dev: usize,
    dir: Direction,
    flows: Vec<FlowPlan>,
    who: crate::handshake::Identity,
    liveness: Arc<Peer>,
    piece: u64,
    plugin: &Plugin,
) -> Result<Arc<Comm>> {
    let mut made = Vec::with_capacity(flows.len());
    let mut plans = flows.into_iter();
    for (lane, addr, id) in plans.by_ref() {
        // A receiving flow needs its peer's address only to match receives by their source.
        // Where receives match by tag alone it is never inserted: inserting it is, for ucx,
        // connecting to the peer's sending endpoint while that endpoint connects to this one,
        // and UCX 1.13's TCP transport can lose such a pair of connections for good (the
        // first message then never arrives).
        let peer = match (dir, lane.endpoint.directed) {
            (Direction::Recv, false) => Ok(crate::sys::ADDR_UNSPEC),
            _ => lane.peer(&addr),
        };
        match peer {
            Ok(a) => made.push(Wire::new(lane, a, id)),
            Err(e) => {
                lane.release_user();
                made.iter().for_each(|w: &Wire| w.lane.release_user());
                plans.for_each(|(l, ..)| l.release_user());
                return Err(e);
            }
        }
    }
    let stall = plugin.settings.stall_warn_ms;
    Ok(Comm::new(
        dir,
        dev,
        made,
        PeerInfo { who, liveness },
        Terms {
            stall_warn: (stall > 0).then(|| Duration::from_millis(stall)),
            max_recvs: plugin.settings.max_recvs as usize,
            piece: piece as usize,
            adapt: plugin.settings.pieces_auto,
        },
    ))
}

impl ListenComm {
    /// `accept`: `Ok(Some(comm))` once the peer's CONNECT arrived and our ACK went out.
    pub fn accept(&self, plugin: &Plugin) -> Result<Option<Arc<Comm>>> {
        control::hurry();
        let mut state = self.state.lock();
        loop {
            match &*state {
                AcceptState::WaitConnect => {
                    let Some(incoming) = self.slot.take() else {
                        return Ok(None);
                    };
                    let device: &Device = &plugin.devices[self.device];
                    let (_, wanted) = accepted_terms(device, &incoming);
                    *state = match device.lanes.prepare(Role::Receiving, wanted) {
                        Some(opening) => AcceptState::WaitLanes {
                            incoming: Box::new(incoming),
                            opening,
                        },
                        None => self.answered(plugin, incoming)?,
                    };
                }
                AcceptState::WaitLanes { opening, .. } if !opening.done() => return Ok(None),
                AcceptState::WaitLanes { .. } => {
                    if let AcceptState::WaitLanes { incoming, .. } =
                        std::mem::replace(&mut *state, AcceptState::Done)
                    {
                        *state = self.answered(plugin, *incoming)?;
                    }
                }
                AcceptState::WaitAckSent {
                    comm,
                    sent,
                    deadline,
                } => match sent.outcome() {
                    None if Instant::now() < *deadline => return Ok(None),
                    outcome => {
                        let comm = comm.clone();
                        *state = AcceptState::Done;
                        let why = match outcome {
                            Some(Ok(())) => {
                                tracing::debug!(
                                    "accepted: {}; {}",
                                    comm.peer_text(),
                                    comm.pieces_text()
                                );
                                return Ok(Some(comm));
                            }
                            Some(Err(e)) => format!("sending the ACK failed: {e}"),
                            None => format!(
                                "the ACK was not delivered within {} ms",
                                self.timeout.as_millis()
                            ),
                        };
                        comm.close();
                        return Err(Error::Remote(why));
                    }
                },
                AcceptState::Done => {
                    return Err(Error::InvalidArgument(
                        "accept called again on a listen comm that already accepted".into(),
                    ))
                }
            }
        }
    }

    /// What an accept waits for once it has answered `incoming` (see [`ListenComm::answer`]).
    fn answered(&self, plugin: &Plugin, incoming: Incoming) -> Result<AcceptState> {
        let (comm, sent) = self.answer(plugin, incoming)?;
        Ok(AcceptState::WaitAckSent {
            comm,
            sent,
            deadline: Instant::now() + self.timeout,
        })
    }

    /// Makes the receive comm for a CONNECT and sends the ACK: directly to a connect of this
    /// process (then the returned `Sent` is already done), else through the control thread.
    /// If that fails, the connector is told so (NACK) rather than left to time out.
    fn answer(&self, plugin: &Plugin, incoming: Incoming) -> Result<(Arc<Comm>, Arc<Sent>)> {
        let conn = incoming.conn;
        let reply_to = incoming.reply_to.clone();
        let local_reply = incoming.local.as_ref().map(|l| l.reply.clone());
        self.build(plugin, incoming)
            .inspect_err(|e| match &local_reply {
                Some(reply) => reply.answer(Answer::Refused(e.to_string())),
                None if !reply_to.is_empty() => {
                    let nack = Record {
                        kind: Kind::Nack,
                        a: conn,
                        b: 0,
                        who: self.control.me,
                        fields: vec![e.to_string().into_bytes().into_iter().take(120).collect()],
                    };
                    self.control.send_answer(&reply_to, nack);
                }
                None => {}
            })
    }

    fn build(&self, plugin: &Plugin, incoming: Incoming) -> Result<(Arc<Comm>, Arc<Sent>)> {
        if let Some(l) = &incoming.local {
            if l.sender.strong_count() == 0 {
                return Err(Error::Remote(
                    "the connect (from this process) gave up before this accept: its \
                     NCCL_FABRIC_CONNECT_TIMEOUT_MS passed"
                        .into(),
                ));
            }
        }
        let device: &Device = &plugin.devices[self.device];
        let (piece, wanted) = accepted_terms(device, &incoming);
        let mut lanes = device.lanes.acquire_flows(Role::Receiving, wanted)?;
        let leases: Vec<_> = lanes.iter().map(|l| l.lease_id()).collect();
        let ids: Vec<u64> = leases.iter().map(|l| l.id).collect();
        let flows = further(&mut lanes, &ids[1..]);
        let liveness = match incoming.local {
            Some(_) => Peer::local(),
            None => self.control.peer(&incoming.reply_to),
        };
        let receiver = Arc::downgrade(&lanes[0].endpoint);
        let name = lanes[0].endpoint.name.clone();
        let id = ids[0];
        let further_flows: Vec<(u64, Vec<u8>)> = (lanes[1..].iter())
            .zip(&ids[1..])
            .map(|(l, &id)| (id, l.endpoint.name.clone()))
            .collect();
        let peers = std::iter::once(incoming.data.clone()).chain(incoming.flows.iter().cloned());
        let plans = lanes
            .into_iter()
            .zip(peers)
            .zip(leases)
            .map(|((lane, addr), lease)| (lane, addr, CommId::Leased(lease)))
            .collect();
        let comm = comm_on(
            device.index,
            Direction::Recv,
            plans,
            incoming.who,
            liveness,
            piece,
            plugin,
        )?;
        let sent = match incoming.local {
            Some(LocalConnect { reply, .. }) => {
                reply.answer(Answer::Ack {
                    id,
                    who: self.control.me,
                    data: name,
                    piece,
                    flows: further_flows,
                    receiver: Some(receiver),
                });
                Sent::delivered()
            }
            None => {
                let ack = Record {
                    kind: Kind::Ack,
                    a: incoming.conn,
                    b: id,
                    who: self.control.me,
                    fields: vec![name, piece_field(piece), flows],
                };
                self.control.send_answer(&incoming.reply_to, ack)
            }
        };
        Ok((comm, sent))
    }

    /// `closeListen`.
    pub fn close(self) {
        self.control.unlisten(self.token);
        // An accept whose ACK was still on its way made a comm NCCL never got: it closes
        // here, giving its lanes back.
        if let AcceptState::WaitAckSent { comm, .. } =
            std::mem::replace(&mut *self.state.lock(), AcceptState::Done)
        {
            comm.close();
        }
    }
}

/// `connect`: `Ok(Some(comm))` once the listener acknowledged; `Ok(None)`: call again.
pub fn connect(
    plugin: &Plugin,
    dev: i32,
    raw: &[u8; NET_HANDLE_MAXSIZE],
) -> Result<Option<Arc<Comm>>> {
    let handle = Handle::read(raw)?;
    let device = plugin.device(dev)?;
    device.control()?.check_peer(&handle.addr).map_err(|e| {
        Error::InvalidArgument(format!(
            "connection handle: {e} (a handle from another plugin, or damaged on its way)"
        ))
    })?;
    control::hurry();
    let timeout = Duration::from_millis(plugin.settings.connect_timeout_ms);
    device.reclaim_connects(timeout + ABANDONED_AFTER);
    let key = (handle.token, handle.nonce);
    let entry = device
        .connects
        .lock()
        .entry(key)
        .or_insert_with(|| {
            Arc::new(ConnectEntry {
                state: Mutex::new(Connecting {
                    handle,
                    conn: crate::random::u64(),
                    lanes: Vec::new(),
                    opening: None,
                    control: None,
                    slot: Arc::default(),
                    sent: None,
                    checked: false,
                }),
                last_call: Mutex::new(Instant::now()),
            })
        })
        .clone();
    *entry.last_call.lock() = Instant::now();
    let result = advance(&mut entry.state.lock(), device, plugin);
    if !matches!(result, Ok(None)) {
        let mut connects = device.connects.lock();
        if connects.get(&key).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
            connects.remove(&key);
        }
    }
    result
}

fn advance(c: &mut Connecting, device: &Device, plugin: &Plugin) -> Result<Option<Arc<Comm>>> {
    let timeout = Duration::from_millis(plugin.settings.connect_timeout_ms);
    if c.sent.is_some_and(|t| t.elapsed() > timeout) {
        return Err(Error::Remote(format!(
            "the listener ({}) did not answer within {} ms: it exited, closed its listen comm, \
             or the handle is stale (raise NCCL_FABRIC_CONNECT_TIMEOUT_MS if peers are just \
             slow)",
            crate::handshake::Identity::current().describe(&c.handle.owner),
            plugin.settings.connect_timeout_ms
        )));
    }
    // Step 1: sending lanes, opened off this call where they are not open yet.
    let offered = device.piece;
    if c.lanes.is_empty() {
        let wanted = flows_wanted(device, offered);
        if c.opening.is_none() {
            c.opening = device.lanes.prepare(Role::Sending, wanted);
        }
        if c.opening.as_ref().is_some_and(|o| !o.done()) {
            return Ok(None);
        }
        c.lanes = device.lanes.acquire_flows(Role::Sending, wanted)?;
    }
    let lane = c.lanes[0].clone();
    let control = match &c.control {
        Some(k) => k.clone(),
        None => {
            let k = device.control()?;
            c.control = Some(k.clone());
            k
        }
    };
    let local = c.handle.nonce == control.nonce;
    // Step 2: CONNECT.
    if c.sent.is_none() {
        c.sent = Some(Instant::now());
        if local {
            let incoming = Incoming {
                conn: c.conn,
                who: control.me,
                reply_to: Vec::new(),
                data: lane.endpoint.name.clone(),
                piece: offered,
                flows: c.lanes[1..]
                    .iter()
                    .map(|l| l.endpoint.name.clone())
                    .collect(),
                local: Some(LocalConnect {
                    reply: c.slot.clone(),
                    sender: Arc::downgrade(&lane.endpoint),
                }),
            };
            control
                .connect_locally(c.handle.token, incoming)
                .map_err(Error::Remote)?;
        } else {
            let flows = further(&mut c.lanes, &[]);
            let connect = Record {
                kind: Kind::Connect,
                a: c.handle.token,
                b: c.conn,
                who: control.me,
                fields: vec![
                    control.address.clone(),
                    lane.endpoint.name.clone(),
                    piece_field(offered),
                    flows,
                ],
            };
            control.send_connect(&c.handle.addr, connect, c.slot.clone());
        }
    }
    // Step 3: the answer. None of the providers reports a refused connection (rxm and tcp
    // retry, shm waits for the name to appear): one that has not answered for a while is
    // checked once.
    let (id, who, data_addr, piece, flows, receiver) = match c.slot.take() {
        None if !local
            && !c.checked
            && c.sent.is_some_and(|t| t.elapsed() >= REFUSAL_CHECK_AFTER) =>
        {
            c.checked = true;
            match crate::quirks::refused(&control.provider, &c.handle.addr) {
                Some(why) => {
                    return Err(Error::Remote(format!(
                        "the listener's control endpoint {} cannot be reached: {why} (it \
                         exited, or the handle is stale)",
                        crate::fabric::address_text(&c.handle.addr)
                    )))
                }
                None => return Ok(None),
            }
        }
        None => return Ok(None),
        Some(Answer::Refused(why)) => {
            return Err(Error::Remote(format!("connecting failed: {why}")));
        }
        Some(Answer::Ack {
            id,
            who,
            data,
            piece,
            flows,
            receiver,
        }) => (id, who, data, piece, flows, receiver),
    };
    if let Some(r) = receiver {
        if crate::quirks::sender_waits_for_receiver(&lane.endpoint.provider) {
            lane.close_after(r);
        }
    }
    let liveness = match local {
        true => Peer::local(),
        false => control.peer(&c.handle.addr),
    };
    let mut lanes = std::mem::take(&mut c.lanes);
    let offered_flows = lanes.len() - 1;
    // The listener agreed it, from the offer above: never more than this end offers.
    let piece = agreed_piece(offered, piece);
    if flows.len() >= lanes.len() || (piece == 0 && !flows.is_empty()) {
        lanes.into_iter().for_each(|l| l.release_user());
        return Err(Error::Remote(format!(
            "the listener answered with {} further flows for a comm that offered {}{}: not \
             this plugin, or not in step with it",
            flows.len(),
            offered_flows,
            if piece == 0 {
                " and whole messages"
            } else {
                ""
            }
        )));
    }
    // Lanes the listener did not match go back.
    lanes
        .drain(1 + flows.len()..)
        .for_each(|l| l.release_user());
    let peers = std::iter::once((id, data_addr)).chain(flows);
    let plans = lanes
        .into_iter()
        .zip(peers)
        .map(|(lane, (id, addr))| (lane, addr, CommId::Peer(id)))
        .collect();
    let comm = comm_on(
        device.index,
        Direction::Send,
        plans,
        who,
        liveness,
        piece,
        plugin,
    )?;
    tracing::debug!("connected: {}; {}", comm.peer_text(), comm.pieces_text());
    Ok(Some(comm))
}
