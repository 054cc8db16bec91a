//! A stranger: a process speaking raw libfabric to the plugin's endpoints, with no plugin in
//! between (tagged messages of its own making, remote writes with made-up keys). Everything
//! it does has a deadline.
#![allow(dead_code)]

use nccl_net_fabric::fabric::{runtime_version, Domain, Fabric, Hints, InfoList};
use nccl_net_fabric::sys;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Stranger {
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    ctx: Box<sys::fi_context2>,
    /// A receive of any tag from anyone, once [`Stranger::listen_any`] posted it.
    inbound: Option<Inbound>,
    /// Messages that receive took in, oldest first.
    arrived: std::collections::VecDeque<Vec<u8>>,
    /// A completion of the main operation that [`Stranger::poke`] read.
    main_done: Option<Outcome>,
    /// The provider's tag format (for the plugin's tag layout).
    pub mem_tag_format: u64,
    _domain: Arc<Domain>,
}

struct Inbound {
    buf: Vec<u8>,
    ctx: Box<sys::fi_context2>,
}

/// What a completion said.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done(usize),
    Failed(i32),
    TimedOut,
}

impl Stranger {
    /// An endpoint of `provider` on its domain `domain` (e.g. `lo`, `shm`).
    pub fn open(provider: &str, domain: &str) -> Stranger {
        Self::open_with(provider, domain, 0)
    }

    /// As [`Stranger::open`], asking for the capabilities `extra` too.
    pub fn open_with(provider: &str, domain: &str, extra: u64) -> Stranger {
        // rxm refuses connections between different eager limits: speak as the job's ranks
        // do (the plugin's defaults).
        nccl_net_fabric::quirks::apply_defaults();
        let hints = Hints {
            caps: (sys::FI_TAGGED | sys::FI_MSG | sys::FI_RMA) as u64
                | (sys::FI_WRITE | sys::FI_REMOTE_WRITE) as u64
                | extra,
            mode: sys::FI_CONTEXT | sys::FI_CONTEXT2,
            mr_mode: nccl_net_fabric::discover::MR_MODE,
            ep_type: sys::FI_EP_RDM,
            threading: sys::FI_THREAD_SAFE,
            provider: Some(provider.to_string()),
        };
        let list = InfoList::get(runtime_version(), &hints).expect("fi_getinfo");
        let info = list
            .iter()
            .find(|i| i.provider() == provider && i.domain() == domain)
            .unwrap_or_else(|| panic!("no {provider} entry on {domain} with FI_RMA"));
        let fabric = Fabric::open(info).expect("fi_fabric");
        let domain = Domain::open(&fabric, info).expect("fi_domain");
        Self::on(domain)
    }

    /// Another endpoint on this stranger's domain.
    pub fn sibling(&self) -> Stranger {
        Self::on(self._domain.clone())
    }

    fn on(domain: Arc<Domain>) -> Stranger {
        let mut s = Stranger {
            ep: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            ctx: Box::default(),
            inbound: None,
            arrived: Default::default(),
            main_done: None,
            mem_tag_format: domain.info.info().mem_tag_format(),
            _domain: domain.clone(),
        };
        // SAFETY: plain libfabric set-up on objects this struct owns; attribute structs live
        // on the stack during the calls.
        unsafe {
            let mut cq_attr = sys::fi_cq_attr {
                size: 256,
                format: sys::FI_CQ_FORMAT_TAGGED,
                wait_obj: sys::FI_WAIT_NONE,
                ..Default::default()
            };
            assert_eq!(
                sys::fi_cq_open(domain.raw(), &mut cq_attr, &mut s.cq, ptr::null_mut()),
                0
            );
            let mut av_attr = sys::fi_av_attr {
                type_: sys::FI_AV_TABLE,
                ..Default::default()
            };
            assert_eq!(
                sys::fi_av_open(domain.raw(), &mut av_attr, &mut s.av, ptr::null_mut()),
                0
            );
            let info = domain.info.info();
            assert_eq!(
                sys::fi_endpoint(
                    domain.raw(),
                    info.raw().cast_mut(),
                    &mut s.ep,
                    ptr::null_mut()
                ),
                0
            );
            let flags = (sys::FI_TRANSMIT | sys::FI_RECV) as u64;
            assert_eq!(sys::fi_ep_bind(s.ep, s.cq.cast(), flags), 0);
            assert_eq!(sys::fi_ep_bind(s.ep, s.av.cast(), 0), 0);
            assert_eq!(sys::fi_enable(s.ep), 0);
        }
        s
    }

    /// This endpoint's address.
    pub fn name(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: ep is open; buf has len bytes.
        let r =
            unsafe { sys::fi_getname(&raw mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len) };
        assert_eq!(r, 0, "fi_getname");
        buf.truncate(len);
        buf
    }

    pub fn insert(&self, addr: &[u8]) -> sys::fi_addr_t {
        let mut out = 0;
        // SAFETY: av is open; addr holds one address of the provider's format.
        let n = unsafe {
            sys::fi_av_insert(
                self.av,
                addr.as_ptr().cast(),
                1,
                &mut out,
                0,
                ptr::null_mut(),
            )
        };
        assert_eq!(n, 1, "fi_av_insert");
        out
    }

    fn ctx(&mut self) -> *mut c_void {
        (&mut *self.ctx as *mut sys::fi_context2).cast()
    }

    /// Waits for this stranger's one operation in flight (messages the standing receive
    /// takes in meanwhile are kept for [`Stranger::next_message`]).
    fn wait(&mut self, timeout: Duration) -> Outcome {
        let until = Instant::now() + timeout;
        let mine = self.ctx();
        loop {
            if let Some(o) = self.main_done.take() {
                return o;
            }
            let mut e = sys::fi_cq_tagged_entry::default();
            // SAFETY: cq is open; e has room for one tagged entry.
            let n = unsafe {
                sys::fi_cq_read(self.cq, (&mut e as *mut sys::fi_cq_tagged_entry).cast(), 1)
            };
            if n == 1 {
                if e.op_context == mine {
                    return Outcome::Done(e.len);
                }
                self.took_in(e.len);
                continue;
            }
            if n == -(sys::FI_EAVAIL as isize) {
                let mut err = sys::fi_cq_err_entry::default();
                // SAFETY: cq is open and has an error entry.
                unsafe { sys::fi_cq_readerr(self.cq, &mut err, 0) };
                if err.op_context == mine {
                    return Outcome::Failed(err.err);
                }
                self.repost();
                continue;
            }
            if Instant::now() > until {
                return Outcome::TimedOut;
            }
            std::thread::yield_now();
        }
    }

    /// Keeps a receive of any tag from anyone posted from now on (64 KiB).
    pub fn listen_any(&mut self) {
        self.inbound = Some(Inbound {
            buf: vec![0; 65536],
            ctx: Box::default(),
        });
        self.repost();
    }

    fn repost(&mut self) {
        let Some(i) = self.inbound.as_mut() else {
            return;
        };
        let ctx: *mut c_void = (&mut *i.ctx as *mut sys::fi_context2).cast();
        let (buf, len) = (i.buf.as_mut_ptr(), i.buf.len());
        loop {
            // SAFETY: the buffer and context live in self until Drop closes the endpoint.
            let r = unsafe {
                sys::fi_trecv(
                    self.ep,
                    buf.cast(),
                    len,
                    ptr::null_mut(),
                    sys::ADDR_UNSPEC,
                    0,
                    u64::MAX,
                    ctx,
                )
            };
            if r != -(sys::FI_EAGAIN as isize) {
                assert_eq!(r, 0, "fi_trecv");
                return;
            }
            self.poke();
        }
    }

    fn took_in(&mut self, len: usize) {
        if let Some(i) = &self.inbound {
            self.arrived
                .push_back(i.buf[..len.min(i.buf.len())].to_vec());
        }
        self.repost();
    }

    /// The next message the standing receive took in, waiting up to `timeout`.
    pub fn next_message(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(m) = self.arrived.pop_front() {
                return Some(m);
            }
            if Instant::now() > until {
                return None;
            }
            self.poke();
        }
    }

    /// Posts with `post` (given the context), again while the provider says EAGAIN, then
    /// waits for the completion.
    fn post_and_wait(
        &mut self,
        timeout: Duration,
        mut post: impl FnMut(*mut sys::fid_ep, *mut c_void) -> isize,
    ) -> Outcome {
        let until = Instant::now() + timeout;
        loop {
            let ctx = self.ctx();
            let r = post(self.ep, ctx);
            if r == 0 {
                return self.wait(until.saturating_duration_since(Instant::now()));
            }
            if r != -(sys::FI_EAGAIN as isize) || Instant::now() > until {
                return Outcome::Failed(r as i32);
            }
            self.poke();
        }
    }

    /// Sends `bytes` with `tag` to `dest` and waits for the send to complete.
    pub fn send(
        &mut self,
        dest: sys::fi_addr_t,
        tag: u64,
        bytes: &[u8],
        timeout: Duration,
    ) -> Outcome {
        self.post_and_wait(timeout, |ep, ctx| {
            // SAFETY: bytes outlive the wait; ctx is ours.
            unsafe {
                sys::fi_tsend(
                    ep,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    ptr::null_mut(),
                    dest,
                    tag,
                    ctx,
                )
            }
        })
    }

    /// Receives one message with `tag` (any source) into a buffer of `len` bytes.
    pub fn recv(&mut self, tag: u64, len: usize, timeout: Duration) -> Option<Vec<u8>> {
        self.recv_from(sys::ADDR_UNSPEC, tag, len, timeout)
    }

    /// Receives one message with `tag` from `src` into a buffer of `len` bytes.
    pub fn recv_from(
        &mut self,
        src: sys::fi_addr_t,
        tag: u64,
        len: usize,
        timeout: Duration,
    ) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let ctx = self.ctx();
        // SAFETY: buf lives until the wait below returns or the endpoint is closed (Drop;
        // a receive left posted at a timeout is cancelled by closing).
        let r = unsafe {
            sys::fi_trecv(
                self.ep,
                buf.as_mut_ptr().cast(),
                len,
                ptr::null_mut(),
                src,
                tag,
                0,
                ctx,
            )
        };
        assert_eq!(r, 0, "fi_trecv");
        match self.wait(timeout) {
            Outcome::Done(n) => {
                buf.truncate(n);
                Some(buf)
            }
            _ => {
                std::mem::forget(buf);
                None
            }
        }
    }

    /// A remote write of `bytes` to address 0 with a key nobody registered.
    pub fn write(
        &mut self,
        dest: sys::fi_addr_t,
        key: u64,
        bytes: &[u8],
        timeout: Duration,
    ) -> Outcome {
        self.post_and_wait(timeout, |ep, ctx| {
            // SAFETY: bytes outlive the wait; ctx is ours.
            unsafe {
                sys::fi_write(
                    ep,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    ptr::null_mut(),
                    dest,
                    0,
                    key,
                    ctx,
                )
            }
        })
    }

    /// Drives progress once (keeping what the standing receive takes in).
    pub fn poke(&mut self) {
        let mut e = sys::fi_cq_tagged_entry::default();
        // SAFETY: cq is open.
        let n =
            unsafe { sys::fi_cq_read(self.cq, (&mut e as *mut sys::fi_cq_tagged_entry).cast(), 1) };
        let mine = self.ctx();
        if n == 1 && e.op_context == mine {
            self.main_done = Some(Outcome::Done(e.len));
        } else if n == 1 {
            self.took_in(e.len);
        } else if n == -(sys::FI_EAVAIL as isize) {
            let mut err = sys::fi_cq_err_entry::default();
            // SAFETY: cq is open and has an error entry.
            unsafe { sys::fi_cq_readerr(self.cq, &mut err, 0) };
            if err.op_context == mine {
                self.main_done = Some(Outcome::Failed(err.err));
            } else {
                self.repost();
            }
        }
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        // SAFETY: closing what open created, endpoint first.
        unsafe {
            sys::fi_close(&raw mut (*self.ep).fid);
            sys::fi_close(&raw mut (*self.cq).fid);
            sys::fi_close(&raw mut (*self.av).fid);
        }
    }
}
