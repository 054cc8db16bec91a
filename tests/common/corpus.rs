//! The corpus of hostile input: connection handles and control messages that are damaged,
//! forged or stale in the ways seen in the field. Each case is built from a real handle (or
//! a real address) so that it fits the provider under test, and most carry a valid
//! checksum: only the flaw itself can make the plugin refuse them.
#![allow(dead_code)]

use nccl_net_fabric::handshake::{seal, Handle, Identity, Kind, Record, MSG_SIZE};
use nccl_net_fabric::nccl::NET_HANDLE_MAXSIZE;

/// Addresses shaped wrongly for a provider whose real addresses look like `good`.
pub fn bad_addresses(good: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut v: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let string = good.contains(&0) && good.starts_with(b"fi_");
    if string {
        let text = &good[..good.iter().position(|&b| b == 0).unwrap_or(good.len())];
        v.push(("name without its NUL", text.to_vec()));
        v.push(("name with bytes after its NUL", [good, b"junk"].concat()));
        v.push(("name of another scheme", b"fi_sockets://1:2\0".to_vec()));
        v.push((
            "name with control characters",
            b"fi_shm://\x01\x02\0".to_vec(),
        ));
        v.push(("88 bytes without a NUL", vec![b'A'; 88]));
    } else {
        v.push((
            "socket address cut to 12 bytes",
            good[..good.len().min(12)].to_vec(),
        ));
        v.push(("socket address one byte long", [good, &[0]].concat()));
        let mut unix = good.to_vec();
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        v.push(("socket address of family AF_UNIX", unix));
        let mut port0 = good.to_vec();
        port0[2..4].fill(0);
        v.push(("socket address with port 0", port0));
        v.push(("88 bytes of 0xff", vec![0xff; 88]));
    }
    v.push(("one byte", vec![1]));
    v
}

/// Damaged or forged handles, derived from the real handle `good`.
pub fn bad_handles(good: &[u8; NET_HANDLE_MAXSIZE]) -> Vec<(String, [u8; NET_HANDLE_MAXSIZE])> {
    let h = Handle::read(good).expect("a real handle");
    let mut v = vec![("zeroed".to_string(), [0u8; NET_HANDLE_MAXSIZE])];
    let mut flip = |name: &str, at: usize, sealed: bool| {
        let mut b = *good;
        b[at] ^= 0x5a;
        if sealed {
            seal(&mut b);
        }
        v.push((name.to_string(), b));
    };
    flip("bad magic", 0, true);
    flip("unknown version", 4, true);
    flip("unknown kind", 5, true);
    flip("field count 0x5a", 6, true);
    flip("corrupted token (checksum left)", 9, false);
    let mut liar = *good;
    liar[40] = 0xff;
    liar[41] = 0;
    seal(&mut liar);
    v.push(("address length lying past the end".into(), liar));
    for (name, addr) in bad_addresses(&h.addr) {
        let forged = Handle {
            addr: addr.clone(),
            ..h.clone()
        };
        let mut b = [0u8; NET_HANDLE_MAXSIZE];
        if forged.write(&mut b).is_ok() {
            v.push((format!("handle with a {name}"), b));
        }
    }
    let mut connect = [0u8; NET_HANDLE_MAXSIZE];
    record(
        Kind::Connect,
        h.token,
        1,
        vec![h.addr.clone(), h.addr.clone()],
    )
    .write(&mut connect)
    .expect("fits");
    v.push(("a CONNECT record as a handle".into(), connect));
    v
}

fn record(kind: Kind, a: u64, b: u64, fields: Vec<Vec<u8>>) -> Record {
    Record {
        kind,
        a,
        b,
        who: Identity::current(),
        fields,
    }
}

fn encoded(r: &Record) -> Vec<u8> {
    let mut buf = vec![0u8; MSG_SIZE];
    r.write(&mut buf).expect("fits a control message");
    buf
}

/// Control messages a stranger sends to the control endpoint of listen comm `token`: none
/// may take the listen comm from its real peer. `me` is the stranger's own address.
pub fn bad_messages(token: u64, me: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("320 bytes of 0xa5".into(), vec![0xa5; MSG_SIZE]),
        ("64 KiB of zeros".into(), vec![0; 65536]),
        (
            "stale CONNECT (a listen comm of an earlier job)".into(),
            encoded(&record(
                Kind::Connect,
                token ^ 0x5555,
                2,
                vec![me.into(), me.into()],
            )),
        ),
        (
            "CONNECT without its data address".into(),
            encoded(&record(Kind::Connect, token, 3, vec![me.into()])),
        ),
        (
            "ACK for no connect".into(),
            encoded(&record(Kind::Ack, 0x1234, 5, vec![me.into()])),
        ),
        (
            "NACK for no connect".into(),
            encoded(&record(
                Kind::Nack,
                0x1234,
                0,
                vec![b"\x1b[2Jgo away".to_vec()],
            )),
        ),
        (
            "PONG nobody asked for".into(),
            encoded(&record(Kind::Pong, 0x99, 0, vec![])),
        ),
        (
            "a handle as a message".into(),
            encoded(&record(Kind::Handle, token, 0, vec![me.into()])),
        ),
    ];
    let mut liar = encoded(&record(Kind::Connect, token, 4, vec![me.into(), me.into()]));
    liar[40] = 0xff;
    liar[41] = 0x7f;
    seal(&mut liar);
    v.push(("CONNECT whose first field claims 32 KiB".into(), liar));
    for (name, addr) in bad_addresses(me) {
        let fields = vec![addr.clone(), addr];
        let mut r = record(Kind::Connect, token, 6, fields);
        if r.fields.iter().all(|f| f.len() <= 128) {
            v.push((format!("CONNECT with a {name}"), encoded(&r)));
        }
        r.kind = Kind::Ping;
        r.fields.truncate(1);
        v.push((format!("PING with a {name}"), encoded(&r)));
    }
    v
}
