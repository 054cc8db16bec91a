//! What the system says about the network interface behind a domain: whether it is the
//! loopback, its PCI device, its link speed and its hardware address, each with where the
//! answer came from. NCCL builds its topology, its rails and its GPU-buffer decision from
//! `pciPath`, `speed` and `guid`, so these come from the machine, not from constants.
//!
//! For tcp-based providers (and sockets) a domain is named after its interface (`eth0`);
//! for RDMA providers after the RDMA device (`mlx5_0`), found under
//! `/sys/class/infiniband`. The sysfs root is a parameter so that tests can describe
//! machines they make up.

use std::path::{Path, PathBuf};

/// Speed announced to NCCL when neither the provider, the kernel nor `NCCL_FABRIC_SPEED_MBPS`
/// gives one (virtio and many virtual NICs report none): 25 Gb/s. NCCL's cost model picks
/// each size's protocol by it, and nothing else about the link is known. On the GPU machine
/// (H100, two ranks as two hosts over a virtio NIC, `tcp;ofi_rxm`, NCCL 2.28.9, one call) a
/// 256 KiB all_reduce took 239.5 µs told 100 Gb/s and 102.7 told 25 (Socket as shipped, which
/// NCCL tells 10 Gb/s, 221.4); 10 Gb/s slowed 64 KiB (81.4 against 66.9), 50 Gb/s left
/// 128 KiB slow (122.5 against 96.3), and from 1 MiB on all four moved alike (BENCHMARKS.md).
pub const DEFAULT_SPEED_MBPS: u64 = 25_000;

/// The speed a comm's flows are sized for where the link's speed is a guess: 100 Gb/s, so
/// that a fast link whose speed goes unreported still gets the flows a network that caps each
/// connection needs (a flow costs nothing while messages go whole on the first). With the
/// flows of 10 Gb/s (20 in place of 33), all_reduce at 128–256 MiB took 1.27–1.29× as long on
/// the GPU machine.
pub const DEFAULT_FLOW_SPEED_MBPS: u64 = 100_000;

/// A sysfs tree: `/sys` on a real machine.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::at("/sys")
    }
}

/// `dddd:bb:dd.f`: the name sysfs gives a PCI function.
pub fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

impl Sysfs {
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    fn read(&self, rel: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// The kernel's directory for a network interface or RDMA device named `domain`.
    fn class_dir(&self, domain: &str) -> Option<PathBuf> {
        if domain.is_empty() || domain.contains('/') || domain.starts_with('.') {
            return None;
        }
        ["class/net", "class/infiniband"]
            .iter()
            .map(|c| self.root.join(c).join(domain))
            .find(|p| p.exists())
    }

    /// Whether the machine has an RDMA device (anything in `/sys/class/infiniband`).
    pub fn has_rdma_devices(&self) -> bool {
        std::fs::read_dir(self.root.join("class/infiniband")).is_ok_and(|mut d| d.next().is_some())
    }

    /// Whether `domain` is a network interface the kernel flags as loopback
    /// (`IFF_LOOPBACK` in `/sys/class/net/<if>/flags`).
    pub fn is_loopback(&self, domain: &str) -> bool {
        self.read(format!("class/net/{domain}/flags"))
            .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
            .is_some_and(|f| f & libc::IFF_LOOPBACK as u32 != 0)
    }

    /// The PCI function a sysfs device path sits on: the path itself or its nearest parent
    /// named like a PCI address (a virtio NIC is `…/0000:00:03.0/virtio2`).
    fn pci_ancestor(path: &Path) -> Option<PathBuf> {
        path.ancestors()
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(is_pci_address)
            })
            .map(Path::to_path_buf)
    }

    /// The device behind `domain` in sysfs, and where it was found: the provider's PCI
    /// address first, then the real path behind `/sys/class/{net,infiniband}/<domain>/device`,
    /// as NCCL's own Socket and IB transports report it. A virtio NIC's device is a virtio
    /// device (`…/0000:00:03.0/virtio2`), not a PCI function: NCCL attaches such a NIC to
    /// the CPU, as it does for its Socket transport on the same interface.
    pub fn pci_path(&self, domain: &str, provider_pci: Option<&str>) -> (Option<PathBuf>, String) {
        if let Some(addr) = provider_pci {
            let link = self.root.join("bus/pci/devices").join(addr);
            if let Ok(p) = std::fs::canonicalize(&link) {
                return (Some(p), format!("the provider's PCI address {addr}"));
            }
        }
        let Some(dir) = self.class_dir(domain) else {
            return (
                None,
                format!("no {domain} in /sys/class/net or /sys/class/infiniband"),
            );
        };
        let class = dir
            .parent()
            .and_then(|p| p.file_name())
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        let Ok(real) = std::fs::canonicalize(dir.join("device")) else {
            return (
                None,
                format!("/sys/class/{class}/{domain} has no device (a virtual interface)"),
            );
        };
        let whose = format!("the real path behind /sys/class/{class}/{domain}/device");
        let note = match Self::pci_ancestor(&real) {
            Some(function) if function == real => String::new(),
            Some(function) => format!(
                "; not a PCI function itself (it sits on {}): NCCL attaches it to the CPU, as \
                 for its own Socket transport",
                function
                    .file_name()
                    .map_or("".into(), |n| n.to_string_lossy().into_owned())
            ),
            None => "; not on a PCI bus: NCCL attaches it to the CPU".into(),
        };
        (Some(real), format!("{whose}{note}"))
    }

    /// The driver of `domain`'s device (`virtio_net`, `mlx5_core` …), if it has one.
    pub fn driver(&self, domain: &str) -> Option<String> {
        let dir = self.class_dir(domain)?;
        let real = std::fs::canonicalize(dir.join("device/driver")).ok()?;
        Some(real.file_name()?.to_string_lossy().into_owned())
    }

    /// The link speed the kernel reports for interface `domain`, in Mb/s (`None` where it
    /// reports none: -1, unreadable, or no such interface).
    pub fn speed_mbps(&self, domain: &str) -> Option<u64> {
        let s: i64 = self
            .read(format!("class/net/{domain}/speed"))?
            .parse()
            .ok()?;
        u64::try_from(s).ok().filter(|&s| s > 0)
    }

    /// NVIDIA GPUs (vendor 0x10de, a display class) on the PCI bus: their real sysfs paths,
    /// sorted.
    pub fn gpus(&self) -> Vec<PathBuf> {
        let dir = self.root.join("bus/pci/devices");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| {
                let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
                read("vendor").trim() == "0x10de" && read("class").trim().starts_with("0x03")
            })
            .filter_map(|e| std::fs::canonicalize(e.path()).ok())
            .collect();
        out.sort();
        out
    }

    /// The NUMA node sysfs gives a device path (`None`: unknown or -1).
    pub fn numa_node(path: &Path) -> Option<u32> {
        std::fs::read_to_string(path.join("numa_node"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The PCI functions of a device path from its root complex down (`pci0000:00` first,
    /// then each function's address), up to its nearest PCI function; `None` where the path
    /// is on no PCI bus.
    pub fn pci_chain(path: &Path) -> Option<Vec<String>> {
        let function = Self::pci_ancestor(path)?;
        let names: Vec<String> = function
            .components()
            .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
            .collect();
        let root = names.iter().rposition(|n| n.starts_with("pci"))?;
        Some(names[root..].to_vec())
    }

    /// The interface's hardware address, if it has a non-zero one.
    pub fn mac(&self, domain: &str) -> Option<u64> {
        let text = self.read(format!("class/net/{domain}/address"))?;
        let bytes: Vec<u8> = text
            .split(':')
            .map(|h| u8::from_str_radix(h, 16).ok())
            .collect::<Option<_>>()?;
        let v = bytes.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b));
        (bytes.len() >= 6 && v != 0).then_some(v)
    }
}

/// What a device tells NCCL about itself, and where each part came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    pub pci_path: Option<PathBuf>,
    pub pci_source: String,
    pub speed_mbps: u64,
    pub speed_source: String,
    /// The speed the device's flows are sized for: `speed_mbps` where that was set or
    /// reported, [`DEFAULT_FLOW_SPEED_MBPS`] (or more) where it is a guess.
    pub flow_speed_mbps: u64,
    pub guid: u64,
    pub guid_source: String,
}

impl Description {
    /// One line for TRACE and `doctor`.
    pub fn text(&self) -> String {
        format!(
            "pciPath {} ({}), speed {} Mb/s ({}{}), guid {:#x} ({}), latency unknown (0)",
            self.pci_path
                .as_deref()
                .map_or("NULL".into(), |p| p.display().to_string()),
            self.pci_source,
            self.speed_mbps,
            self.speed_source,
            match self.flow_speed_mbps == self.speed_mbps {
                true => String::new(),
                false => format!("; flows sized for {} Mb/s", self.flow_speed_mbps),
            },
            self.guid,
            self.guid_source
        )
    }
}

/// What the provider reports for an entry, as far as properties go.
#[derive(Debug, Clone, Default)]
pub struct ProviderNic {
    pub speed_bps: Option<u64>,
    pub pci_address: Option<String>,
}

/// Describes device `index` on `domain`. `speed_setting`: `NCCL_FABRIC_SPEED_MBPS` (0 when
/// unset); `unreported`: the speed for a provider that reports no link and has no interface
/// (shared memory). `taken`: guids of the devices before this one, which this one must not
/// repeat.
pub fn describe(
    sys: &Sysfs,
    domain: &str,
    provider: &ProviderNic,
    speed_setting: u64,
    unreported: u64,
    taken: &[u64],
) -> Description {
    let (pci_path, pci_source) = sys.pci_path(domain, provider.pci_address.as_deref());
    // A guess (the last two cases) sizes flows for a fast link, whatever NCCL is told.
    let guessed = |speed: u64| speed.max(DEFAULT_FLOW_SPEED_MBPS);
    let (speed_mbps, speed_source, flow_speed_mbps) = if speed_setting > 0 {
        (
            speed_setting,
            "NCCL_FABRIC_SPEED_MBPS".to_string(),
            speed_setting,
        )
    } else if let Some(bps) = provider.speed_bps.filter(|&b| b > 0) {
        let mbps = (bps / 1_000_000).max(1);
        (mbps, "the provider's link attributes".into(), mbps)
    } else if let Some(s) = sys.speed_mbps(domain) {
        (s, format!("/sys/class/net/{domain}/speed"), s)
    } else if sys.class_dir(domain).is_some() {
        let kind = match sys.driver(domain) {
            Some(d) => format!("driver {d}"),
            None if sys.is_loopback(domain) => "loopback".into(),
            None => "a virtual interface".into(),
        };
        (
            DEFAULT_SPEED_MBPS,
            format!(
                "default: the kernel reports no speed for {domain} ({kind}); NCCL's cost \
                 model picks each size's protocol and its channels by it; \
                 NCCL_FABRIC_SPEED_MBPS sets it and the flows' alike (NCCL_MIN_NCHANNELS sets \
                 the channels alone, without NCCL's cost model seeing another speed)"
            ),
            guessed(DEFAULT_SPEED_MBPS),
        )
    } else {
        (
            unreported,
            "default for a provider that reports no link; NCCL_FABRIC_SPEED_MBPS sets it".into(),
            guessed(unreported),
        )
    };
    let (mut guid, guid_source) = match sys.mac(domain) {
        Some(mac) => (mac, format!("{domain}'s hardware address")),
        None => (fnv1a(domain.as_bytes()), "a hash of the domain name".into()),
    };
    // Two devices with one guid are ports of one NIC to NCCL: keep them apart.
    while taken.contains(&guid) {
        guid = guid.wrapping_add(1 << 48);
    }
    Description {
        pci_path,
        pci_source,
        speed_mbps,
        speed_source,
        flow_speed_mbps,
        guid,
        guid_source,
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The order in which a device over several NICs of `speeds_mbps` gives its lanes to the NICs
/// (indices into `speeds_mbps`), repeated: each NIC as often as its speed is a multiple of
/// the slowest one's (rounded, 1 to 4; all alike where a speed is unknown), interleaved, so
/// that flows carry pieces to each NIC in proportion to its speed.
pub fn rail_pattern(speeds_mbps: &[u64]) -> Vec<usize> {
    let slowest = speeds_mbps.iter().copied().min().unwrap_or(0);
    let weight = |s: u64| match slowest {
        0 => 1,
        m => ((s + m / 2) / m).clamp(1, 4) as usize,
    };
    let weights: Vec<usize> = speeds_mbps.iter().map(|&s| weight(s)).collect();
    let rounds = weights.iter().copied().max().unwrap_or(0);
    (0..rounds)
        .flat_map(|r| {
            weights
                .iter()
                .enumerate()
                .filter(move |(_, &w)| w > r)
                .map(|(i, _)| i)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn rails_come_up_in_proportion_to_their_nics_speeds() {
        assert_eq!(rail_pattern(&[10_000, 10_000]), vec![0, 1]);
        assert_eq!(rail_pattern(&[25_000; 4]), vec![0, 1, 2, 3]);
        assert_eq!(rail_pattern(&[200_000, 100_000]), vec![0, 1, 0]);
        assert_eq!(rail_pattern(&[100_000, 400_000]), vec![0, 1, 1, 1, 1]);
        assert_eq!(
            rail_pattern(&[1000, 100_000]),
            vec![0, 1, 1, 1, 1],
            "at most 4 to 1"
        );
        assert_eq!(
            rail_pattern(&[0, 25_000]),
            vec![0, 1],
            "a speed unknown: all alike"
        );
    }

    /// A made-up machine: eth0 a virtio NIC on PCI 0000:00:03.0 with no speed, ib0 a
    /// PCI NIC at 25 Gb/s, an RDMA device mlx5_0 on the same function, lo, and a veth.
    fn machine() -> (PathBuf, Sysfs) {
        let root = std::env::temp_dir().join(format!(
            "nfab-sysfs-{}-{:x}",
            std::process::id(),
            crate::random::u64()
        ));
        let pci = root.join("devices/pci0000:00");
        let virtio = pci.join("0000:00:03.0/virtio2");
        let nic = pci.join("0000:00:04.0");
        for d in [
            &virtio,
            &nic,
            &root.join("bus/pci/drivers/virtio-pci"),
            &root.join("bus/virtio/drivers/virtio_net"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        symlink(
            root.join("bus/virtio/drivers/virtio_net"),
            virtio.join("driver"),
        )
        .unwrap();
        let add = |class: &str, name: &str, files: &[(&str, &str)], device: Option<&Path>| {
            let dir = root.join("class").join(class).join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for (f, v) in files {
                std::fs::write(dir.join(f), format!("{v}\n")).unwrap();
            }
            if let Some(d) = device {
                symlink(d, dir.join("device")).unwrap();
            }
        };
        add(
            "net",
            "eth0",
            &[
                ("speed", "-1"),
                ("flags", "0x1003"),
                ("address", "02:fc:00:00:00:01"),
            ],
            Some(&virtio),
        );
        add(
            "net",
            "ib0",
            &[
                ("speed", "25000"),
                ("flags", "0x1003"),
                ("address", "0c:42:a1:00:00:02"),
            ],
            Some(&nic),
        );
        add("infiniband", "mlx5_0", &[], Some(&nic));
        add(
            "net",
            "lo",
            &[("flags", "0x9"), ("address", "00:00:00:00:00:00")],
            None,
        );
        add(
            "net",
            "veth0",
            &[
                ("speed", "10000"),
                ("flags", "0x1003"),
                ("address", "aa:bb:cc:dd:ee:ff"),
            ],
            None,
        );
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        symlink(&nic, root.join("bus/pci/devices/0000:00:04.0")).unwrap();
        (root.clone(), Sysfs::at(root))
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:00:03.0"));
        assert!(is_pci_address("abcd:ef:1f.7"));
        assert!(!is_pci_address("virtio2"));
        assert!(!is_pci_address("pci0000:00"));
        assert!(!is_pci_address("0000:00:03:0"));
    }

    #[test]
    fn a_made_up_machine_is_described_truly() {
        let (root, sys) = machine();
        let none = ProviderNic::default();
        let eth0 = describe(&sys, "eth0", &none, 0, 1, &[]);
        let canon = |p: &str| std::fs::canonicalize(root.join(p)).unwrap();
        assert_eq!(
            eth0.pci_path,
            // As NCCL's Socket transport reports it: the virtio device, which sits on a PCI
            // function but is none.
            Some(canon("devices/pci0000:00/0000:00:03.0/virtio2"))
        );
        assert!(
            eth0.pci_source.contains("it sits on 0000:00:03.0"),
            "{}",
            eth0.pci_source
        );
        assert_eq!(
            (eth0.speed_mbps, eth0.flow_speed_mbps),
            (DEFAULT_SPEED_MBPS, DEFAULT_FLOW_SPEED_MBPS)
        );
        assert!(eth0.text().contains("flows sized for 100000 Mb/s"));
        assert!(
            eth0.speed_source.contains("driver virtio_net")
                && eth0.speed_source.contains("NCCL_MIN_NCHANNELS"),
            "{}",
            eth0.speed_source
        );
        assert_eq!(eth0.guid, 0x02fc_0000_0001);

        let ib0 = describe(&sys, "ib0", &none, 0, 1, &[eth0.guid]);
        assert_eq!(ib0.pci_path, Some(canon("devices/pci0000:00/0000:00:04.0")));
        assert!(
            !ib0.pci_source.contains("not a PCI function"),
            "{}",
            ib0.pci_source
        );
        assert_eq!(
            (ib0.speed_mbps, ib0.speed_source.as_str()),
            (25_000, "/sys/class/net/ib0/speed")
        );

        let rdma = ProviderNic {
            speed_bps: Some(200_000_000_000),
            pci_address: Some("0000:00:04.0".into()),
        };
        let mlx = describe(&sys, "mlx5_0", &rdma, 0, 1, &[]);
        assert_eq!(mlx.pci_path, ib0.pci_path);
        assert_eq!(mlx.speed_mbps, 200_000);
        assert!(mlx.pci_source.contains("0000:00:04.0"));
        let set = describe(&sys, "mlx5_0", &rdma, 7, 1, &[]);
        assert!(set.speed_source.contains("NCCL_FABRIC_SPEED_MBPS"));
        assert_eq!((set.speed_mbps, set.flow_speed_mbps), (7, 7));
        let set = describe(&sys, "eth0", &none, 7, 1, &[]);
        assert_eq!((set.speed_mbps, set.flow_speed_mbps), (7, 7));

        let veth = describe(&sys, "veth0", &none, 0, 1, &[]);
        assert_eq!(veth.pci_path, None);
        assert!(
            veth.pci_source.contains("virtual interface"),
            "{}",
            veth.pci_source
        );
        assert_eq!((veth.speed_mbps, veth.flow_speed_mbps), (10_000, 10_000));
        assert!(!veth.text().contains("flows sized"), "{}", veth.text());

        let lo = describe(&sys, "lo", &none, 0, 1, &[]);
        assert!(sys.is_loopback("lo") && !sys.is_loopback("eth0") && !sys.is_loopback("nope"));
        assert!(lo.speed_source.contains("loopback"), "{}", lo.speed_source);
        assert_eq!(lo.guid_source, "a hash of the domain name");

        let shm = describe(&sys, "shm", &none, 0, 400_000, &[]);
        assert_eq!(
            (shm.pci_path.as_ref(), shm.speed_mbps, shm.flow_speed_mbps),
            (None, 400_000, 400_000)
        );
        // Same guid twice: the second device gets another.
        let again = describe(&sys, "eth0", &none, 0, 1, &[eth0.guid]);
        assert_ne!(again.guid, eth0.guid);
        assert!(describe(&sys, "../etc", &none, 0, 1, &[])
            .pci_path
            .is_none());
        let _ = std::fs::remove_dir_all(root);
    }
}
