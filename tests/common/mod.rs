//! Shared helpers: load the plugin `.so` like NCCL, and run scenarios in child processes.
//!
//! The plugin reads its settings once per process (at `init`), so each scenario that needs
//! its own settings or provider runs in a child: the test binary re-runs itself with one
//! `#[ignore]`d child test selected and the scenario's environment. Every child has a
//! deadline and is killed when it passes it.
#![allow(dead_code)]

pub mod corpus;
pub mod hosts;
pub mod scenario;
pub mod stranger;

use nccl_net_host::PluginLib;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment every scenario starts from: loopback domains only, quiet unless failing.
pub const BASE_ENV: &[(&str, &str)] = &[
    ("NCCL_FABRIC_DOMAINS", "lo,shm,sm2"),
    ("NCCL_FABRIC_LOG", "warn"),
];

/// [`BASE_ENV`] plus `pairs` (later entries win), as owned strings for a child.
pub fn env_with(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    BASE_ENV
        .iter()
        .chain(pairs)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The plugin, called through its v8 table.
pub fn plugin() -> PluginLib {
    PluginLib::open(&PluginLib::default_path()).expect("load the plugin .so")
}

/// The plugin, called through its table of `version`.
pub fn plugin_version(version: u32) -> PluginLib {
    PluginLib::open_version(&PluginLib::default_path(), version).expect("load the plugin .so")
}

/// The running libfabric's (major, minor).
pub fn libfabric_version() -> (u32, u32) {
    let v = nccl_net_fabric::fabric::runtime_version();
    (v >> 16, v & 0xffff)
}

/// Providers the data-path scenarios run over on this libfabric: `tcp;ofi_rxm` and `shm`
/// everywhere, native `tcp` where libfabric has it (>= 1.18).
pub fn data_providers() -> Vec<&'static str> {
    let mut p = vec!["tcp;ofi_rxm", "shm"];
    if libfabric_version() >= (1, 18) {
        p.push("tcp");
    }
    p
}

/// Environment that makes the plugin pick `provider`.
pub fn provider_env(provider: &str) -> Vec<(String, String)> {
    let mut env = env_with(&[("NCCL_FABRIC_PROVIDER", provider)]);
    if provider == "tcp" {
        env.push(("NCCL_FABRIC_ALLOW_NATIVE_TCP".into(), "yes".into()));
    }
    env
}

/// A child running one ignored test of this binary. Its stdout and stderr are drained by
/// threads from the start, so a chatty child can never block on a full pipe.
pub struct ChildTest {
    child: Child,
    name: String,
    deadline: Instant,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

pub struct Finished {
    pub success: bool,
    /// How it exited, as the OS says ("exit status: 1", "signal: 11 (SIGSEGV)").
    pub status: String,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Values the child printed as `RESULT key=value`.
    pub fn result(&self, key: &str) -> Option<String> {
        let prefix = format!("RESULT {key}=");
        // libtest may print "test name ... " on the same line before the child's output.
        self.stdout
            .lines()
            .find_map(|l| l.split_once(&prefix).map(|(_, v)| v.to_string()))
    }
}

/// How much slower than usual this run is (`NFAB_SLOW`, e.g. 30 under valgrind): every
/// deadline of the fault tests is stretched by it.
pub fn slow() -> f64 {
    std::env::var("NFAB_SLOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&f: &f64| f >= 1.0)
        .unwrap_or(1.0)
}

/// `secs` seconds, stretched by [`slow`].
pub fn scaled(secs: f64) -> Duration {
    Duration::from_secs_f64(secs * slow())
}

/// The command that runs a child: the test binary, under valgrind memcheck when
/// `NFAB_VALGRIND_DIR` names a folder for its logs (scripts/valgrind-faults.sh).
fn child_command(wrapper: &[&str]) -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut argv: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
    if let Ok(dir) = std::env::var("NFAB_VALGRIND_DIR") {
        argv.extend([
            "valgrind".to_string(),
            "--tool=memcheck".into(),
            "--fair-sched=yes".into(),
            "--num-callers=40".into(),
            // Children in pid namespaces of their own all have pid 1 or 2: a name per child.
            format!("--log-file={dir}/%q{{NFAB_CHILD}}-%q{{NFAB_SPAWN}}-%p.log"),
        ]);
    }
    argv.push(exe.to_string_lossy().into_owned());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

pub fn spawn_child(name: &str, env: &[(String, String)], timeout: Duration) -> ChildTest {
    spawn_child_in(name, env, timeout, &[])
}

/// As [`spawn_child`], with the child started through `wrapper` (e.g. `unshare --pid
/// --fork --kill-child`: a pid namespace of its own, as on another host).
pub fn spawn_child_in(
    name: &str,
    env: &[(String, String)],
    timeout: Duration,
    wrapper: &[&str],
) -> ChildTest {
    let timeout = timeout.mul_f64(slow());
    let mut child = child_command(wrapper)
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NFAB_CHILD", name)
        .env(
            "NFAB_SPAWN",
            format!("{:x}", nccl_net_fabric::random::u64() as u32),
        )
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child test");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = child.stderr.take().expect("child stderr");
    let stderr = Some(std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    }));
    ChildTest {
        child,
        name: name.to_string(),
        deadline: Instant::now() + timeout,
        lines,
        seen: Vec::new(),
        stderr,
    }
}

impl ChildTest {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes a line to the child; where it no longer reads (it exited), panics with what it
    /// printed.
    pub fn send_line(&mut self, line: &str) {
        if self.try_send_line(line) {
            return;
        }
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        let err = self.take_stderr();
        let out: Vec<String> = self.lines.try_iter().collect();
        panic!(
            "write to child {} failed: it exited ({status}); stdout:\n{}\n{}\nstderr:\n{err}",
            self.name,
            self.seen.join("\n"),
            out.join("\n")
        );
    }

    /// As [`ChildTest::send_line`]; false if the child no longer reads (it exited).
    pub fn try_send_line(&mut self, line: &str) -> bool {
        let stdin = self.child.stdin.as_mut().expect("child stdin");
        writeln!(stdin, "{line}").is_ok() && stdin.flush().is_ok()
    }

    /// Reads stdout until a `RESULT key=value` line; kills the child and panics at the deadline.
    pub fn read_result(&mut self, key: &str) -> String {
        let prefix = format!("RESULT {key}=");
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.split_once(&prefix).map(|(_, v)| v.to_string());
                    self.seen.push(line);
                    if let Some(v) = found {
                        return v;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let err = self.take_stderr();
                    panic!(
                        "child {} gave no RESULT {key} ({e}); stdout:\n{}\nstderr:\n{err}",
                        self.name,
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// What the child wrote to stderr, once it has exited (empty if taken before).
    fn take_stderr(&mut self) -> String {
        self.stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Kills the child and gives back what it printed (stdout, then stderr).
    pub fn kill_for_output(&mut self) -> String {
        let _ = self.child.kill();
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        remove_shm_files(self.child.id());
        let err = self.take_stderr();
        let mut out = std::mem::take(&mut self.seen);
        out.extend(self.lines.try_iter());
        format!(
            "child {} ({status}); stdout:\n{}\nstderr:\n{err}",
            self.name,
            out.join("\n")
        )
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        remove_shm_files(self.child.id());
    }

    /// Waits for the child to exit; kills it and panics at the deadline.
    pub fn finish(mut self) -> Finished {
        drop(self.child.stdin.take());
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for child") {
                break s;
            }
            if Instant::now() > self.deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                remove_shm_files(self.child.id());
                let stderr = self.take_stderr();
                panic!(
                    "child {} passed its deadline and was killed; stderr:\n{stderr}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        remove_shm_files(self.child.id());
        // The reader thread ends at EOF, which comes once the child has exited.
        let mut out = std::mem::take(&mut self.seen);
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            out.push(line);
        }
        let stderr = self.take_stderr();
        if let Some(why) = plugin_panicked(&stderr) {
            panic!("child {}: {why}; stderr:\n{stderr}", self.name);
        }
        Finished {
            success: status.success(),
            status: status.to_string(),
            stdout: out.join("\n"),
            stderr,
        }
    }
}

/// `RESULT key=` from both children, each value; where either gives none, panics with what
/// both printed (a rank that fails often does so because its peer died first).
pub fn read_both(a: &mut ChildTest, b: &mut ChildTest, key: &str) -> [String; 2] {
    let first = read_or_tell(a, b, key);
    let second = read_or_tell(b, a, key);
    [first, second]
}

/// `RESULT key=` from `one`; where it gives none, panics with what both printed.
fn read_or_tell(one: &mut ChildTest, other: &mut ChildTest, key: &str) -> String {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| one.read_result(key))) {
        Ok(v) => v,
        Err(e) => {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{why}\n--- its peer: {}", other.kill_for_output());
        }
    }
}

/// Whether a child's stderr shows a panic inside the plugin: one caught at the C boundary
/// (its WARN), or one in a thread of the plugin's own (Rust's message names a file of the
/// plugin's `src/`). Test code panics in `tests/`.
pub fn plugin_panicked(stderr: &str) -> Option<String> {
    if stderr.contains("this is a plugin bug, please report it") {
        return Some("the plugin caught a panic at its C boundary".into());
    }
    stderr
        .lines()
        .find(|l| l.contains("panicked at src/") || l.contains("panicked at host/src/"))
        .map(|l| format!("a plugin thread panicked ({l})"))
}

/// Starts rank `i` of a scenario as child test `name` with `env`: on this host, or on test
/// host `i` (`hosts::Hosts::spawn`), so one scenario runs both ways.
pub type Spawner<'a> = dyn Fn(usize, &str, &[(String, String)]) -> ChildTest + 'a;

/// Runs a child test to completion and returns what it printed.
pub fn run_child(name: &str, env: &[(String, String)], timeout: Duration) -> Finished {
    spawn_child(name, env, timeout).finish()
}

/// Runs a child test and fails with its output if it failed.
pub fn run_child_ok(name: &str, env: &[(String, String)], timeout: Duration) -> Finished {
    let f = run_child(name, env, timeout);
    assert!(
        f.success,
        "child {name} failed ({})\n--- stdout\n{}\n--- stderr\n{}",
        f.status, f.stdout, f.stderr
    );
    f
}

/// Removes the shared-memory files shm endpoints of the exited process `pid` left in /dev/shm
/// (16 MiB each): a killed child cannot clean up, and neither can one whose endpoints were
/// deliberately kept open (a close with requests in flight).
fn remove_shm_files(pid: u32) {
    let prefix = pid.to_string();
    let ours = |name: &str| {
        name.strip_prefix(&prefix)
            .is_some_and(|rest| rest.starts_with(['-', ':']))
    };
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if ours(&entry.file_name().to_string_lossy()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// True inside a child started by [`spawn_child`] for `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var("NFAB_CHILD").is_ok_and(|v| v == name)
}

/// Reads one line from stdin (a child receiving a handle from its parent) with a deadline.
pub fn read_stdin_line(timeout: Duration) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(timeout)
        .expect("a line from the parent in time")
}

/// The two-process handshake of a rank: listen, print `RESULT handle=…`, read the peer's
/// handle from stdin, then connect and accept (accept first when `accept_first`: the two
/// ranks must take opposite orders). Returns (sendComm, recvComm, listenComm).
pub fn meet_peer(
    lib: &PluginLib,
    deadline: Instant,
    accept_first: bool,
) -> (nccl_net_host::Ptr, nccl_net_host::Ptr, nccl_net_host::Ptr) {
    let (handle, listen) = lib.listen(0).expect("listen");
    println!("RESULT handle={}", nccl_net_host::handle_to_hex(&handle));
    let line = read_stdin_line(deadline.saturating_duration_since(Instant::now()));
    let mut peer = nccl_net_host::handle_from_hex(&line).expect("peer handle");
    if accept_first {
        let recv = lib.accept_until(listen, deadline).expect("accept");
        let send = lib.connect_until(0, &mut peer, deadline).expect("connect");
        (send, recv, listen)
    } else {
        let send = lib.connect_until(0, &mut peer, deadline).expect("connect");
        let recv = lib.accept_until(listen, deadline).expect("accept");
        (send, recv, listen)
    }
}

/// Counts open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Heap bytes in use (malloc'ed plus mmap'ed by malloc), from glibc's `mallinfo2`: unlike
/// RSS, it does not count memory the allocator keeps after a free.
pub fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

/// Resident set size of this process, in KiB.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The resident set size once it has stopped growing (the same for half a second), or as it
/// is after `limit`: an rxm endpoint fills its buffer pools (60 MiB with the plugin's eager
/// buffers) in its first turns after a connection, which may come after the call that made
/// the comm has returned.
pub fn settled_rss_kib(limit: Duration) -> u64 {
    let end = Instant::now() + limit;
    let (mut last, mut since) = (rss_kib(), Instant::now());
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        let now = rss_kib();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_millis(500) {
            break;
        }
    }
    last
}

/// Deterministic payload for message `i` of `len` bytes.
pub fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(131) ^ (j >> 8)) as u8)
        .collect()
}

/// Runs `cmd` to its end with its output captured; kills it and fails the test past
/// `timeout`.
pub fn run_command(cmd: &mut Command, timeout: Duration) -> std::process::Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn command");
    wait_output(child, &format!("{cmd:?}"), timeout)
}

/// Waits for `child` to end, draining whichever of its stdout and stderr are still piped
/// (so a chatty child never blocks on a full pipe); kills it and fails the test past
/// `timeout`.
pub fn wait_output(mut child: Child, what: &str, timeout: Duration) -> std::process::Output {
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout.mul_f64(slow());
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Builds `tests/fault/NAME.c` into a preload library against the libfabric headers in use
/// (`LIBFABRIC_DIR`, else the system's) and returns its path.
pub fn preload_library(name: &str) -> std::path::PathBuf {
    let out = std::env::temp_dir().join(format!("nfab-{name}-{}.so", std::process::id()));
    let mut cc = std::process::Command::new("cc");
    if let Ok(dir) = std::env::var("LIBFABRIC_DIR") {
        if !dir.is_empty() {
            cc.arg(format!("-I{dir}/include"));
        }
    }
    let status = cc
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(format!(
            "{}/tests/fault/{name}.c",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg("-ldl")
        .status()
        .expect("cc (scripts/setup-debian.sh installs it)");
    assert!(status.success(), "building tests/fault/{name}.c failed");
    out
}
