//! `nccl-net-fabric conform`: NCCL's call pattern against one provider, in two processes,
//! through the plugin's exported table, one row per check.
//!
//! The initiator writes the report; the responder follows its steps. On one host the
//! initiator starts the responder itself (this tool again, `--responder-of`); across hosts
//! one side runs `--listen PORT` and the other `--peer HOST:PORT`. The two talk over a plain
//! TCP link (`link`); every step has a deadline, so a provider that hangs fails its row.

mod attrs;
mod checks;
mod cuda;
mod link;
mod raw;

use crate::doctor::json_str;
use checks::Ctx;
use link::Link;
use nccl_net_host::PluginLib;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What the command line asked for.
pub struct Args {
    pub provider: Option<String>,
    pub domain: Option<String>,
    pub json: bool,
    pub peer: Option<String>,
    pub listen: Option<u16>,
    pub responder_of: Option<String>,
    pub plugin: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    Pass,
    Fail,
    /// The provider (or the plugin on it) does not offer what the check needs.
    NotOffered,
    /// A figure or a fact, nothing to pass.
    Info,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::NotOffered => "not offered",
            Verdict::Info => "info",
        }
    }
}

/// One line of the report.
pub struct Row {
    pub check: String,
    pub verdict: Verdict,
    /// Whether NCCL needs it: a failed needed row makes the exit code 1.
    pub needed: bool,
    pub tried: String,
    pub observed: String,
    pub meaning: String,
}

impl Row {
    pub fn new(
        check: &str,
        verdict: Verdict,
        needed: bool,
        tried: &str,
        observed: String,
        meaning: &str,
    ) -> Row {
        Row {
            check: check.into(),
            verdict,
            needed,
            tried: tried.into(),
            observed,
            meaning: meaning.into(),
        }
    }
}

/// The plugin library: the one given, else the one beside this tool.
fn plugin_path(given: &Option<PathBuf>) -> Result<PathBuf, String> {
    match given {
        Some(p) => Ok(p.clone()),
        None => {
            PluginLib::find().map_err(|tried| {
                format!(
                "no plugin library beside this tool (looked for {}); give one with --plugin PATH",
                tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            )
            })
        }
    }
}

/// The provider and domain settings both sides run with.
fn apply(provider: &str, domain: &str) {
    // Set before any thread of this process starts and before the plugin is loaded.
    if provider != "-" {
        std::env::set_var("NCCL_FABRIC_PROVIDER", provider);
        if provider == "tcp" {
            std::env::set_var("NCCL_FABRIC_ALLOW_NATIVE_TCP", "yes");
        }
    }
    if domain != "-" {
        std::env::set_var("NCCL_FABRIC_DOMAINS", domain);
    }
}

fn load(plugin: &Option<PathBuf>) -> Result<PluginLib, String> {
    let lib = PluginLib::open(&plugin_path(plugin)?)?;
    lib.init(true)
        .map_err(|e| format!("init failed ({}): see the WARN line", e.code))?;
    Ok(lib)
}

pub fn run(args: Args) -> ExitCode {
    match (&args.listen, &args.responder_of) {
        (Some(port), _) => respond(&args, Side::Listen(*port)),
        (None, Some(addr)) => respond(&args, Side::Connect(addr.clone())),
        (None, None) => initiate(&args),
    }
}

enum Side {
    Listen(u16),
    Connect(String),
}

/// The responder: waits for the initiator, then does its half of each check.
fn respond(args: &Args, side: Side) -> ExitCode {
    let deadline = Instant::now() + Duration::from_secs(600);
    let link = match side {
        Side::Listen(port) => TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| format!("cannot listen on port {port}: {e}"))
            .and_then(|l| {
                eprintln!(
                    "conform: waiting for the other side on port {}",
                    l.local_addr().map(|a| a.port()).unwrap_or(port)
                );
                Link::accept(&l, deadline)
            }),
        Side::Connect(addr) => Link::connect(&addr, Instant::now() + Duration::from_secs(30)),
    };
    let mut link = match link {
        Ok(l) => l,
        Err(e) => {
            eprintln!("conform: {e}");
            return ExitCode::from(1);
        }
    };
    let setup = match link.expect("SETUP", deadline) {
        Ok(w) if w.len() == 2 => w,
        other => {
            eprintln!("conform: no set-up from the other side: {other:?}");
            return ExitCode::from(1);
        }
    };
    apply(&setup[0], &setup[1]);
    let lib = match load(&args.plugin) {
        Ok(l) => l,
        Err(e) => {
            let _ = link.send(&["FAILED", &e.replace(' ', "_")]);
            return ExitCode::from(1);
        }
    };
    if link.send(&["READY"]).is_err() {
        return ExitCode::from(1);
    }
    let mut ctx = Ctx {
        lib,
        link,
        initiator: false,
        dev: 0,
    };
    loop {
        let words = match ctx.link.recv(deadline) {
            Ok(w) => w,
            Err(_) => return ExitCode::SUCCESS,
        };
        match words.first().map(String::as_str) {
            Some("RUN") => {
                let name = words.get(1).cloned().unwrap_or_default();
                let outcome = step(&mut ctx, &name);
                let text = match outcome {
                    Ok(t) => format!("OK {}", t.replace(char::is_whitespace, "_")),
                    Err(e) => format!("ERR {}", e.replace(char::is_whitespace, "_")),
                };
                if ctx.link.send(&["DONE", &text]).is_err() {
                    return ExitCode::from(1);
                }
            }
            Some("BYE") | None => return ExitCode::SUCCESS,
            Some(other) => {
                eprintln!("conform: unknown step {other}");
                return ExitCode::from(1);
            }
        }
    }
}

/// Deadline of one check.
const CHECK_TIME: Duration = Duration::from_secs(60);

/// One check, this side's half.
fn step(ctx: &mut Ctx, name: &str) -> checks::Outcome {
    let deadline = Instant::now() + CHECK_TIME;
    match name {
        "comms1" => checks::many(ctx, 1, deadline),
        "comms16" => checks::many(ctx, 16, deadline),
        "comms256" => checks::many(ctx, 256, deadline),
        "cycles" => checks::cycles(ctx, 20, deadline),
        "transfers" => checks::transfers(ctx, deadline),
        "grouped" => checks::grouped(ctx, deadline),
        "truncated" => checks::truncated(ctx, deadline),
        "idle" => checks::idle(ctx, deadline),
        "close" => checks::close_in_flight(ctx, deadline),
        "latency" => checks::latency(ctx, deadline),
        "bandwidth" => checks::bandwidth(ctx, deadline),
        "raw" => raw::measure(ctx, deadline),
        "gpu" => cuda::transfer(ctx, deadline),
        "killed" => checks::peer_killed(ctx, deadline),
        other => Err(format!("no check called {other}")),
    }
}

/// Runs one check on both sides: this side's and the other side's outcome.
fn both(ctx: &mut Ctx, name: &str) -> (checks::Outcome, checks::Outcome) {
    if let Err(e) = ctx.link.send(&["RUN", name]) {
        return (Err(e.clone()), Err(e));
    }
    let mine = step(ctx, name);
    let theirs = match ctx.link.expect(
        "DONE",
        Instant::now() + CHECK_TIME + Duration::from_secs(10),
    ) {
        Ok(w) => {
            let text = w.get(1).map(|t| t.replace('_', " ")).unwrap_or_default();
            match w.first().map(String::as_str) {
                Some("OK") => Ok(text),
                _ => Err(text),
            }
        }
        Err(e) => Err(e),
    };
    (mine, theirs)
}

/// The initiator: starts or reaches the responder, runs every check, writes the report.
fn initiate(args: &Args) -> ExitCode {
    let provider = args.provider.clone().unwrap_or_else(|| "-".into());
    let domain = args.domain.clone().unwrap_or_else(|| "-".into());
    apply(&provider, &domain);
    // The plugin sets rxm's and tcp's pool sizes before libfabric first reads them; this
    // side reads libfabric before loading the plugin, so it sets them first (rxm refuses
    // connections between endpoints of different eager sizes).
    let _ = nccl_net_fabric::quirks::apply_defaults();
    let mut rows = attrs::rows();
    let capture = Capture::start();
    let result = pair_up(args, &provider, &domain).and_then(|link| {
        let lib = load(&args.plugin)?;
        Ok(Ctx {
            lib,
            link,
            initiator: true,
            dev: 0,
        })
    });
    match result {
        Ok(mut ctx) => rows.extend(run_checks(&mut ctx, &capture)),
        Err(e) => rows.push(Row::new(
            "two processes through the plugin's table",
            Verdict::Fail,
            true,
            "load the plugin and init in both processes",
            e,
            "NCCL cannot use this provider through the plugin at all",
        )),
    }
    drop(capture);
    report(&rows, args.json)
}

/// The link to the responder: started here (one host) or reached at `--peer`.
fn pair_up(args: &Args, provider: &str, domain: &str) -> Result<Link, String> {
    let start = Instant::now() + Duration::from_secs(30);
    let mut link = match &args.peer {
        Some(addr) => Link::connect(addr, start)?,
        None => {
            let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("link: {e}"))?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut cmd = std::process::Command::new(exe);
            cmd.args(["conform", "--responder-of", &format!("127.0.0.1:{port}")]);
            if let Some(p) = &args.plugin {
                cmd.arg("--plugin").arg(p);
            }
            cmd.stdout(std::process::Stdio::null());
            if std::env::var_os("NFAB_CONFORM_VERBOSE").is_none() {
                cmd.stderr(std::process::Stdio::null());
            }
            cmd.spawn()
                .map_err(|e| format!("could not start the responder: {e}"))?;
            Link::accept(&listener, start)?
        }
    };
    link.send(&["SETUP", provider, domain])?;
    match link.recv(start + Duration::from_secs(30))?.as_slice() {
        [w] if w == "READY" => Ok(link),
        [w, why] if w == "FAILED" => Err(format!("the other side: {}", why.replace('_', " "))),
        other => Err(format!("the other side said {other:?}")),
    }
}

/// This process's stderr, kept in a file while the checks run, so each row can quote the
/// plugin's WARN lines it caused.
struct Capture {
    file: Option<std::fs::File>,
    saved: i32,
    path: PathBuf,
}

impl Capture {
    fn start() -> Capture {
        let path = std::env::temp_dir().join(format!(
            "nccl-net-fabric-conform-{}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&path).ok();
        let mut saved = -1;
        if let Some(f) = &file {
            use std::os::fd::AsRawFd;
            // SAFETY: dup and dup2 on this process's own descriptors; stderr is restored in
            // Drop.
            unsafe {
                saved = libc::dup(2);
                libc::dup2(f.as_raw_fd(), 2);
            }
        }
        Capture { file, saved, path }
    }

    /// A line on the real stderr: which check runs now.
    fn say(&self, text: &str) {
        if self.saved >= 0 {
            let line = format!("conform: {text}\n");
            // SAFETY: writes a buffer of its length to the saved stderr descriptor.
            unsafe { libc::write(self.saved, line.as_ptr().cast(), line.len()) };
        }
    }

    /// Where the capture is now.
    fn mark(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// The WARN lines written since `mark`.
    fn warnings_since(&self, mark: u64) -> Vec<String> {
        let text = std::fs::read(&self.path).unwrap_or_default();
        let new =
            String::from_utf8_lossy(text.get(mark as usize..).unwrap_or_default()).into_owned();
        new.lines()
            .filter(|l| l.contains("WARN"))
            .map(|l| {
                l.split("NET/Fabric : ")
                    .last()
                    .unwrap_or(l)
                    .chars()
                    .take(240)
                    .collect()
            })
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.saved >= 0 {
            // SAFETY: restores the descriptor saved in `start`.
            unsafe {
                libc::dup2(self.saved, 2);
                libc::close(self.saved);
            }
        }
        self.file.take();
        // NFAB_CONFORM_VERBOSE keeps this side's log (and shows the responder's).
        match std::env::var_os("NFAB_CONFORM_VERBOSE") {
            Some(_) => eprintln!("conform: this side's log is {}", self.path.display()),
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Every check in NCCL's order of things; the peer-death check last (the responder is gone
/// after it).
fn run_checks(ctx: &mut Ctx, capture: &Capture) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut figures = attrs::Figures::default();
    let gpu = cuda::available(&ctx.lib);
    // NFAB_CONFORM_CHECKS=a,b runs only those (for the tool's own tests).
    let only = std::env::var("NFAB_CONFORM_CHECKS").ok();
    for name in [
        "comms1",
        "comms16",
        "comms256",
        "cycles",
        "transfers",
        "grouped",
        "truncated",
        "idle",
        "close",
        "latency",
        "bandwidth",
        "raw",
        "gpu",
        "killed",
    ] {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|c| c == name))
        {
            continue;
        }
        if name == "gpu" {
            rows.push(cuda::dmabuf_row(&ctx.lib));
            if let Err(why) = &gpu {
                rows.push(cuda::not_offered(why));
                continue;
            }
        }
        let mark = capture.mark();
        let t = Instant::now();
        capture.say(&format!("{name} …"));
        let (mine, theirs) = both(ctx, name);
        capture.say(&format!("{name}: {} ms", t.elapsed().as_millis()));
        let warns = capture.warnings_since(mark);
        rows.extend(attrs::judge(name, mine, theirs, &warns, &mut figures));
        if name == "killed" {
            return rows;
        }
    }
    let _ = ctx.link.send(&["BYE"]);
    rows
}

/// Prints the report; exit 0 when every check NCCL needs passed.
fn report(rows: &[Row], json: bool) -> ExitCode {
    let ok = !rows.iter().any(|r| r.needed && r.verdict == Verdict::Fail);
    let provider =
        std::env::var("NCCL_FABRIC_PROVIDER").unwrap_or_else(|_| "(the plugin's choice)".into());
    let libfabric = nccl_net_fabric::plugin::libfabric_version();
    if json {
        let mut out = format!(
            "{{\"provider\":{},\"libfabric\":{},\"passed\":{ok},\"rows\":[",
            json_str(&provider),
            json_str(&libfabric)
        );
        for (i, r) in rows.iter().enumerate() {
            let _ = write!(
                out,
                "{}{{\"check\":{},\"verdict\":{},\"needed\":{},\"tried\":{},\"observed\":{},\"meaning\":{}}}",
                if i > 0 { "," } else { "" },
                json_str(&r.check),
                json_str(r.verdict.word()),
                r.needed,
                json_str(&r.tried),
                json_str(&r.observed),
                json_str(&r.meaning)
            );
        }
        out.push_str("]}");
        println!("{out}");
    } else {
        println!("conform: provider {provider}, libfabric {libfabric}, two processes through the plugin's table");
        println!();
        for r in rows {
            println!(
                "[{:<11}] {}{}",
                r.verdict.word(),
                r.check,
                if r.needed {
                    ""
                } else {
                    " (NCCL does not need it)"
                }
            );
            println!("    tried:    {}", r.tried);
            println!("    observed: {}", r.observed);
            println!("    meaning:  {}", r.meaning);
        }
        println!();
        println!(
            "{}",
            if ok {
                "every check NCCL needs passed"
            } else {
                "a check NCCL needs FAILED: NCCL would fail or hang with this provider"
            }
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
