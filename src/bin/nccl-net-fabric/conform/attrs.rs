//! What the provider says of itself (discovery, its attributes, the plugin's verdict on
//! each), and the rows the two-process checks turn into.

use super::{Row, Verdict};
use nccl_net_fabric::discover::{discover, MR_MODE};
use nccl_net_fabric::provider::{decide, errno_name, CudaApiAnswer, Pass};
use nccl_net_fabric::settings::Settings;
use nccl_net_fabric::sys;

/// Figures one check leaves for a later one.
#[derive(Default)]
pub struct Figures {
    plugin_latency_us: Option<f64>,
    plugin_gbps: Option<f64>,
}

/// Discovery and attribute rows, from this process's own view of libfabric.
pub fn rows() -> Vec<Row> {
    let mut out = Vec::new();
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            out.push(Row::new(
                "settings",
                Verdict::Fail,
                true,
                "read NCCL_FABRIC_*",
                e.to_string(),
                "the plugin refuses to start",
            ));
            return out;
        }
    };
    let d = match discover(&settings) {
        Ok(d) => d,
        Err(e) => {
            out.push(Row::new(
                "fi_getinfo",
                Verdict::Fail,
                true,
                "fi_getinfo with the plugin's hints",
                e.to_string(),
                "libfabric offers nothing the plugin can use",
            ));
            return out;
        }
    };
    for (pass, hints) in [
        (Pass::Hmem, "FI_TAGGED|FI_MSG|FI_HMEM, FI_EP_RDM"),
        (Pass::Host, "FI_TAGGED|FI_MSG, FI_EP_RDM (host buffers)"),
    ] {
        let found: Vec<String> = d
            .candidates
            .iter()
            .filter(|c| c.pass == pass && c.setopt.is_some())
            .map(|c| format!("{} on {}", c.provider, c.domain))
            .collect();
        out.push(Row::new(
            &format!("fi_getinfo, {pass:?} pass"),
            Verdict::Info,
            false,
            hints,
            if found.is_empty() {
                "no entry the settings admit".into()
            } else {
                dedup(found).join(", ")
            },
            match pass {
                Pass::Hmem => "entries here may carry GPU buffers",
                Pass::Host => "the fallback: host buffers only",
            },
        ));
    }
    let decision = decide(&d.candidates, &settings);
    let Some(&ci) = decision.devices.first() else {
        let why = decision
            .verdicts
            .iter()
            .zip(&d.candidates)
            .find(|(_, c)| c.setopt.is_some())
            .map(|(v, c)| format!("{} on {}: {}", c.provider, c.domain, v.reason))
            .unwrap_or_else(|| "no candidate".into());
        out.push(Row::new(
            "the plugin's choice",
            Verdict::Fail,
            true,
            "the plugin's policy over every candidate",
            why,
            "NCCL gets no device from the plugin",
        ));
        return out;
    };
    let c = &d.candidates[ci];
    let info = d.info(ci);
    out.push(Row::new(
        "the plugin's choice",
        Verdict::Pass,
        true,
        "the plugin's policy over every candidate",
        format!(
            "{} on {} ({} device(s)): {}",
            c.provider,
            c.domain,
            decision.devices.len(),
            decision.verdicts[ci].reason
        ),
        "NCCL gets these devices",
    ));
    if let Some(Ok(answer)) = &c.setopt {
        let promised = CudaApiAnswer::classify(*answer) == CudaApiAnswer::Promised;
        out.push(Row::new(
            "setopt(FI_OPT_CUDA_API_PERMITTED=false)",
            if promised && c.hmem_offered() {
                Verdict::Pass
            } else {
                Verdict::NotOffered
            },
            false,
            "fi_setopt on an endpoint before fi_enable",
            format!(
                "{} ({}); FI_HMEM {}",
                errno_name(*answer),
                CudaApiAnswer::classify(*answer).describe(),
                if c.hmem_offered() {
                    "offered"
                } else {
                    "not offered"
                }
            ),
            if decision.gpu {
                "NCCL may hand the plugin GPU buffers (NCCL_PTR_CUDA)"
            } else {
                "host buffers only: NCCL copies GPU data through host memory"
            },
        ));
    }
    let av = match info.av_type() {
        sys::FI_AV_MAP => "FI_AV_MAP",
        sys::FI_AV_TABLE => "FI_AV_TABLE",
        _ => "FI_AV_UNSPEC (the provider's choice)",
    };
    out.push(Row::new(
        "address vector",
        Verdict::Pass,
        true,
        "domain_attr->av_type",
        av.into(),
        "honoured; each endpoint's own address goes in first, so no peer is fi_addr 0",
    ));
    let known = sys::FI_CONTEXT | sys::FI_CONTEXT2;
    let other = info.mode() & !known;
    out.push(Row::new(
        "mode bits",
        if other == 0 { Verdict::Pass } else { Verdict::Fail },
        true,
        "info->mode",
        format!("{:#x}{}", info.mode(), if other != 0 { format!(" (not honoured: {other:#x})") } else { String::new() }),
        if other == 0 {
            "every operation carries an fi_context2 of the plugin's (FI_CONTEXT and FI_CONTEXT2 met)"
        } else {
            "the provider asks for a mode the plugin does not meet: operations may be corrupted"
        },
    ));
    let mr = info.mr_mode();
    let unknown = mr & !MR_MODE;
    out.push(Row::new(
        "memory registration",
        if unknown == 0 { Verdict::Pass } else { Verdict::Fail },
        true,
        "domain_attr->mr_mode",
        format!("{mr:#x}{}", if unknown != 0 { format!(" (not honoured: {unknown:#x})") } else { String::new() }),
        "LOCAL (descriptors on every operation), VIRT_ADDR, ALLOCATED, PROV_KEY (keys from the provider), ENDPOINT (bound and enabled) and HMEM are honoured",
    ));
    let bits = nccl_net_fabric::tags::offered_bits(info.mem_tag_format());
    let too_few = nccl_net_fabric::tags::too_few_bits(info.mem_tag_format());
    out.push(Row::new(
        "tag bits",
        if too_few.is_none() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        true,
        "ep_attr->mem_tag_format",
        format!("{bits} bits ({:#x})", info.mem_tag_format()),
        match (&too_few, bits) {
            (Some(_), _) => "too few for the plugin's layout (12 sequence, 8 comm id): refused",
            (None, 64) => "NCCL's tag, the comm id and a sequence number fit whole",
            (None, _) => "fewer than 64: NCCL's tag is folded first, then the comm id",
        },
    ));
    let max = info.max_msg_size();
    out.push(Row::new(
        "message sizes",
        if max >= nccl_net_fabric::discover::MIN_MAX_MSG {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        true,
        "ep_attr->max_msg_size, tx_attr->inject_size",
        format!("max_msg_size {max}, inject_size {}", info.inject_size()),
        if max >= nccl_net_fabric::device::MAX_MESSAGE_BYTES {
            "as large as any message NCCL sends"
        } else {
            "NCCL is told the largest message (maxP2pBytes, maxCollBytes); its steps are \
             NCCL_BUFFSIZE / 8 (512 KiB by default)"
        },
    ));
    let (data, control) = info.progress();
    let word = |p: sys::fi_progress| {
        if p == sys::FI_PROGRESS_MANUAL {
            "manual"
        } else if p == sys::FI_PROGRESS_AUTO {
            "auto"
        } else {
            "unspec"
        }
    };
    out.push(Row::new(
        "progress",
        Verdict::Pass,
        true,
        "domain_attr->data_progress, control_progress",
        format!("data {}, control {}", word(data), word(control)),
        "the plugin drives every endpoint itself (progress threads or NCCL's calls), so manual progress is met; the idle check shows what happens while one side makes no calls",
    ));
    let threading = info.threading();
    out.push(Row::new(
        "threading",
        if threading == sys::FI_THREAD_SAFE { Verdict::Pass } else { Verdict::Info },
        false,
        "domain_attr->threading (the plugin asks for FI_THREAD_SAFE)",
        match threading {
            sys::FI_THREAD_SAFE => "FI_THREAD_SAFE".to_string(),
            sys::FI_THREAD_DOMAIN => "FI_THREAD_DOMAIN".to_string(),
            sys::FI_THREAD_COMPLETION => "FI_THREAD_COMPLETION".to_string(),
            sys::FI_THREAD_ENDPOINT => "FI_THREAD_ENDPOINT".to_string(),
            other => format!("{other}"),
        },
        "each endpoint has one driver, so a weaker model would do; FI_THREAD_SAFE is what the plugin asks for",
    ));
    if let Some(n) = &c.names {
        out.push(Row::new(
            "endpoint names",
            Verdict::Pass,
            true,
            "fi_getname on the probe endpoint",
            format!("{} bytes", n.len),
            match &n.control_elsewhere {
                Some(why) => why.as_str(),
                None => "they fit NCCL's 128-byte handle (86 bytes): the handshake runs over the provider itself",
            },
        ));
    }
    out
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    let mut seen = Vec::new();
    v.retain(|x| {
        let new = !seen.contains(x);
        seen.push(x.clone());
        new
    });
    v
}

fn with_warns(text: String, warns: &[String]) -> String {
    match warns.first() {
        None => text,
        Some(w) => format!(
            "{text}; WARN: {w}{}",
            if warns.len() > 1 {
                format!(" (+{} more)", warns.len() - 1)
            } else {
                String::new()
            }
        ),
    }
}

/// The number after `word` in `text` (`"… call 12 ms"` → 12 for `call`).
fn number_after(text: &str, word: &str) -> Option<f64> {
    let mut it = text.split_whitespace();
    it.by_ref().find(|w| *w == word)?;
    it.next()?.parse().ok()
}

/// The rows of one two-sided check from both sides' outcomes.
pub fn judge(
    name: &str,
    mine: Result<String, String>,
    theirs: Result<String, String>,
    warns: &[String],
    figures: &mut Figures,
) -> Vec<Row> {
    let failed = |check: &str, tried: &str, meaning: &str| -> Option<Row> {
        let why = match (&mine, &theirs) {
            (Err(e), _) => format!("this side: {e}"),
            (_, Err(e)) => format!("the other side: {e}"),
            _ => return None,
        };
        Some(Row::new(
            check,
            Verdict::Fail,
            true,
            tried,
            with_warns(why, warns),
            meaning,
        ))
    };
    let ok =
        |check: &str, pass: bool, needed: bool, tried: &str, observed: String, meaning: &str| {
            vec![Row::new(
                check,
                if pass { Verdict::Pass } else { Verdict::Fail },
                needed,
                tried,
                with_warns(observed, warns),
                meaning,
            )]
        };
    match name {
        "comms1" | "comms16" | "comms256" => {
            let n = &name[5..];
            let check = format!("{n} comm pair(s) each way");
            let tried = format!("listen {n} times on each side, connect and accept without blocking until all are up, a 4 KiB message on each, close");
            let meaning = "NCCL opens a comm per channel and peer from its proxy thread; a call that blocks stalls every other connection";
            if let Some(r) = failed(&check, &tried, meaning) {
                return vec![r];
            }
            let text = mine.unwrap_or_default();
            let longest = number_after(&text, "call").unwrap_or(f64::MAX);
            ok(
                &check,
                longest < 1000.0,
                true,
                &tried,
                format!("{text} (a call must return within 1000 ms)"),
                meaning,
            )
        }
        "cycles" => {
            let tried = "connect a pair, a message, close: 20 times";
            let meaning = "NCCL creates and destroys communicators one after another (PyTorch process groups)";
            failed("reconnect cycles", tried, meaning)
                .map(|r| vec![r])
                .unwrap_or_else(|| {
                    ok(
                        "reconnect cycles",
                        true,
                        true,
                        tried,
                        mine.unwrap_or_default(),
                        meaning,
                    )
                })
        }
        "transfers" => {
            let tried =
                "tagged isend/irecv from this side to the other, every message checked on arrival";
            let meaning = "NCCL's steps are these sizes; 0-byte messages carry its flags";
            if let Some(r) = failed("tagged send/recv", tried, meaning) {
                return vec![r];
            }
            let (mine, theirs) = (mine.unwrap_or_default(), theirs.unwrap_or_default());
            let mut rows = Vec::new();
            for ((m, t), &(size, count, window)) in mine
                .split(',')
                .zip(theirs.split(','))
                .zip(super::checks::SIZES)
            {
                let gbps: f64 = m
                    .rsplit(':')
                    .next()
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(0.0);
                let good: usize = t
                    .split(':')
                    .nth(2)
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(0);
                rows.push(Row::new(
                    &format!("tagged send/recv {}", human(size)),
                    if good == count { Verdict::Pass } else { Verdict::Fail },
                    true,
                    &format!("{count} messages of {size} bytes, {window} in flight, checked on arrival"),
                    with_warns(format!("{good} of {count} intact ({gbps:.3} GB/s, writing and checking the data included)"), warns),
                    meaning,
                ));
            }
            rows
        }
        "grouped" => {
            let tried =
                "one irecv of 8 buffers with tags 5,2,7,0,3,6,1,4; the 8 sends in another order";
            let meaning = "NCCL groups receives of a shared connection (maxRecvs) and matches each buffer by its tag";
            failed("grouped receive of 8", tried, meaning)
                .map(|r| vec![r])
                .unwrap_or_else(|| {
                    ok(
                        "grouped receive of 8",
                        true,
                        true,
                        tried,
                        theirs.unwrap_or_default(),
                        meaning,
                    )
                })
        }
        "truncated" => {
            let tried = "a 4 KiB receive for an 8 KiB send";
            let meaning = "NCCL never does this; when a bug does, the receive must fail, never complete with part of the data or hang";
            if let Some(r) = failed("receive smaller than its send", tried, meaning) {
                return vec![r];
            }
            let said = theirs.unwrap_or_default();
            ok(
                "receive smaller than its send",
                said.starts_with("failed"),
                true,
                tried,
                format!("the receive {said}"),
                meaning,
            )
        }
        "idle" => {
            let tried = "the other side posts 16 receives of 64 KiB and one of 8 MiB, then makes no call for 3 s; this side sends";
            let meaning = "NCCL's proxy keeps calling test while anything is posted, so a provider that moves data only inside calls still works; a side that stops calling (a blocked proxy) then holds its peers' sends";
            if let Some(r) = failed("sends while the receiver makes no calls", tried, meaning) {
                return vec![r];
            }
            let text = mine.unwrap_or_default();
            let within = text.ends_with("within");
            vec![Row::new(
                "sends while the receiver makes no calls",
                if within { Verdict::Pass } else { Verdict::Fail },
                false,
                tried,
                with_warns(
                    format!("the sends finished {text} the receiver's idle time"),
                    warns,
                ),
                meaning,
            )]
        }
        "close" => {
            let tried = "8 requests of 1 MiB posted each way, deregistered and closed at once; then a new pair moves 2 MiB";
            let meaning =
                "NCCL closes comms with requests in flight when a communicator is aborted";
            if let Some(r) = failed("closes with requests in flight", tried, meaning) {
                return vec![r];
            }
            let text = mine.unwrap_or_default();
            let ms = number_after(&text, "in").unwrap_or(f64::MAX);
            ok(
                "closes with requests in flight",
                ms < 2000.0,
                true,
                tried,
                text,
                meaning,
            )
        }
        "latency" => {
            let tried = "8-byte ping-pong through the plugin, 1000 round trips";
            if let Some(r) = failed("8-byte latency (plugin)", tried, "") {
                return vec![r];
            }
            let us: f64 = mine.unwrap_or_default().parse().unwrap_or(0.0);
            figures.plugin_latency_us = Some(us);
            vec![Row::new(
                "8-byte latency (plugin)",
                Verdict::Info,
                false,
                tried,
                format!("{us:.1} µs (half a round trip)"),
                "NCCL's small collectives are bound by it",
            )]
        }
        "bandwidth" => {
            let tried = "1 MiB x 64 through the plugin, 8 in flight, the data not touched";
            if let Some(r) = failed("bandwidth (plugin)", tried, "") {
                return vec![r];
            }
            let gbps: f64 = mine.unwrap_or_default().parse().unwrap_or(0.0);
            figures.plugin_gbps = Some(gbps);
            vec![Row::new(
                "bandwidth (plugin)",
                Verdict::Info,
                false,
                tried,
                format!("{gbps:.3} GB/s one way"),
                "what one NCCL channel can move through this provider",
            )]
        }
        "raw" => {
            let tried = "the same provider without the plugin: an endpoint per side, 8-byte ping-pong and 1 MiB x 64 (8 in flight)";
            let meaning = "what the plugin adds to the provider (the plugin's figures are from the rows above)";
            if let Some(r) = failed("raw libfabric beside the plugin", tried, meaning) {
                return vec![Row {
                    verdict: Verdict::Info,
                    needed: false,
                    ..r
                }];
            }
            let text = mine.unwrap_or_default();
            let mut parts = text.split(':');
            let lat: f64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0.0);
            let gbps: f64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0.0);
            let plugin = match (figures.plugin_latency_us, figures.plugin_gbps) {
                (Some(pl), Some(pg)) if lat > 0.0 && gbps > 0.0 => format!(
                    "; the plugin: {pl:.1} µs ({:.2}x raw), {pg:.3} GB/s ({:.2}x raw)",
                    pl / lat,
                    pg / gbps
                ),
                _ => String::new(),
            };
            vec![Row::new(
                "raw libfabric beside the plugin",
                Verdict::Info,
                false,
                tried,
                format!("raw {lat:.1} µs, {gbps:.3} GB/s{plugin}"),
                meaning,
            )]
        }
        "gpu" => super::cuda::judge(mine, theirs, warns),
        "killed" => {
            let tried = "the other process kills itself (SIGKILL) while this side streams 1 MiB sends to it";
            let meaning = "NCCL must learn of a dead peer as an error (ncclRemoteError), not hang";
            if let Err(e) = &mine {
                return vec![Row::new(
                    "a peer killed mid-stream",
                    Verdict::Fail,
                    true,
                    tried,
                    with_warns(e.clone(), warns),
                    meaning,
                )];
            }
            let text = mine.unwrap_or_default();
            let ms = number_after(&text, "after").unwrap_or(f64::MAX);
            ok(
                "a peer killed mid-stream",
                text.contains("returned 6") && ms < 15000.0,
                true,
                tried,
                format!("{text} (ncclRemoteError is 6; within 15 s)"),
                meaning,
            )
        }
        other => vec![Row::new(
            other,
            Verdict::Fail,
            true,
            "",
            "no such check".into(),
            "",
        )],
    }
}

fn human(n: usize) -> String {
    match n {
        0 => "0 B".into(),
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}
