//! Fuzzing the decoders of everything that reaches the plugin from outside: NCCL's handle
//! (`Handle::read`), control messages (`Message::parse`) and peer addresses
//! (`Shape::check`). Random bytes, and valid records mutated byte by byte (resealed, so the
//! checksum does not hide the flaw), must never panic, and whatever is accepted must be
//! well-formed. Then the corpus of hostile cases (tests/common/corpus.rs) must be refused.
//!
//! `NFAB_FUZZ_CASES` sets the cases per property (default 20000: a few seconds in CI).

mod common;

use common::corpus::{bad_addresses, bad_handles, bad_messages};
use nccl_net_fabric::address::Shape;
use nccl_net_fabric::handshake::{seal, Handle, Identity, Kind, Message, Record, MSG_SIZE};
use nccl_net_fabric::nccl::NET_HANDLE_MAXSIZE;
use nccl_net_fabric::sys;
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("NFAB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20000)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn inet(port: u16) -> Vec<u8> {
    let mut a = vec![0u8; 16];
    a[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    a[2..4].copy_from_slice(&port.to_be_bytes());
    a[4..8].copy_from_slice(&[127, 0, 0, 1]);
    a
}

fn inet6(port: u16) -> Vec<u8> {
    let mut a = vec![0u8; 28];
    a[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
    a[2..4].copy_from_slice(&port.to_be_bytes());
    a[23] = 1;
    a
}

/// (shape, a real address of that shape) for the formats the providers use.
fn shapes() -> Vec<(Shape, Vec<u8>)> {
    let shm = b"fi_shm://4242-0badcafe:0:1\0".to_vec();
    vec![
        (Shape::of(sys::FI_SOCKADDR_IN, &inet(4000)), inet(5000)),
        (Shape::of(sys::FI_SOCKADDR_IN6, &inet6(4000)), inet6(5000)),
        (Shape::of(sys::FI_ADDR_STR, &shm), shm.clone()),
    ]
}

fn connect_record(addr: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; MSG_SIZE];
    Record {
        kind: Kind::Connect,
        a: 0x1234_5678_9abc_def0,
        b: 7,
        who: Identity { host: 9, pid: 10 },
        fields: vec![addr.to_vec(), addr.to_vec()],
    }
    .write(&mut buf)
    .expect("fits");
    buf
}

fn handle(addr: &[u8]) -> [u8; NET_HANDLE_MAXSIZE] {
    let mut buf = [0u8; NET_HANDLE_MAXSIZE];
    Handle {
        token: 1,
        nonce: 2,
        owner: Identity { host: 3, pid: 4 },
        addr: addr.to_vec(),
    }
    .write(&mut buf)
    .expect("fits");
    buf
}

/// Every address a message carries has the shape it was checked against.
fn addresses_fit(m: &Message, shape: &Shape) -> bool {
    let addrs: Vec<&Vec<u8>> = match m {
        Message::Connect { reply_to, data, .. } => vec![reply_to, data],
        Message::Ack { data, .. } => vec![data],
        Message::Ping { reply_to, .. } => vec![reply_to],
        Message::Nack { .. } | Message::Pong { .. } => vec![],
    };
    addrs.iter().all(|a| shape.check(a).is_ok())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut h = [0u8; NET_HANDLE_MAXSIZE];
        let n = bytes.len().min(NET_HANDLE_MAXSIZE);
        h[..n].copy_from_slice(&bytes[..n]);
        let _ = Handle::read(&h);
        let _ = Record::read(&bytes, "message");
        for (shape, _) in shapes() {
            let _ = shape.check(&bytes);
            if let Ok(m) = Message::parse(&bytes, &shape, &shape) {
                prop_assert!(addresses_fit(&m, &shape));
            }
        }
    }

    #[test]
    fn mutated_messages_are_refused_or_well_formed(
        which in 0usize..3,
        edits in proptest::collection::vec((0usize..MSG_SIZE, any::<u8>()), 1..8),
        reseal in any::<bool>(),
        cut in 0usize..=MSG_SIZE,
    ) {
        let (shape, addr) = shapes().swap_remove(which);
        let mut buf = connect_record(&addr);
        for (at, v) in edits {
            buf[at] = v;
        }
        if reseal {
            seal(&mut buf);
        }
        buf.truncate(cut.max(1));
        if let Ok(m) = Message::parse(&buf, &shape, &shape) {
            prop_assert!(addresses_fit(&m, &shape), "{m:?}");
        }
    }

    #[test]
    fn mutated_handles_are_refused_or_round_trip(
        which in 0usize..3,
        edits in proptest::collection::vec((0usize..NET_HANDLE_MAXSIZE, any::<u8>()), 1..8),
        reseal in any::<bool>(),
    ) {
        let (_, addr) = shapes().swap_remove(which);
        let mut buf = handle(&addr);
        for (at, v) in edits {
            buf[at] = v;
        }
        if reseal {
            seal(&mut buf);
        }
        if let Ok(h) = Handle::read(&buf) {
            let mut again = [0u8; NET_HANDLE_MAXSIZE];
            h.write(&mut again).expect("what was read can be written");
            prop_assert_eq!(Handle::read(&again).expect("and read again"), h);
        }
    }

    #[test]
    fn addresses_of_the_wrong_shape_are_refused(
        which in 0usize..3,
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let (shape, real) = shapes().swap_remove(which);
        if shape.check(&bytes).is_ok() {
            // Socket addresses: exactly as long as the real ones; names: NUL-terminated.
            match real.last() {
                Some(0) => prop_assert!(bytes.contains(&0)),
                _ => prop_assert_eq!(bytes.len(), real.len()),
            }
        }
    }
}

#[test]
fn the_corpus_is_refused() {
    for (shape, addr) in shapes() {
        for (name, bad) in bad_addresses(&addr) {
            assert!(shape.check(&bad).is_err(), "address: {name}");
        }
        let good = handle(&addr);
        for (name, bad) in bad_handles(&good) {
            let refused = match Handle::read(&bad) {
                Err(_) => true,
                Ok(h) => shape.check(&h.addr).is_err(),
            };
            assert!(refused, "handle: {name}");
        }
        for (name, bad) in bad_messages(1, &addr) {
            // Stale messages parse (their flaw is what they name); the rest must not.
            match Message::parse(&bad, &shape, &shape) {
                Err(_) => {}
                Ok(m) => assert!(
                    name.starts_with("stale") || name.contains("for no") || name.contains("PONG"),
                    "message {name} accepted as {m:?}"
                ),
            }
        }
    }
}
