//! A control endpoint on the control thread: its station keeps receives posted, answers
//! CONNECTs and probes, and sends what NCCL's threads handed it, each message a [`Msg`]
//! whose [`Purpose`] hears how it went.

use super::*;

/// A buffer for one control message with the operation that carries it.
struct Msg {
    op: Op,
    /// Bytes sent (the record's length); a receive takes up to [`MSG_SIZE`].
    len: usize,
    buf: UnsafeCell<Box<[u8; MSG_SIZE]>>,
}

// SAFETY: the buffer is written only while the op is idle, by the control thread, and read
// only after its completion, by the same thread; the provider touches it in between.
unsafe impl Send for Msg {}
// SAFETY: as above.
unsafe impl Sync for Msg {}

impl Msg {
    fn new(len: usize) -> Arc<Msg> {
        Arc::new(Msg {
            op: Op::default(),
            len: len.min(MSG_SIZE),
            buf: UnsafeCell::new(Box::new([0; MSG_SIZE])),
        })
    }

    /// The buffer the provider reads or fills.
    fn bytes(&self) -> *mut u8 {
        // SAFETY: the box is never replaced; only its contents change hands (see the Send
        // impl above).
        unsafe { (*self.buf.get()).as_mut_ptr() }
    }

    /// Hands the message to its endpoint's driver: a send to `dest`, or a receive.
    fn hand_to(self: &Arc<Self>, inbox: &Inbox, dest: Option<sys::fi_addr_t>) {
        let (buf, len, desc, tag) = (
            self.bytes().cast(),
            self.len,
            std::ptr::null_mut(),
            CONTROL_TAG,
        );
        let transfer = match dest {
            Some(dest) => Transfer::Send {
                buf,
                len,
                desc,
                dest,
                tag,
            },
            // Any tag: whatever reaches a control endpoint is taken in (and dropped if it is
            // not a control message), so nothing waits inside the provider unmatched.
            None => Transfer::Recv {
                buf,
                len,
                desc,
                src: sys::ADDR_UNSPEC,
                tag,
                ignore: u64::MAX,
                overflow: true,
            },
        };
        self.op.mark_queued();
        inbox.push(crate::driver::Command::Post(Post {
            op: &self.op,
            owner: self.clone(),
            transfer,
        }));
    }
}

impl crate::driver::Owned for Msg {}

impl Purpose {
    pub(super) fn failed(self, why: String) {
        match self {
            Purpose::Connect { slot, .. } => slot.answer(Answer::Refused(why)),
            Purpose::Ack(sent) => sent.set(Err(why)),
            Purpose::Ping(peer) => peer.lost(format!("the liveness probe failed: {why}")),
            Purpose::Reply => {}
        }
    }
    pub(super) fn succeeded(self) {
        if let Purpose::Ack(sent) = self {
            sent.set(Ok(()));
        }
    }
}

/// One control endpoint, on the control thread.
pub(super) struct Station {
    pub(super) control: Arc<Control>,
    driver: Driver,
    inbox: Arc<Inbox>,
    recvs: Vec<Arc<Msg>>,
    sends: Vec<(Arc<Msg>, Purpose)>,
    addrs: HashMap<Vec<u8>, sys::fi_addr_t>,
    probes: HashMap<u64, Weak<Peer>>,
    bad_warn: crate::log::Throttle,
}

impl Station {
    pub(super) fn new(control: Arc<Control>, driver: Driver, inbox: Arc<Inbox>) -> Station {
        let mut s = Station {
            control,
            driver,
            inbox,
            recvs: (0..RECEIVES).map(|_| Msg::new(MSG_SIZE)).collect(),
            sends: Vec::new(),
            addrs: HashMap::new(),
            probes: HashMap::new(),
            bad_warn: crate::log::Throttle::new(WARN_EVERY),
        };
        for i in 0..RECEIVES {
            s.post_recv(i);
        }
        s
    }

    fn post_recv(&mut self, i: usize) {
        self.recvs[i].hand_to(&self.inbox, None);
    }

    /// One round; returns whether anything is still under way.
    pub(super) fn turn(&mut self) -> bool {
        if self.driver.turn().is_err() {
            // The queue failed (logged by the driver): fail what waits on it.
            for (_, p) in self.sends.drain(..) {
                p.failed("the control endpoint's completion queue failed".into());
            }
            return false;
        }
        let mut took_in = false;
        for i in 0..self.recvs.len() {
            match self.recvs[i].op.status() {
                Status::Done(n) => {
                    took_in = true;
                    // SAFETY: the receive completed; the provider no longer touches it.
                    let whole: &[u8; MSG_SIZE] = unsafe { &*self.recvs[i].buf.get() };
                    let bytes = whole[..n.min(MSG_SIZE)].to_vec();
                    self.recvs[i].op.reset();
                    self.handle(&bytes);
                    self.post_recv(i);
                }
                Status::Failed => {
                    took_in = true;
                    let why = self.recvs[i]
                        .op
                        .failure()
                        .map(|f| format!("{} (err {})", f.text, f.err))
                        .unwrap_or_else(|| "failed".into());
                    self.recvs[i].op.reset();
                    self.note_bad(&format!("a receive failed: {why}"));
                    self.post_recv(i);
                }
                _ => {}
            }
        }
        let mut i = 0;
        while i < self.sends.len() {
            let status = self.sends[i].0.op.status();
            if status.finished() {
                let (msg, purpose) = self.sends.swap_remove(i);
                match status {
                    Status::Done(_) => purpose.succeeded(),
                    _ => purpose.failed(
                        msg.op
                            .failure()
                            .map(|f| format!("{} (err {})", f.text, f.err))
                            .unwrap_or_else(|| "failed".into()),
                    ),
                }
            } else {
                i += 1;
            }
        }
        self.probes.retain(|_, p| p.strong_count() > 0);
        if took_in {
            // Messages come in bursts (a handshake, a larger message in several steps):
            // poll fast for a while.
            hurry();
        }
        !self.sends.is_empty()
            || self
                .probes
                .values()
                .filter_map(Weak::upgrade)
                .any(|p| p.probing_since.load(Ordering::Acquire) != 0 && p.dead().is_none())
    }

    /// A message that is not ours, or not for anything here: dropped, and said in one WARN
    /// at most every [`WARN_EVERY`].
    fn note_bad(&mut self, what: &str) {
        if let Some(held) = self.bad_warn.allow() {
            tracing::warn!(
                "control endpoint {} dropped a message: {what}{}. Another program, or a \
                 rank of an earlier job, is sending to this process: if this repeats, restrict \
                 the interfaces with NCCL_FABRIC_DOMAINS (see docs/faults.md, Security model)",
                crate::fabric::address_text(&self.control.address),
                match held {
                    0 => String::new(),
                    n => format!(" ({n} more dropped since the last warning)"),
                }
            );
        }
    }

    /// A message arrived.
    fn handle(&mut self, bytes: &[u8]) {
        let m = match Message::parse(bytes, &self.control.shape, &self.control.data_shape) {
            Ok(m) => m,
            Err(e) => return self.note_bad(&e.to_string()),
        };
        let control = self.control.clone();
        match m {
            Message::Connect {
                token,
                conn,
                who,
                reply_to,
                data,
                piece,
                flows,
            } => {
                let slot = control.listeners.lock().get(&token).cloned();
                let offered = match slot {
                    Some(s) => s.offer(Incoming {
                        conn,
                        who,
                        reply_to: reply_to.clone(),
                        data,
                        piece,
                        flows: flows.into_iter().map(|(_, addr)| addr).collect(),
                        local: None,
                    }),
                    None => Err("no listen comm has that handle (closed, or stale)"),
                };
                if let Err(why) = offered {
                    self.note_bad(&format!(
                        "a CONNECT from {}: {why}",
                        control.me.describe(&who)
                    ));
                    let nack = Record {
                        kind: Kind::Nack,
                        a: conn,
                        b: 0,
                        who: control.me,
                        fields: vec![why.as_bytes().to_vec()],
                    };
                    self.reply(&reply_to, &nack);
                }
            }
            Message::Ack {
                conn,
                id,
                who,
                data,
                piece,
                flows,
            } => match control.connects.lock().remove(&conn) {
                Some(s) => s.answer(Answer::Ack {
                    id,
                    who,
                    data,
                    piece,
                    flows,
                    receiver: None,
                }),
                None => self.note_bad("an ACK for no connect in progress (stale, or forged)"),
            },
            Message::Nack { conn, why } => match control.connects.lock().remove(&conn) {
                Some(s) => s.answer(Answer::Refused(format!("the listener refused: {why}"))),
                None => self.note_bad("a NACK for no connect in progress (stale, or forged)"),
            },
            Message::Ping { token, reply_to } => {
                let pong = Record {
                    kind: Kind::Pong,
                    a: token,
                    b: 0,
                    who: control.me,
                    fields: Vec::new(),
                };
                self.reply(&reply_to, &pong);
            }
            Message::Pong { token } => {
                if let Some(p) = self.probes.get(&token).and_then(Weak::upgrade) {
                    p.answered();
                }
            }
        }
    }

    /// Answers a message (NACK, PONG), unless [`MAX_REPLIES`] answers are already on their
    /// way or the address would be one too many: a flood makes no unbounded work.
    fn reply(&mut self, to: &[u8], record: &Record) {
        let replying = self
            .sends
            .iter()
            .filter(|(_, p)| matches!(p, Purpose::Reply))
            .count();
        if replying >= MAX_REPLIES
            || (self.addrs.len() >= MAX_PEERS && !self.addrs.contains_key(to))
        {
            return self.note_bad("no answer sent: too many answers under way");
        }
        self.send(to, record, Purpose::Reply);
    }

    fn address(&mut self, to: &[u8]) -> Result<sys::fi_addr_t> {
        if let Some(&a) = self.addrs.get(to) {
            return Ok(a);
        }
        if to == self.control.address.as_slice() {
            return Err(Error::InvalidArgument(
                "a control message addressed to this very endpoint".into(),
            ));
        }
        let a = self.driver.endpoint().insert(to)?;
        self.addrs.insert(to.to_vec(), a);
        Ok(a)
    }

    pub(super) fn send(&mut self, to: &[u8], record: &Record, purpose: Purpose) {
        let dest = match self.address(to) {
            Ok(a) => a,
            Err(e) => {
                if let Purpose::Connect { conn, .. } = &purpose {
                    self.control.forget_connect(*conn);
                }
                return purpose.failed(e.to_string());
            }
        };
        let msg = Msg::new(record.encoded_len());
        // SAFETY: the message is new; nobody else sees its buffer yet.
        if let Err(e) = record.write(unsafe { &mut (**msg.buf.get())[..msg.len] }) {
            return purpose.failed(e.to_string());
        }
        if let Purpose::Ping(p) = &purpose {
            self.probes.insert(p.token, Arc::downgrade(p));
        }
        msg.hand_to(&self.inbox, Some(dest));
        self.sends.push((msg, purpose));
    }
}
