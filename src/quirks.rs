//! What the plugin knows about particular providers, in one place: each item names the
//! provider and libfabric versions it was seen with, and what the plugin does about it.
//!
//! - **shm names**: shm names an endpoint's shared-memory file after its source address
//!   (`fi_shm://<pid>` plus uid and a counter). A file left in /dev/shm by a process that died
//!   keeps that name; when a later process gets the same pid, `fi_enable` fails with EBUSY.
//!   Endpoints get a random part per process in their name ([`shm_source_name`]).
//! - **Sends to this process's own dead shm names**: libfabric 2.1 shm spins forever in
//!   `fi_tsend` (`smr_verify_peer`, `pthread_spin_lock`) when sending to an address of this
//!   process that no open endpoint has any more. Addresses naming this process are only
//!   accepted for endpoints that are open ([`names_this_process`]).
//! - **Endpoints that were never enabled** crash `fi_close` (1.17 `tcp;ofi_rxm`, 2.1 `sm2`):
//!   such an endpoint is left open ([`close_unenabled_endpoints`]).
//! - **Same-process shm senders**: a receiving shm endpoint that holds messages nobody
//!   received from a sender of the same process writes into the sender's memory when it
//!   closes (libfabric 2.1, segfault in `smr_discard` if the sender was closed first), so a
//!   sending endpoint whose receiver lives in this process stays open until the receiver
//!   has closed ([`sender_waits_for_receiver`]).
//! - **Truncation**: a message larger than its receive hangs shm (1.17: inside `fi_cq_read`;
//!   2.1: `cma_copy` loops forever) and crashes 2.1 `tcp;ofi_rxm` later in `fi_close`
//!   (`rxm_close_conn`). Receives therefore carry an overflow area after NCCL's buffer, so the
//!   provider never truncates and the plugin reports the sizes itself (see `overflow`).
//! - **rxm's teardown**: `rxm_close_conn` (releases 1.14 to 2.6.0; fixed on libfabric's main
//!   by 697688386) closes a connection's endpoint, then drains the completions still queued
//!   for it; a receive completion drained then posts a new receive on the endpoint it came
//!   from, the closed one, and the process dies of SIGSEGV (a call through a null pointer in
//!   `rxm_post_recv`). A peer that disconnects with its messages still queued does it: a
//!   stranger that relayed the handshake and left crashed the victim's progress thread 3
//!   times in 116 runs (2.1), and once in CI. With rxm's shared receive context, rxm's own
//!   choice over tcp, receives are posted to that context, which stays open, so the plugin
//!   no longer turns it off ([`RXM_DEFAULTS`]). A rendezvous read that such a drain starts on
//!   the closed endpoint is not covered; docs/limitations.md says so.
//! - **Native tcp** RDM hangs under NCCL (ofiwg/libfabric#8963): refused unless allowed
//!   ([`native_tcp_refusal`]). With progress threads that sleep on its wait objects, on
//!   capped connections, 2.1 also left pieces with the provider for good in 2 of 8 runs (none
//!   of 6 with threads that never slept, none with NCCL's calls driving); not yet explained.
//! - **rxm's write rendezvous** (`FI_OFI_RXM_USE_RNDV_WRITE=1`) writes long messages at the
//!   start of the receive's registration, not into NCCL's receive: refused
//!   ([`rxm_write_refusal`]).
//! - **Connections taken only inside a turn**: rxm (seen with 2.1) accepts a peer's CONNECT, and
//!   tcp reads what arrived, only while the receiving endpoint is progressed. An endpoint
//!   that NCCL's calls drive and that has nothing posted left the peer's first sends
//!   waiting (256 sends of 512 B before any receive stalled in `isend` in 3 of 60 runs on a
//!   loaded 2-core machine), so the control thread turns such an endpoint every 250 ms
//!   (`Lane::nudge`).
//! - **Refused connections go unreported**: a CONNECT to a port nobody listens on is retried
//!   by rxm and tcp, and shm waits for a name that never appears; none fails the send. A
//!   connect that has waited a second checks the address itself ([`refused`]).
//! - **rxm's and tcp's buffer pools**: with their defaults each `tcp;ofi_rxm` endpoint holds
//!   ~90 MB (1.17) to ~170 MB (2.1) of anonymous memory, most of it the shared receive
//!   context's preposted buffers; a 2-GPU all_reduce peaked at 4.0 GiB. Unless the user set
//!   them, the plugin sets shallower queues before libfabric starts ([`RXM_DEFAULTS`]):
//!   1.5 GiB, busbw within 3% ([`apply_defaults`]). Its eager buffers are 33 KiB, so that the
//!   pieces of capped connections go eagerly: an endpoint holds 60.2 MiB (2.1; 12.0 with
//!   4 KiB buffers).
//! - **shm's full queues**: shm answers a post with `-FI_ENOMEM` when its receive (or send)
//!   queue has no free entry (reported with libfabric 1.17, receives posted beside a stream
//!   while pairs open and close on shared endpoints; not reproduced on the test machines).
//!   That is back-pressure, not a fault: the post is
//!   tried again, as for `-FI_EAGAIN`, until the queue has stayed full for
//!   [`FULL_FOR_TOO_LONG`] ([`enomem_means_full`]).
//! - **Stale sources after a reconnect**: libfabric 1.17 `tcp;ofi_rxm` keeps the messages of
//!   a sender that disconnected, reuses the freed connection for the next peer, and reports
//!   that peer as their source: a stranger that relayed a handshake, sent with the comm's tags
//!   and left can have a directed receive return its bytes, and the source check cannot see
//!   it (reproduced with raw libfabric; 2.1 is not affected). Said in `doctor` and docs/faults.md's
//!   security model ([`stale_source_after_reconnect`]).
//! - **Shared shm endpoints progressing at once**: with libfabric 1.17 shm, endpoints of one
//!   device shared by several comms (`NCCL_FABRIC_ENDPOINTS=device`), each driven by its own
//!   thread, lose a segmented (SAR) transfer now and then when comms close with transfers in
//!   flight beside a streaming comm: the stream's send and its receive never finish (5 of 8
//!   runs of the churn-beside-a-stream test). With the device's endpoints taking turns, 0 of
//!   20. Their drivers therefore take turns there ([`serial_progress`]). Without progress
//!   threads (NCCL's calls drive) 2 of 16 runs still stall; the default for shm, an endpoint
//!   per comm, showed neither (0 of 8). 2.1 is not affected; the versions between were not
//!   tried.
//! - **Sources rxd does not report**: `ofi_rxd` (libfabric 1.17 and 2.1) offers `FI_SOURCE`
//!   but writes its completions without a source, so `fi_cq_readfrom` gives fi_addr 0 for
//!   every message, and a receive checking its source dropped each real message as a
//!   stranger's ("dropped a message of 0 bytes from … fi_addr 0x0"; the first message never
//!   arrived). rxd matches directed receives by their source itself, so its completions'
//!   sources are not read ([`source_unreported`]).
//! - **rxd's send window against a UDP socket's buffer**: `ofi_rxd` sends up to 128 packets
//!   of up to 4 KiB to a peer before it waits for an acknowledgement (`FI_OFI_RXD_MAX_UNACKED`),
//!   512 KiB, more than a UDP socket buffers by default (208 KiB, `net.core.rmem_default`). A
//!   receiver a little behind drops the rest; rxd resends after 1, 2, 4 … ms up to 4 s, so on
//!   busy CPUs a piece stood still for more than 4 s or a liveness probe went unanswered for
//!   3 s, and a live peer was declared lost (`conform` over `udp;ofi_rxd` on loopback, 2 busy
//!   cores: libfabric 1.17 9 of 64 runs, 2.1 4 of 12; CI once). With 32 packets (128 KiB) in
//!   flight, 0 of 20 (1.17) and 0 of 12 (2.1), at the same bandwidth or more
//!   ([`RXD_DEFAULTS`]).
//! - **No link speed**: shm and sm2 report none; NCCL then opens 2 channels at the 100 Gb/s it
//!   assumes. They are announced at 400 Gb/s so NCCL opens 4 and 4 endpoints copy at once
//!   (all_reduce busbw at 1 GiB: 9.3 → 14.5 GB/s on a 32-core machine) ([`unreported_speed_mbps`]).
//! - **Truncation unseen**: a message longer than NCCL's buffer, taken by the buffer and the
//!   overflow area after it, is now and then reported complete with the buffer's length, so
//!   the plugin cannot see the truncation: libfabric 2.1 native tcp once (a 16584-byte message
//!   into 1000 bytes, CI under load), and 1.17 `tcp;ofi_rxm` and shm driven by progress
//!   threads in about one run of the piece test in eight on 2 busy cores (16484 bytes into
//!   8192, 16584 into 1000), also when the receive was posted before the message was sent;
//!   2.1 `tcp;ofi_rxm` driven by progress threads once in many runs (16484 bytes into 8192,
//!   whole messages, CI on 2 cores).
//!   NCCL never sends more than its receive takes, so its jobs are not affected; the piece
//!   test leaves its truncations out there.
//! - **Pieces over rxm 1.17**: with pieces, in one of four full test runs, libfabric 1.17
//!   `net;ofi_rxm` crashed inside libfabric (the race below) and a `tcp;ofi_rxm` rank of the
//!   piece test was lost. rxm gets pieces from libfabric 2.1 on, which passed all its runs
//!   ([`pieces_pay`]).
//! - **Domains opening under progress**: libfabric 1.17 `net` progresses every domain of a
//!   fabric whenever any endpoint's EQ is read (`xnet_eq_read`, `xnet_progress_all`; rxm
//!   reads its EQ in each `fi_cq_read`), and a new domain joins its fabric's list
//!   (`ofi_domain_init`) before its progress engine is set up (`xnet_init_progress`). A lane
//!   opening its domain while another thread read completions on the same fabric crashed
//!   the process (SIGSEGV in `fi_cq_read`, about one run in four of the two-process
//!   `net;ofi_rxm` test on 2 busy cores). 1.18 progresses only the domains bound to the EQ
//!   (ofiwg/libfabric c721f8d). There each lane's domain opens on a fabric of its own
//!   ([`domain_open_races_progress`]).
//! - **Pieces over shared memory**: shm moves a message in one copy between the two
//!   processes' memory, so pieces (see `comm`) overlap nothing there; and libfabric 1.17 shm
//!   loses a first piece whose count bits its receive ignores (the receive never completes,
//!   while the later pieces arrive: the piece test, 2 of 2 runs; 2.1 is not affected). Comms
//!   over shared-memory providers send whole messages ([`pieces_pay`]).
//! - **Wait objects that tell all**: a progress thread with nothing to do may sleep on its
//!   completion queue's wait object only where that fd polls readable for everything the
//!   thread would wait for. tcp puts every socket of the domain (readable, and writable while
//!   sends are queued) under its CQ's wait object (2.1: its progress engine's epoll set,
//!   `xnet_cq_open`; 1.17: the sockets themselves, `tcpx_progress`), and rxm adds tcp's CQ
//!   under its own (`rxm_ep_msg_cq_open`, both versions) unless `FI_OFI_RXM_DEF_WAIT_OBJ` or
//!   `FI_OFI_RXM_DEF_TCP_WAIT_OBJ` asks for another kind, which the plugin then respects by
//!   not sleeping. shm's and sm2's peers write into shared memory and signal nothing; rxd's
//!   retransmit timers and ucx's worker are not behind theirs in a way the plugin has
//!   checked. rxm puts its connection events (its EQ) under the CQ's wait object only with
//!   manual data progress or atomics (`rxm_ep_wait_fd_add`), so sleeps are bounded either way
//!   ([`wait_object_tells_all`], `progress`).
//! - **rxm's own registrations of long sends**: unless the application says it passes a
//!   descriptor with every buffer (`FI_MR_LOCAL`), rxm registers each rendezvous message's
//!   buffer itself at the send (and the receive), and deregisters it when the peer has read
//!   it. A send the peer never read (it died) keeps its registration after the endpoint
//!   closed, the tcp domain then refuses to close (`fi_close`: EBUSY) and its sockets and
//!   epoll fd stay open for the process's life (libfabric 1.17 and 2.1; ofiwg/libfabric
//!   #12016, fixed by #12846 after 2.1); on 2.1 that deregistration, run by the thread that
//!   closes the endpoint, was also where heaps were seen corrupted after faults. The plugin
//!   registers every buffer it hands rxm anyway, so over `tcp;ofi_rxm` it claims
//!   `FI_MR_LOCAL`: rxm then uses the plugin's registrations (and registers nothing per
//!   message), and the overflow area is registered once per domain, which costs tcp nothing
//!   (its registrations pin no memory) ([`claim_local_mr`]). rxm then tells the peer to read
//!   a long message from offset 0 of the registration its descriptor names (tcp's
//!   registrations take offsets, not addresses: `rxm_rndv_hdr_init`), so a send from inside
//!   NCCL's buffer (a slot, a piece) would deliver the buffer's first bytes: each send gets
//!   the descriptor of a registration beginning where it begins, made once per place and
//!   kept with NCCL's registration (`comm::Registered`, `mr`).

use crate::error::Result;
use crate::fabric::{Info, OwnedInfo};
use std::sync::OnceLock;

/// Speed reported for shared-memory providers (shm, sm2), which report no link.
pub const SHARED_MEMORY_SPEED_MBPS: u64 = 400_000;

/// Providers that only reach peers on the same host.
pub fn local_only(provider: &str) -> bool {
    matches!(provider, "shm" | "sm2")
}

/// Whether long messages go in pieces over this provider at libfabric `version`: network
/// providers whose cancels of posted receives were seen to complete (rxm and rxd over
/// anything, tcp, sockets, net, ucx); not shared memory, nor rxm before 2.1 (see the module
/// notes).
pub fn pieces_pay(provider: &str, version: u32) -> bool {
    if provider.contains("ofi_rxm") {
        return version >= crate::fabric::fi_version(2, 1);
    }
    provider.contains("ofi_rxd") || matches!(provider, "tcp" | "sockets" | "net" | "ucx")
}

/// Why endpoints of `provider` at libfabric `version` cannot be shared by comms, if so.
/// shm before 1.19 holds every later message between two endpoints behind one that arrived
/// before any receive for it was posted, and does not match such a message to a receive
/// posted later with ignore bits (its unexpected queue matches with a stale mask), so a
/// message sent to a comm that closed without receiving it stops every other comm between
/// the same endpoints (`faults::sends_nobody_received_do_not_block_the_endpoints_after_close`
/// fails on 1.17 at once; 1.19 buffers unexpected messages and matches through util_srx).
pub fn sharing_stalls(provider: &str, version: u32) -> Option<&'static str> {
    (provider == "shm" && version < crate::fabric::fi_version(1, 19)).then_some(
        "shm before libfabric 1.19 holds every message between two endpoints behind one sent \
         to a comm that closed without receiving it",
    )
}

/// Whether a closed comm's posted receives are cancelled at the close (so that no message
/// of a peer still sending lands in buffers NCCL may free after it): everywhere but where
/// [`sharing_stalls`], since there a message that then finds no receive holds every later one
/// between the two endpoints (1.17 shm failed `conform`'s close check so: the next pair,
/// on the closed comm's endpoint kept for it, never moved its data). There the receives stay
/// posted until a message fills them or their endpoint closes.
pub fn cancel_at_close(provider: &str, version: u32) -> bool {
    sharing_stalls(provider, version).is_none()
}

/// The speed to announce for a provider that reports no link speed and has no network
/// interface the kernel could report one for.
pub fn unreported_speed_mbps(provider: &str) -> u64 {
    if local_only(provider) {
        SHARED_MEMORY_SPEED_MBPS
    } else {
        crate::nic::DEFAULT_SPEED_MBPS
    }
}

/// Why `provider` at libfabric `version` cannot be trusted to name a message's sender after
/// a connection was reused, if that is so (seen with 1.17 rxm, not with 2.1; the versions
/// between were not tried).
pub fn stale_source_after_reconnect(provider: &str, version: u32) -> Option<&'static str> {
    (provider.contains("ofi_rxm") && version < crate::fabric::fi_version(2, 1)).then_some(
        "its source reports cannot be trusted after a reconnect: a sender that watched or \
         relayed the handshake, sent with a comm's tags and disconnected can have a receive \
         return its bytes (seen with libfabric 1.17; 2.1 is not affected). Use libfabric 2.1 \
         where strangers can reach the job's network (docs/faults.md, Security model)",
    )
}

/// Whether the endpoints of one device must make progress one at a time (libfabric 1.17
/// shm: see the module notes).
pub fn serial_progress(provider: &str, version: u32) -> bool {
    provider == "shm" && version < crate::fabric::fi_version(2, 1)
}

/// Whether opening a domain races with progress on other domains of its fabric (libfabric
/// 1.17 `net`, alone or under rxm: see the module notes); each lane's domain then gets a
/// fabric of its own.
pub fn domain_open_races_progress(provider: &str, version: u32) -> bool {
    provider.split(';').next() == Some("net") && version < crate::fabric::fi_version(1, 18)
}

/// Whether the provider offers `FI_SOURCE` but leaves completions without a source.
pub fn source_unreported(provider: &str) -> bool {
    provider.contains("ofi_rxd")
}

/// Whether the plugin claims `FI_MR_LOCAL` on the provider's domains (see the list above):
/// rxm over tcp, whose registrations pin nothing.
pub fn claim_local_mr(provider: &str) -> bool {
    provider == "tcp;ofi_rxm"
}

/// Whether the provider reads a receive's iovec array after the call returned (ucx hands
/// the caller's array to UCX, which scatters into it when the message arrives: libfabric
/// 2.1, `ucx_do_recvmsg`); such a provider gets one-piece receives only, so a message
/// longer than its receive is reported by the provider (FI_ETRUNC) instead.
pub fn keeps_iov(provider: &str) -> bool {
    provider == "ucx"
}

/// Whether moving GPU buffers makes the provider call the CUDA API in whichever thread
/// drives its progress, despite answering 0 to `FI_OPT_CUDA_API_PERMITTED=false`: ucx
/// stages GPU memory through UCX's `cuda_copy` transport (over tcp), which needs the GPU's
/// CUDA context, and only NCCL's proxy thread has it (seen on the GPU machine: progress
/// threads hang at the first GPU transfer, NCCL's calls driving move the data). With GPU
/// buffers such a provider is driven by NCCL's calls only.
pub fn progress_needs_cuda_context(provider: &str) -> bool {
    provider == "ucx"
}

/// Why GPU buffers are slower than host buffers over `provider`, if they are: ucx on a
/// machine without RDMA devices moves GPU memory over TCP, staging it through host memory
/// with CUDA copies (UCX's `cuda_copy`); measured on the GPU machine, GPU buffers moved
/// all_reduce at a tenth of the host buffers' speed. NCCL's choice of host buffers is then
/// the right one, and no advice should make it pass GPU buffers.
pub fn stages_gpu_memory(provider: &str, rdma_devices: bool) -> Option<&'static str> {
    (provider == "ucx" && !rdma_devices).then_some(
        "ucx has no RDMA device here, so it moves GPU memory over TCP through host copies \
         (UCX's cuda_copy), about a tenth of host buffers' speed on the machines measured",
    )
}

/// Whether a progress thread may sleep on the completion queue's wait object of `provider` at
/// libfabric `version` (see the module notes): `tcp` and `tcp;ofi_rxm` from libfabric 1.17
/// (the versions read and tested: 1.17.0 and 2.1.0).
pub fn wait_object_tells_all(provider: &str, version: u32) -> bool {
    // rxm nests tcp's CQ under its own only when its msg CQ gets an fd.
    let rxm_fd = || {
        ["FI_OFI_RXM_DEF_WAIT_OBJ", "FI_OFI_RXM_DEF_TCP_WAIT_OBJ"]
            .iter()
            .all(|v| std::env::var(v).map_or(true, |w| w.eq_ignore_ascii_case("fd")))
    };
    match provider {
        "tcp" => version >= crate::fabric::fi_version(1, 17),
        "tcp;ofi_rxm" => version >= crate::fabric::fi_version(1, 17) && rxm_fd(),
        _ => false,
    }
}

/// Whether `-FI_ENOMEM` from a post means "no free entry in the queue now".
pub fn enomem_means_full(provider: &str) -> bool {
    local_only(provider)
}

/// How long a queue may refuse every post with "no free entry" before that is an error.
pub const FULL_FOR_TOO_LONG: std::time::Duration = std::time::Duration::from_secs(10);

/// The provider's setting for the size of the queue that was full, for the WARN.
pub fn queue_limit(provider: &str, receive: bool) -> String {
    let which = if receive { "RX" } else { "TX" };
    match provider {
        "shm" => format!("FI_SHM_{which}_SIZE sets its size"),
        "sm2" => format!("FI_SM2_{which}_SIZE sets its size"),
        _ => "the provider's queue size setting".to_string(),
    }
}

/// Why native tcp is refused, unless the user allowed it.
pub fn native_tcp_refusal(provider: &str, allowed: bool) -> Option<&'static str> {
    (provider == "tcp" && !allowed).then_some(
        "native tcp RDM hangs under NCCL (ofiwg/libfabric#8963); use tcp;ofi_rxm, or set \
         NCCL_FABRIC_ALLOW_NATIVE_TCP=yes",
    )
}

/// Why rxm is refused where `FI_OFI_RXM_USE_RNDV_WRITE` is on: rxm then sends a long
/// message by writing it into the receiver's buffer, at the address the receiver names, and
/// over tcp, with the plugin's registrations (`claim_local_mr`), that is offset 0 of the
/// registration, not where NCCL's receive lies in it (a slot of NCCL's buffer, a piece). The
/// data arrives in the wrong place: seen on the GPU machine (libfabric 2.1, all_reduce
/// wrong at every size) and in the test machine's piece script. rxm's default, reads, works.
pub fn rxm_write_refusal(provider: &str, rndv_write: bool) -> Option<&'static str> {
    (claim_local_mr(provider) && rndv_write).then_some(
        "FI_OFI_RXM_USE_RNDV_WRITE is on: rxm would write long messages at the start of the \
         receive's registration, not into NCCL's receive; unset it",
    )
}

/// Whether an endpoint whose setup failed before `fi_enable` may be closed. No: some
/// providers crash in `fi_close` then, so it is left open (a few KiB, once per failure).
pub fn close_unenabled_endpoints() -> bool {
    false
}

/// Whether a sending endpoint must stay open until its receiving endpoint in this same
/// process has closed.
pub fn sender_waits_for_receiver(provider: &str) -> bool {
    local_only(provider)
}

/// The random part this process adds to shm endpoint names.
fn process_nonce() -> u32 {
    static NONCE: OnceLock<u32> = OnceLock::new();
    *NONCE.get_or_init(|| crate::random::u64() as u32)
}

/// The prefix every shm address of this process starts with: `fi_shm://<pid>-<nonce>`.
fn own_shm_prefix() -> String {
    format!("fi_shm://{}-{:08x}", std::process::id(), process_nonce())
}

/// For shm, the endpoint's info with a source address no earlier process can have used.
pub fn shm_source_name(info: Info<'_>) -> Result<Option<OwnedInfo>> {
    let default = format!("fi_shm://{}", std::process::id());
    if info.provider() != "shm" || info.src_addr_str().as_deref() != Some(default.as_str()) {
        return Ok(None);
    }
    info.with_src_addr_str(&own_shm_prefix()).map(Some)
}

/// Whether a peer address names an endpoint of this very process (shm addresses carry the
/// pid and this process's random part). Such an address must be one of the endpoints open
/// now: sending to a closed one hangs libfabric 2.1 shm.
pub fn names_this_process(provider: &str, addr: &[u8]) -> bool {
    if provider != "shm" {
        return false;
    }
    let text = addr.split(|&b| b == 0).next().unwrap_or_default();
    let prefix = own_shm_prefix();
    text.starts_with(prefix.as_bytes()) && matches!(text.get(prefix.len()), None | Some(b':'))
}

/// libfabric variables set at init unless the user set them: 33 KiB eager buffers, 16-deep
/// receive queues (over tcp rxm shares one per endpoint among its connections, its shared
/// receive context; elsewhere each connection has its own) and send queues, 4 KiB buffers in
/// 2.x tcp's transfer pool, and no segmented sends (SAR). rxm and tcp grow
/// their pools 1024 buffers at a time, per endpoint (rxm) and per domain (tcp), and every lane
/// has both: with rxm's 8 KiB and tcp's 16 KiB, each endpoint held 34 MiB on 2.1 (18.5 on
/// 1.17), with 4 KiB each 14 MiB (10.5) (`cargo bench --bench memory`). rxm refuses a
/// connection between endpoints of different eager limits, so every rank must run with the
/// same values (they do when all run this plugin). Measured on 2× H200 (NCCL 2.28.9,
/// libfabric 2.1, all_reduce 1 GiB) with 16-deep queues, no shared receive context and 8 KiB
/// eager buffers: peak RSS 4.0 → 1.5 GiB, busbw 13.0 → 12.7 GB/s; most of the 4.0 was the
/// shared context's 4096 preposted buffers.
///
/// The shared receive context stays on (rxm's default over tcp, 16 deep here): without it a
/// connection's receives are posted on the connection's own endpoint, and rxm's teardown
/// (see the module notes) posts one there after closing it, which killed the process when a
/// peer left with messages queued. It costs 3 MiB more per endpoint (12.0 against 9.2 MiB on
/// 2.1, `memory` bench) and about half a microsecond of 8-byte latency (5.6 against 5.1 µs
/// half round trip, `transfer` bench, 2-core machine); bandwidth within the benches' noise.
///
/// The eager buffers hold one of the 32 KiB pieces a comm on capped connections cuts into
/// (`pace::FINE_PIECE`), and the last piece of a message a little longer than its cut, so that
/// those go eagerly: each piece's data leaves with its send, where by rendezvous (the default
/// until 2026-12-07) it waited a round trip for the receiver's read and its send for the read
/// to end, which kept capped connections idle much of the time. Longer messages still go by
/// rendezvous, read straight into the receive. 1 MiB slices two in flight in 32 KiB pieces
/// moved 825–946 MB/s against 445–451 by rendezvous over connections pacing themselves at
/// 1 Gbit/s, 989–1107 against 648–650 uncapped (2-core machine, progress threads), and
/// all_reduce on the GPU machine 1.92× Socket 2×8 against 1.15–1.19× with every connection
/// capped at 250 Mbit/s by HTB classes, at 0.62–0.66× Socket's CPU, and uncapped as much as by
/// rendezvous (BENCHMARKS.md). The price is memory: rxm's pools grow 1024 buffers at a time, so
/// an endpoint that has carried traffic holds 60.2 MiB in place of 12.0 with 4 KiB buffers
/// (`memory` bench), and opening one takes longer (lanes open off NCCL's calls, see `lane`);
/// `sizing::MAX_FLOW_LANES` keeps the endpoints few. (Before the rendezvous, rxm's own SAR
/// limit of 8 eager buffers had sent each 32 KiB piece through 4 KiB buffers in 8 segments,
/// copied again out of them, at a third of the rate.)
pub const RXM_DEFAULTS: &[(&str, &str)] = &[
    ("FI_OFI_RXM_BUFFER_SIZE", "33792"),
    ("FI_OFI_RXM_MSG_RX_SIZE", "16"),
    ("FI_OFI_RXM_MSG_TX_SIZE", "16"),
    ("FI_TCP_MAX_RX_SIZE", "4096"),
    ("FI_OFI_RXM_SAR_LIMIT", "33792"),
];

/// Packets rxd keeps in flight to a peer, unless the user set it: 32 of its 4 KiB packets
/// fit a UDP socket's default buffer, 128 (its default) do not (see the module notes).
pub const RXD_DEFAULTS: &[(&str, &str)] = &[("FI_OFI_RXD_MAX_UNACKED", "32")];

/// Variables the plugin sets for one provider unless the user did.
pub struct Defaults {
    /// The part of a provider's name they serve (`ofi_rxm` in `tcp;ofi_rxm`).
    pub provider: &'static str,
    /// What they change, for the INFO line.
    pub what: &'static str,
    /// (variable, value) pairs.
    pub vars: &'static [(&'static str, &'static str)],
}

/// Every provider's [`Defaults`].
pub const PROVIDER_DEFAULTS: &[Defaults] = &[
    Defaults {
        provider: "ofi_rxm",
        what: "rxm's eager buffers for 32 KiB pieces, shallower rxm queues and smaller tcp buffers",
        vars: RXM_DEFAULTS,
    },
    Defaults {
        provider: "ofi_rxd",
        what: "rxd's send window within a UDP socket's default buffer",
        vars: RXD_DEFAULTS,
    },
];

/// NCCL's point-to-point chunk over the network, unless the user set it: 512 KiB in place of
/// NCCL's 128 KiB. NCCL sends each point-to-point transfer as chunks of this size, eight in
/// flight per channel, and over `tcp;ofi_rxm` each chunk longer than the eager buffers is a
/// rendezvous of its own. On the GPU machine (two ranks as two hosts, 2 channels) the plugin
/// over shm, through the same channels, moved sendrecv and alltoall 1.7-1.8x what it moved over
/// rxm with 128 KiB chunks, so the cost per chunk bound them; with 512 KiB chunks set here
/// sendrecv moved 1.46x and 1.47x, alltoall 1.40x and 1.42x, what 128 KiB chunks did (averages
/// over 1-256 and 64-256 MiB), and 1.26-1.50x and 1.39-1.73x Socket 2x8 at 256 MiB in three
/// rounds (BENCHMARKS.md). NCCL reads the variable when it sets up a communicator, after the
/// plugin's `init`, and holds a chunk to an eighth of its buffer (4 MiB unless set).
///
/// And NCCL's point-to-point channels per network peer: NCCL 2.28 opens 2, NCCL 2.30 one per
/// `NCCL_P2P_PER_CHANNEL_NET_BW` GB/s of the NIC's speed (14 unless set), which is one channel
/// for any NIC under 112 Gb/s, and one channel is one connection's worth over TCP here. With 2
/// GB/s a channel, a NIC of 25 Gb/s gets 2 (what 2.28 gives), one of 10 Gb/s still one. On the
/// GPU machine (NCCL 2.30.7, two ranks as two hosts, H100, 2026-12-07 21:28-21:33) sendrecv
/// moved 3.84 GB/s on average over 1-256 MiB through one channel and 6.15 through two, as
/// much as Socket 2x8 (3.84) and 1.60x; alltoall 3.86 and 6.20 against 3.83; set here, on
/// another H100, sendrecv 2.08x and alltoall 1.76x Socket 2x8 at 256 MiB (BENCHMARKS.md).
/// NCCL 2.28 has no such variable: there it changes nothing.
pub const RXM_NCCL_DEFAULTS: &[(&str, &str)] = &[
    ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
    ("NCCL_P2P_PER_CHANNEL_NET_BW", "2"),
];

/// NCCL's own variables the plugin sets once it knows its provider, unless the user did.
pub const NCCL_DEFAULTS: &[Defaults] = &[Defaults {
    provider: "ofi_rxm",
    what:
        "NCCL's point-to-point chunks of 512 KiB, a rendezvous each over rxm, and 2 point-to-point \
           channels per network peer on NCCL 2.30",
    vars: RXM_NCCL_DEFAULTS,
}];

/// Sets each of `vars` the environment does not already have; returns those set
/// (`NAME=value`).
fn set_unset(vars: &[(&str, &str)]) -> Vec<String> {
    vars.iter()
        .filter(|(k, _)| std::env::var_os(k).is_none())
        .map(|&(k, v)| {
            // Called from init: libfabric's variables before the plugin's first libfabric
            // call, NCCL's before NCCL sets up a communicator over the plugin; NCCL's other
            // threads do not read these variables meanwhile.
            std::env::set_var(k, v);
            format!("{k}={v}")
        })
        .collect()
}

/// Sets each variable of [`PROVIDER_DEFAULTS`] the environment does not already have, before
/// the first `fi_getinfo` of the process (libfabric reads them when it loads its providers);
/// returns, for each provider's defaults, the ones set (`NAME=value`). Runs once.
pub fn apply_defaults() -> Vec<(&'static Defaults, Vec<String>)> {
    static SET: OnceLock<Vec<(&'static Defaults, Vec<String>)>> = OnceLock::new();
    SET.get_or_init(|| {
        PROVIDER_DEFAULTS
            .iter()
            .map(|d| (d, set_unset(d.vars)))
            .collect()
    })
    .clone()
}

/// Sets the variables of [`NCCL_DEFAULTS`] that serve `provider` (the one chosen) and the
/// environment does not already have; returns them as [`apply_defaults`] does.
pub fn apply_nccl_defaults(provider: &str) -> Vec<(&'static Defaults, Vec<String>)> {
    NCCL_DEFAULTS
        .iter()
        .filter(|d| provider.contains(d.provider))
        .map(|d| (d, set_unset(d.vars)))
        .collect()
}

/// Why nothing can be listening at `addr`, if the plugin can tell: a TCP connection refused
/// (providers over TCP), or no shm region of that name on this host. `None`: it may be there.
/// Takes at most 100 ms.
pub fn refused(provider: &str, addr: &[u8]) -> Option<String> {
    if provider.contains("tcp") || provider.contains("sockets") {
        let sa = crate::fabric::socket_address(addr)?;
        return match std::net::TcpStream::connect_timeout(
            &sa,
            std::time::Duration::from_millis(100),
        ) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                Some(format!("connection to {sa} refused"))
            }
            _ => None,
        };
    }
    if local_only(provider) {
        let text = addr.split(|&b| b == 0).next()?;
        let name = std::str::from_utf8(text).ok()?.strip_prefix("fi_shm://")?;
        if !name.contains('/') && !std::path::Path::new("/dev/shm").join(name).exists() {
            return Some(format!(
                "no shared-memory endpoint /dev/shm/{name} on this host"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_shm_addresses_are_recognised() {
        let mine = format!("{}:0:3\0", own_shm_prefix());
        assert!(names_this_process("shm", mine.as_bytes()));
        assert!(!names_this_process("tcp;ofi_rxm", mine.as_bytes()));
        let other = format!("fi_shm://{}-00000000:0:3\0", std::process::id());
        assert!(
            !names_this_process("shm", other.as_bytes()) || process_nonce() == 0,
            "another process with our pid number (another pid namespace) is not us"
        );
        let longer = format!("{}0:0:3", own_shm_prefix());
        assert!(!names_this_process("shm", longer.as_bytes()));
    }

    #[test]
    fn speeds_and_refusals() {
        assert_eq!(unreported_speed_mbps("shm"), SHARED_MEMORY_SPEED_MBPS);
        assert_eq!(
            unreported_speed_mbps("tcp;ofi_rxm"),
            crate::nic::DEFAULT_SPEED_MBPS
        );
        assert!(native_tcp_refusal("tcp", false).is_some());
        assert!(native_tcp_refusal("tcp", true).is_none());
        assert!(native_tcp_refusal("tcp;ofi_rxm", false).is_none());
        assert!(rxm_write_refusal("tcp;ofi_rxm", true).is_some());
        assert!(rxm_write_refusal("tcp;ofi_rxm", false).is_none());
        assert!(rxm_write_refusal("shm", true).is_none());
        let v = crate::fabric::fi_version;
        assert!(stale_source_after_reconnect("tcp;ofi_rxm", v(1, 17)).is_some());
        assert!(stale_source_after_reconnect("tcp;ofi_rxm", v(2, 1)).is_none());
        assert!(stale_source_after_reconnect("shm", v(1, 17)).is_none());
        assert!(domain_open_races_progress("net;ofi_rxm", v(1, 17)));
        assert!(domain_open_races_progress("net", v(1, 17)));
        assert!(!domain_open_races_progress("net;ofi_rxm", v(1, 18)));
        assert!(!domain_open_races_progress("tcp;ofi_rxm", v(1, 17)));
        assert!(!domain_open_races_progress("udp;ofi_rxd", v(1, 17)));
    }
}
