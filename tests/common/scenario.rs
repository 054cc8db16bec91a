//! Building blocks of the scenarios that run in child processes: one initialised plugin,
//! the provider environments, deadlines, and pairs that must still carry data.

use super::*;
use nccl_net_host::{PluginLib, Ptr};
use std::time::Instant;

pub const NULL: Ptr = Ptr(std::ptr::null_mut());

pub fn until(secs: f64) -> Instant {
    Instant::now() + scaled(secs)
}

pub fn init() -> PluginLib {
    let lib = plugin();
    lib.init(true).expect("init");
    lib
}

/// Provider environments of the data path, plus `extra`.
pub fn envs(extra: &[(&str, &str)]) -> Vec<(String, Vec<(String, String)>)> {
    data_providers()
        .into_iter()
        .map(|p| {
            let mut env = provider_env(p);
            env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            (p.to_string(), env)
        })
        .collect()
}

/// A connect timeout short enough to wait out in a test: 300 ms, stretched under valgrind
/// (where opening an endpoint alone can take longer).
pub fn short_connect_timeout() -> String {
    ((300.0 * slow()) as u64).to_string()
}

pub fn ok(f: &Finished, what: &str) {
    assert!(
        f.success && f.result("ok").is_some(),
        "{what} failed\n--- stdout\n{}\n--- stderr\n{}",
        f.stdout,
        f.stderr
    );
}

/// Sends `count` messages of `len` bytes on `comm`, one at a time, each waited for.
pub fn send_n(lib: &PluginLib, comm: Ptr, len: usize, count: usize, deadline: Instant) {
    for i in 0..count {
        let mut buf = pattern(i, len);
        // SAFETY: buf outlives the request, waited for right away.
        let r =
            unsafe { lib.isend_until(comm, buf.as_mut_ptr().cast(), len as i32, NULL, deadline) }
                .expect("isend");
        assert_eq!(lib.wait(r, deadline).expect("send") as usize, len);
    }
}

/// Receives and checks `count` messages of `len` bytes on `comm`.
pub fn recv_n(lib: &PluginLib, comm: Ptr, len: usize, count: usize, deadline: Instant) {
    for i in 0..count {
        let mut buf = vec![0u8; len];
        // SAFETY: buf outlives the request, waited for right away.
        let r =
            unsafe { lib.irecv_until(comm, buf.as_mut_ptr().cast(), len as i32, NULL, deadline) }
                .expect("irecv");
        assert_eq!(lib.wait(r, deadline).expect("receive") as usize, len);
        assert!(buf == pattern(i, len), "message {i} differs");
    }
}

/// Connects a pair on device 0, moves `count` messages of `len` bytes over it (checked),
/// and closes it: the plugin still carries data.
pub fn a_pair_carries_data(lib: &PluginLib, len: usize, count: usize, deadline: Instant) {
    let (send, recv) = lib.connect_pair(0, deadline).expect("connect_pair");
    std::thread::scope(|s| {
        s.spawn(|| recv_n(lib, recv, len, count, deadline));
        send_n(lib, send, len, count, deadline);
    });
    lib.close_send(send).expect("closeSend");
    lib.close_recv(recv).expect("closeRecv");
}
