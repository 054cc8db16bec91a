//! The declarative table of settings: each variable's name, kind, default and meaning;
//! docs/settings.md's table written from it; names in the environment that are no setting.

/// What kind of value a setting takes.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// One of a fixed set of words.
    Choice(&'static [&'static str]),
    /// A comma-separated list of names (may be empty).
    List,
    /// An unsigned integer within bounds.
    Number { min: u64, max: u64 },
}

/// One environment variable: its name, kind, default and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub name: &'static str,
    pub kind: Kind,
    pub default: &'static str,
    pub meaning: &'static str,
}

pub const HMEM: &str = "NCCL_FABRIC_HMEM";
pub const PROVIDER: &str = "NCCL_FABRIC_PROVIDER";
pub const DOMAINS: &str = "NCCL_FABRIC_DOMAINS";
pub const EXCLUDE_DOMAINS: &str = "NCCL_FABRIC_EXCLUDE_DOMAINS";
pub const ENDPOINTS: &str = "NCCL_FABRIC_ENDPOINTS";
pub const CONNECT_TIMEOUT_MS: &str = "NCCL_FABRIC_CONNECT_TIMEOUT_MS";
pub const CLOSE_TIMEOUT_MS: &str = "NCCL_FABRIC_CLOSE_TIMEOUT_MS";
pub const LINGER_MS: &str = "NCCL_FABRIC_LANE_LINGER_MS";
pub const STALL_WARN_MS: &str = "NCCL_FABRIC_STALL_WARN_MS";
pub const SPEED_MBPS: &str = "NCCL_FABRIC_SPEED_MBPS";
pub const ALLOW_TCP_RDM: &str = "NCCL_FABRIC_ALLOW_NATIVE_TCP";
pub const MERGE: &str = "NCCL_FABRIC_MERGE";
pub const LOG: &str = "NCCL_FABRIC_LOG";
pub const PROGRESS_THREAD: &str = "NCCL_FABRIC_PROGRESS_THREAD";
pub const PROGRESS_SPIN_US: &str = "NCCL_FABRIC_PROGRESS_SPIN_US";
pub const INLINE_POST_BYTES: &str = "NCCL_FABRIC_INLINE_POST_BYTES";
pub const LANES: &str = "NCCL_FABRIC_LANES";
pub const FLOWS: &str = "NCCL_FABRIC_FLOWS";
pub const THREADS: &str = "NCCL_FABRIC_THREADS";
pub const PEER_TIMEOUT_MS: &str = "NCCL_FABRIC_PEER_TIMEOUT_MS";
pub const MAX_RECVS: &str = "NCCL_FABRIC_MAX_RECVS";
pub const PIECE_BYTES: &str = "NCCL_FABRIC_PIECE_BYTES";
pub const TIMES: &str = "NCCL_FABRIC_TIMES";
pub const CONTROL_PROVIDER: &str = "NCCL_FABRIC_CONTROL_PROVIDER";

pub const TABLE: &[Setting] = &[
    Setting {
        name: HMEM,
        kind: Kind::Choice(&["auto", "require", "off", "force"]),
        default: "auto",
        meaning: "GPU buffers (FI_HMEM): `auto` uses them when a provider qualifies, else host \
                  buffers; `require` fails init unless one qualifies; `off` uses host buffers only; \
                  `force` also accepts an FI_HMEM provider that does not know \
                  FI_OPT_CUDA_API_PERMITTED (the promise of no CUDA calls is then yours)",
    },
    Setting {
        name: PROVIDER,
        kind: Kind::List,
        default: "",
        meaning: "libfabric providers to use, in order of preference (e.g. `shm,tcp;ofi_rxm`); \
                  empty = any. libfabric's own `FI_PROVIDER` still applies underneath",
    },
    Setting {
        name: DOMAINS,
        kind: Kind::List,
        default: "",
        meaning: "only these domains (interfaces such as `eth0`, or `shm`) become NCCL devices, \
                  `lo` included; empty = every interface of the chosen provider, loopback only \
                  where there is no other. A trailing `*` matches a prefix",
    },
    Setting {
        name: EXCLUDE_DOMAINS,
        kind: Kind::List,
        default: "docker*,virbr*,veth*",
        meaning: "domains never used (a trailing `*` matches a prefix)",
    },
    Setting {
        name: ENDPOINTS,
        kind: Kind::Choice(&["auto", "device", "comm"]),
        default: "auto",
        meaning: "`device`: per device, `NCCL_FABRIC_LANES` endpoints for the receiving comms \
                  and as many for the sending comms of the process, kept apart by tags; `comm`: \
                  one endpoint per comm \
                  (no sharing between NCCL's threads, but slower to connect with tcp;ofi_rxm); \
                  `auto`: `comm` for shm and sm2, `device` otherwise",
    },
    Setting {
        name: FLOWS,
        kind: Kind::Number { min: 0, max: crate::tags::MAX_FLOWS as u64 },
        default: "0",
        meaning: "connections each comm stripes its long messages over (each a lane of its \
                  device, see NCCL_FABRIC_LANES): a message longer than NCCL_FABRIC_PIECE_BYTES \
                  goes as up to one piece per flow, all at once, so a network that caps every \
                  TCP flow (clouds do) carries that many flows' worth. Flows cost no threads; \
                  where they outnumber the lanes, each pairs a sending lane with a receiving \
                  one of its own (L lanes a side carry up to L x L flows). \
                  On a comm of 3 flows or more the first carries whole messages and headers, \
                  the others the pieces. \
                  0 = the device's speed over 500 Mbps per flow, from 1 to 33 (33 for 16.5 \
                  Gbps and up, and where a NIC reports no speed: 32 for pieces); 1 over shared \
                  memory, with an endpoint per comm, where messages go \
                  whole, and for a rank bound to one CPU",
    },
    Setting {
        name: LANES,
        kind: Kind::Number { min: 0, max: 64 },
        default: "0",
        meaning: "with endpoints shared per device: how many receiving and how many sending \
                  endpoints (each on a libfabric domain of its own) each device has; comms \
                  start on them in turn (a set of flows apart where they hold several sets, so \
                  that each comm's flows are connections of its own), and a comm's flows are \
                  the lanes from its first on. \
                  0 = the device's flows, up to 12 on one NIC (the flows beyond pair lanes) and \
                  all of them over several NICs (33 a side with the default flows), each an endpoint of about \
                  60 MiB over tcp;ofi_rxm (rxm's pools of 33 KiB eager buffers), or where messages go whole, by the CPUs of this rank and the devices in use: (CPUs - 2) / (3 x devices), from 1 to 4",
    },
    Setting {
        name: THREADS,
        kind: Kind::Number { min: 0, max: 64 },
        default: "0",
        meaning: "progress threads per device, which drive all of its endpoints between them \
                  (see NCCL_FABRIC_PROGRESS_THREAD). 0 = by the CPUs of this rank (those it \
                  may use, divided among the machine's ranks when they share them): half \
                  of them, at least 2 and at most 8, shared by the devices in use",
    },
    Setting {
        name: CONTROL_PROVIDER,
        kind: Kind::List,
        default: "",
        meaning: "providers for the handshake and liveness probes, in order of preference: \
                  empty = the data provider itself where its endpoint names fit NCCL's \
                  128-byte handle (86 bytes), else the first of `tcp;ofi_rxm`, `tcp`, \
                  `sockets`, `udp;ofi_rxd` on an interface of this host (the data domain's \
                  own, else `NCCL_SOCKET_IFNAME`'s, else the first that is not loopback); the \
                  data endpoints' names then travel in the handshake (ucx: 1024 bytes)",
    },
    Setting {
        name: CONNECT_TIMEOUT_MS,
        kind: Kind::Number { min: 100, max: 3_600_000 },
        default: "60000",
        meaning: "how long connect/accept wait for the peer's handshake before failing",
    },
    Setting {
        name: CLOSE_TIMEOUT_MS,
        kind: Kind::Number { min: 0, max: 600_000 },
        default: "2000",
        meaning: "close returns at once; operations a closed comm left in flight are cancelled \
                  in the background, and an endpoint the provider still holds operations on \
                  is closed after this long regardless (within 2 s of the last finalize)",
    },
    Setting {
        name: LINGER_MS,
        kind: Kind::Number { min: 0, max: 600_000 },
        default: "5000",
        meaning: "a shared endpoint (lane) stays open and connected this long after its last \
                  comm closed, for the next communicator (NCCL creates and destroys them one \
                  after another); 0 closes it with its last comm",
    },
    Setting {
        name: PEER_TIMEOUT_MS,
        kind: Kind::Number { min: 200, max: 3_600_000 },
        default: "3000",
        meaning: "a request waiting on a peer probes the peer process after a quarter of this, \
                  and fails with ncclRemoteError when the peer leaves probes unanswered this \
                  long (it exited, or its host is unreachable)",
    },
    Setting {
        name: MAX_RECVS,
        kind: Kind::Number { min: 1, max: 8 },
        default: "8",
        meaning: "buffers one receive may group (NCCL's `maxRecvs`): NCCL then gathers up to \
                  this many sends of a shared point-to-point connection in one receive",
    },
    Setting {
        name: PIECE_BYTES,
        kind: Kind::Number { min: 0, max: 1 << 30 },
        default: "262144",
        meaning: "a message longer than this is cut into pieces of at least this size (a \
                  power of two, rounded up), up to one per flow, their number rounded up to a \
                  power of two (NCCL_FABRIC_FLOWS; up to 4 on a comm of one flow), all in \
                  flight at once; the last takes the rest. The peers \
                  use the smaller of their values, and 0 (or under 4096) at either end sends \
                  whole messages (as comms over shared memory, and over rxm before libfabric \
                  2.1, always do). Unset, a device with one flow per comm that NCCL's calls drive \
                  (no progress threads) sends whole messages too: there pieces cost CPU and \
                  overlap nothing; a comm of several flows sends whole messages on its first \
                  flow until they prove slow (2 batches of 4 in a row), or until a try of \
                  pieces over all its flows (after 32 whole messages slower than 10 Gbit/s, or \
                  64 MiB of longer ones in 8 at least, then twice as many after each try that \
                  loses) moves more than 1.25 times the whole \
                  messages (a network that caps each connection, also above 500 Mbit/s); \
                  and a send comm whose messages show its flows moving under 500 Mbit/s each \
                  (8 in a row; a network that caps each connection) cuts them into pieces of \
                  32768 bytes at least, as many as the flows allow (one that cut coarsely \
                  before does so again once 64 in a row move faster); one that sent \
                  whole messages tries them again after 64 messages in pieces per flow (256 at least), then after twice \
                  as many each time they prove slow (one batch of 4 slower than 500 Mbit/s or \
                  than 0.8 times the pieces, or fewer messages where they already took longer \
                  than 4 may)",
    },
    Setting {
        name: TIMES,
        kind: Kind::Choice(&["no", "yes"]),
        default: "no",
        meaning: "`yes`: every comm says when it closes (INFO) where its requests spent their \
                  time: until the provider had all of a request's pieces, in the provider, and \
                  until NCCL's `test` saw it done (the clock is read a few times per request)",
    },
    Setting {
        name: STALL_WARN_MS,
        kind: Kind::Number { min: 0, max: 86_400_000 },
        default: "60000",
        meaning: "a request unfinished this long gets one WARN naming its peer and provider (a \
                  stalled provider or a stopped peer); 0 = never",
    },
    Setting {
        name: SPEED_MBPS,
        kind: Kind::Number { min: 0, max: 10_000_000 },
        default: "0",
        meaning: "link speed reported to NCCL, in Mbps (NCCL picks its channel count and each \
                  size's protocol by it), and the speed flows are sized for; 0 = from the \
                  provider's link attributes, else the kernel's (`/sys/class/net/<if>/speed`), \
                  else 25000 to NCCL with flows sized for 100000 (virtio and other NICs that \
                  report none), or 400000 for shm and sm2",
    },
    Setting {
        name: MERGE,
        kind: Kind::Choice(&["no", "yes"]),
        default: "no",
        meaning: "yes: one NCCL device over every NIC chosen (e.g. NCCL_FABRIC_DOMAINS=eth0,eth1), \
                  named `eth0+eth1`, whose comms stripe each long message's pieces over all of \
                  them, each NIC carrying flows in proportion to its speed (a NIC of twice the \
                  speed carries two flows for the other's one, up to 4 to 1). The flows of a \
                  comm pair NIC k with the peer's NIC k (in the order of their names), so both \
                  hosts need the same number of NICs, each reachable from its namesake. no: a device per \
                  NIC, which NCCL spreads its channels over",
    },
    Setting {
        name: ALLOW_TCP_RDM,
        kind: Kind::Choice(&["no", "yes"]),
        default: "no",
        meaning: "allow libfabric's native `tcp` RDM provider (libfabric >= 1.18), which hangs \
                  under NCCL (ofiwg/libfabric#8963); `tcp;ofi_rxm` is used otherwise",
    },
    Setting {
        name: PROGRESS_THREAD,
        kind: Kind::Choice(&["auto", "yes", "no", "both"]),
        default: "auto",
        meaning: "`yes`: a few progress threads per device (NCCL_FABRIC_THREADS) drive its \
                  endpoints, posting what NCCL's calls hand them and reading completions \
                  continuously (they spin while traffic flows, so work a provider does while \
                  posting runs there, not in NCCL's one proxy thread per GPU); `no`: NCCL's own \
                  calls drive each endpoint, one at a time; `both`: progress threads as with \
                  `yes`, and each NCCL call also takes a turn on its comm's endpoints when no \
                  thread is in one (NCCL's proxy thread then shares the provider's copies with \
                  fewer threads); `auto`: `yes` when the threads fit in this rank's CPUs beside \
                  NCCL's own 2"
    },
    Setting {
        name: INLINE_POST_BYTES,
        kind: Kind::Number { min: 0, max: 1 << 20 },
        default: "0",
        meaning: "where progress threads drive, NCCL's call itself hands a send or receive of \
                  at most this many bytes to the provider when no thread is in its endpoint \
                  and nothing posted before it waits (else the thread posts it on its next \
                  sweep); the thread still reads its completion. A small message's trip can \
                  then be one sweep shorter, for the provider's send in NCCL's proxy thread. \
                  Not for threads forced onto too few cores: they wait for one to read what \
                  the call posted (2 cores: an 8-byte ping-pong 40x slower). 0: the threads \
                  post everything",
    },
    Setting {
        name: PROGRESS_SPIN_US,
        kind: Kind::Number { min: 0, max: 10_000_000 },
        default: "20000",
        meaning: "how long a progress thread that finds nothing to do spins and yields before \
                  it sleeps in `poll` on the provider's wait object, which wakes it when data \
                  arrives, a socket takes more or NCCL hands it work (`tcp;ofi_rxm` and `tcp`; \
                  other providers' threads nap 20–200 µs instead while operations are in \
                  flight). The default outlasts the gaps between a collective's steps (0.05–1 \
                  ms), which a thread that slept would pay for in wake-ups; unset, it is 50 \
                  where the progress threads do not fit in this rank's CPUs beside NCCL's 2 \
                  (NCCL_FABRIC_PROGRESS_THREAD=yes or NCCL_FABRIC_THREADS beyond them: they \
                  would take each other's cores). With nothing in flight a thread sleeps after \
                  1 ms at most; 0 sleeps at once, 10000000 never",
    },
    Setting {
        name: LOG,
        kind: Kind::Choice(&["off", "warn", "info", "debug", "trace"]),
        default: "warn",
        meaning: "stderr log level when not running inside NCCL (tests, `nccl-net-fabric`); \
                  inside NCCL, `NCCL_DEBUG` decides",
    },
];

pub(super) fn setting(name: &str) -> &'static Setting {
    TABLE
        .iter()
        .find(|s| s.name == name)
        .expect("setting is in TABLE")
}

/// docs/settings.md's table, in Markdown.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| variable | values | default | meaning |\n| --- | --- | --- | --- |\n");
    for s in TABLE {
        let values = match s.kind {
            Kind::Choice(words) => words
                .iter()
                .map(|w| format!("`{w}`"))
                .collect::<Vec<_>>()
                .join(", "),
            Kind::List => "comma list".to_string(),
            Kind::Number { min, max } => format!("{min}…{max}"),
        };
        let default = if s.default.is_empty() {
            "(empty)".to_string()
        } else {
            format!("`{}`", s.default)
        };
        out.push_str(&format!(
            "| `{}` | {values} | {default} | {} |\n",
            s.name, s.meaning
        ));
    }
    out
}

/// The `NCCL_FABRIC_*` names among `names` that are no setting, each with the setting it
/// most likely meant (a few letters apart), if any.
pub fn unknown_names(
    names: impl IntoIterator<Item = String>,
) -> Vec<(String, Option<&'static str>)> {
    names
        .into_iter()
        .filter(|n| n.starts_with("NCCL_FABRIC_") && !TABLE.iter().any(|s| s.name == n))
        .map(|n| {
            let closest = TABLE
                .iter()
                .map(|s| (edit_distance(&n, s.name), s.name))
                .min()
                .filter(|&(d, _)| d <= 4)
                .map(|(_, name)| name);
            (n, closest)
        })
        .collect()
}

/// One line per misspelled or unknown `NCCL_FABRIC_*` variable of this environment.
pub fn unknown_in_env() -> Vec<String> {
    unknown_names(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
        .into_iter()
        .map(|(name, closest)| match closest {
            Some(c) => format!("{name} is not a setting of this plugin and is ignored: did you mean {c}?"),
            None => format!(
                "{name} is not a setting of this plugin and is ignored (`nccl-net-fabric settings` lists them)"
            ),
        })
        .collect()
}

/// Levenshtein distance (insertions, deletions, substitutions), by bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(x != y))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspelled_names_point_to_the_setting() {
        let found = unknown_names(
            [
                "NCCL_FABRIC_HEMM",
                "NCCL_FABRIC_HMEM",
                "NCCL_FABRIC_ZZZZZZZZZZZZ",
                "NCCL_DEBUG",
            ]
            .map(String::from),
        );
        assert_eq!(
            found,
            vec![
                ("NCCL_FABRIC_HEMM".to_string(), Some(HMEM)),
                ("NCCL_FABRIC_ZZZZZZZZZZZZ".to_string(), None)
            ]
        );
        assert_eq!(
            unknown_names(["NCCL_FABRIC_LANE".to_string()])[0].1,
            Some(LANES)
        );
    }
}
