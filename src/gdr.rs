//! What NCCL decided about GPU buffers, as the plugin sees it: NCCL registers a connection's
//! buffers with `regMr`, host memory (`NCCL_PTR_HOST`) or GPU memory (`NCCL_PTR_CUDA`). The
//! first registration of each direction on a device says which way NCCL went; where the plugin
//! offered GPU buffers and NCCL still registers host memory, one INFO line says why that is
//! likely and what to set. NCCL's own reason is its `GPU Direct RDMA Disabled for HCA …
//! (distance X > Y)` INFO line: the PCI path type between GPU and NIC against
//! `NCCL_NET_GDR_LEVEL` (default PXB); a NIC without a PCI path is placed at the CPU, farther
//! than PXB from every GPU.

use crate::nccl;
use crate::nic::Sysfs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The PCI path types NCCL compares with `NCCL_NET_GDR_LEVEL`, nearest first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum PathType {
    /// Both under the same PCI bridge.
    Pix,
    /// Through PCI bridges only, without the CPU.
    Pxb,
    /// Through the CPU's host bridge.
    Phb,
    /// Across CPUs, or to a NIC NCCL places at the CPU (no PCI path, or not a PCI function).
    Sys,
}

impl PathType {
    pub fn name(self) -> &'static str {
        match self {
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
        }
    }

    /// `NCCL_NET_GDR_LEVEL`'s value as a path type (names, or NCCL's old numbers 0–5).
    pub fn parse(level: &str) -> Option<PathType> {
        match level.trim().to_ascii_uppercase().as_str() {
            "LOC" | "NVL" | "NVB" | "C2C" | "PIX" | "0" | "1" => Some(PathType::Pix),
            "PXB" | "PXN" | "2" => Some(PathType::Pxb),
            "PHB" | "3" => Some(PathType::Phb),
            "SYS" | "4" | "5" => Some(PathType::Sys),
            _ => None,
        }
    }
}

/// The path type between a GPU and a NIC, from their sysfs paths, as NCCL's topology sees
/// it: a NIC without a PCI path, or whose device is not a PCI function (virtio), sits at the
/// CPU, which NCCL reaches from a GPU only through `SYS`.
pub fn path_type(gpu: &Path, nic: Option<&Path>) -> PathType {
    let nic_function = nic.filter(|n| {
        n.file_name()
            .and_then(|f| f.to_str())
            .is_some_and(crate::nic::is_pci_address)
    });
    let (Some(g), Some(n)) = (
        Sysfs::pci_chain(gpu),
        nic_function.and_then(Sysfs::pci_chain),
    ) else {
        return PathType::Sys;
    };
    if g[0] != n[0] {
        let gpu_node = Sysfs::numa_node(gpu);
        let same_cpu = gpu_node.is_some() && gpu_node == nic_function.and_then(Sysfs::numa_node);
        return if same_cpu {
            PathType::Phb
        } else {
            PathType::Sys
        };
    }
    // Functions below the root both paths share: bridges, since neither is the other's.
    let shared = g[1..]
        .iter()
        .zip(&n[1..])
        .take_while(|(a, b)| a == b)
        .count();
    match shared {
        0 => PathType::Phb,
        s if s + 2 == g.len() && s + 2 == n.len() => PathType::Pix,
        _ => PathType::Pxb,
    }
}

/// The `NCCL_NET_GDR_LEVEL` in force and how to say it (the INFO line and `doctor` word it
/// alike).
fn level_in_force(env: &impl Fn(&str) -> Option<String>) -> (PathType, String) {
    match env("NCCL_NET_GDR_LEVEL") {
        Some(v) => match PathType::parse(&v) {
            Some(l) => (l, format!("NCCL_NET_GDR_LEVEL={v}")),
            None => (
                PathType::Pxb,
                format!("NCCL_NET_GDR_LEVEL={v} (not understood; PXB assumed)"),
            ),
        },
        None => (
            PathType::Pxb,
            "NCCL_NET_GDR_LEVEL PXB (default)".to_string(),
        ),
    }
}

/// What `doctor` predicts for one GPU and one device: the path type, the level in force, and
/// whether NCCL will pass GPU buffers.
pub fn prediction(
    gpu: &Path,
    dev: usize,
    nic: Option<&Path>,
    offered: bool,
    staged: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> String {
    let gpu_name = gpu
        .file_name()
        .map_or("?".into(), |n| n.to_string_lossy().into_owned());
    let path = path_type(gpu, nic);
    let (level, level_text) = level_in_force(&env);
    let head = format!(
        "GPU {gpu_name} - dev {dev}: path {}, {level_text}",
        path.name()
    );
    if !offered {
        return format!("{head}: host buffers (the plugin offers no GPU buffers on this device)");
    }
    if let Some(why) = staged {
        let nccl = match path <= level {
            true => "NCCL passes GPU buffers, although host buffers are faster here",
            false => "NCCL uses host buffers, the faster path here",
        };
        return format!("{head}: {nccl}: {why}");
    }
    if path <= level {
        format!(
            "{head}: NCCL passes GPU buffers if the GPU and its driver support GPUDirect RDMA \
             (sends also need NCCL_NET_GDR_READ, on by default from NCCL 2.12 on most GPUs)"
        )
    } else {
        format!(
            "{head}: NCCL uses host buffers; NCCL_NET_GDR_LEVEL={} would let it pass GPU buffers",
            path.name()
        )
    }
}

/// Per device: whether a send and a receive registration were reported yet.
pub struct BufferReport {
    dev: usize,
    /// The plugin told NCCL it takes GPU buffers on this device.
    offered: bool,
    /// The device's pciPath as NCCL got it (None: NULL).
    pci_path: Option<String>,
    /// Why host buffers are the faster path on this device, if they are
    /// (`quirks::stages_gpu_memory`): then no advice to make NCCL pass GPU buffers.
    staged: Option<&'static str>,
    sent: [AtomicBool; 2],
}

/// Which side registered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    Send,
    Recv,
}

impl BufferReport {
    pub fn new(
        dev: usize,
        offered: bool,
        pci_path: Option<String>,
        staged: Option<&'static str>,
    ) -> Self {
        BufferReport {
            dev,
            offered,
            staged,
            pci_path,
            sent: [AtomicBool::new(false), AtomicBool::new(false)],
        }
    }

    /// Notes a registration of `kind` (`NCCL_PTR_*`) on `side`; logs the verdict once per side.
    pub fn note(&self, side: Side, kind: i32) {
        if !self.offered || self.sent[side as usize].swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::info!("{}", self.verdict(side, kind, |k| std::env::var(k).ok()));
    }

    /// The INFO line for a first registration; `env` reads NCCL's variables.
    pub fn verdict(&self, side: Side, kind: i32, env: impl Fn(&str) -> Option<String>) -> String {
        let dev = self.dev;
        let which = match side {
            Side::Send => "sends",
            Side::Recv => "receives",
        };
        if kind == nccl::PTR_CUDA {
            return format!("NCCL passes GPU buffers on dev {dev} ({which})");
        }
        if let Some(why) = self.staged {
            return format!(
                "NCCL uses host buffers on dev {dev} ({which}), the faster path here: {why}; \
                 leave NCCL_NET_GDR_LEVEL as it is (SYS makes NCCL pass GPU buffers, to test \
                 that path only)"
            );
        }
        let (_, level) = level_in_force(&env);
        // As `path_type`: a path that does not end in a PCI function (a virtio NIC) is no
        // PCI path to NCCL either.
        let function = self.pci_path.as_deref().filter(|p| {
            Path::new(p)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(crate::nic::is_pci_address)
        });
        let at_cpu = |why: String| {
            format!(
                "{why}, so NCCL places it at the CPU, farther from every GPU than {level} \
                 allows: set NCCL_NET_GDR_LEVEL=SYS (or PHB where the GPU and the NIC share a \
                 CPU), or give the NIC a PCI path"
            )
        };
        let place = match (&self.pci_path, function) {
            (None, _) => at_cpu(format!("dev {dev} has no PCI path")),
            (Some(p), None) => at_cpu(format!(
                "dev {dev}'s PCI path {p} does not end in a PCI function (a virtual NIC)"
            )),
            (Some(_), Some(p)) => format!(
                "NCCL judged the path from the GPU to {p} longer than {level} allows, or the \
                 GPU or its driver lacks GPUDirect RDMA (NCCL's INFO line 'GPU Direct RDMA \
                 Disabled for GPU … / HCA {dev}' gives the distance): a larger \
                 NCCL_NET_GDR_LEVEL (PHB, SYS) lets it"
            ),
        };
        let read = match (side, env("NCCL_NET_GDR_READ").as_deref()) {
            (Side::Send, Some("0")) => "; sends also need NCCL_NET_GDR_READ=1 (it is 0)",
            (Side::Send, None) => "; for sends NCCL_NET_GDR_READ decides as well",
            _ => "",
        };
        format!(
            "NCCL uses host buffers on dev {dev} ({which}) although the plugin offers GPU \
             buffers: {place}{read}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A made-up sysfs: two PCI roots, a switch with two ports under root 0.
    fn machine() -> PathBuf {
        let root = std::env::temp_dir().join(format!("nfab-gdr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let d = root.join("devices");
        for p in [
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", // GPU behind port 02:00.0
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.1", // NIC on the same port
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", // NIC on another port
            "pci0000:00/0000:00:03.0/virtio2",                                // virtio NIC
            "pci0000:00/0000:00:05.0",                                        // NIC on the root
            "pci0000:80/0000:80:01.0/0000:81:00.0",                           // NIC on root 1
        ] {
            std::fs::create_dir_all(d.join(p)).unwrap();
        }
        root
    }

    #[test]
    fn path_types_follow_the_pci_tree() {
        let root = machine();
        let d = root.join("devices");
        let gpu = d.join("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
        let at = |p: &str| d.join(p);
        let same_port = at("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.1");
        let other_port = at("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0");
        assert_eq!(path_type(&gpu, Some(&same_port)), PathType::Pix);
        assert_eq!(path_type(&gpu, Some(&other_port)), PathType::Pxb);
        assert_eq!(
            path_type(&gpu, Some(&at("pci0000:00/0000:00:05.0"))),
            PathType::Phb
        );
        assert_eq!(
            path_type(&gpu, Some(&at("pci0000:80/0000:80:01.0/0000:81:00.0"))),
            PathType::Sys,
            "another root complex, NUMA unknown"
        );
        assert_eq!(
            path_type(&gpu, Some(&at("pci0000:00/0000:00:03.0/virtio2"))),
            PathType::Sys
        );
        assert_eq!(path_type(&gpu, None), PathType::Sys);
        let v = prediction(&gpu, 0, None, true, None, none);
        assert!(
            v.contains("path SYS") && v.contains("NCCL uses host buffers"),
            "{v}"
        );
        assert!(v.contains("NCCL_NET_GDR_LEVEL=SYS would"), "{v}");
        let sys = |k: &str| (k == "NCCL_NET_GDR_LEVEL").then(|| "SYS".to_string());
        assert!(prediction(&gpu, 0, None, true, None, sys).contains("NCCL passes GPU buffers"));
        assert!(prediction(&gpu, 0, Some(&other_port), true, None, none)
            .contains("NCCL passes GPU buffers"));
        assert!(prediction(&gpu, 0, Some(&other_port), false, None, none)
            .contains("offers no GPU buffers"));
        // Where the provider stages GPU memory through host copies, no advice towards GPU
        // buffers: host buffers are the faster path.
        let staged = prediction(&gpu, 0, None, true, Some("staged"), none);
        assert!(
            staged.contains("host buffers, the faster path here: staged"),
            "{staged}"
        );
        assert!(!staged.contains("would let it"), "{staged}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn host_buffers_are_not_advised_away_where_gpu_memory_is_staged() {
        let r = BufferReport::new(0, true, None, Some("staged through host copies"));
        let v = r.verdict(Side::Send, nccl::PTR_HOST, none);
        assert!(
            v.contains("the faster path here: staged through host copies"),
            "{v}"
        );
        assert!(v.contains("leave NCCL_NET_GDR_LEVEL as it is"), "{v}");
        assert!(!v.contains("set NCCL_NET_GDR_LEVEL=SYS"), "{v}");
    }

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_nic_without_a_pci_path_is_explained() {
        let r = BufferReport::new(0, true, None, None);
        let v = r.verdict(Side::Recv, nccl::PTR_HOST, none);
        assert!(
            v.starts_with("NCCL uses host buffers on dev 0 (receives)"),
            "{v}"
        );
        assert!(v.contains("no PCI path"), "{v}");
        assert!(v.contains("NCCL_NET_GDR_LEVEL PXB (default)"), "{v}");
        assert!(v.contains("NCCL_NET_GDR_LEVEL=SYS"), "{v}");
        let set = |k: &str| (k == "NCCL_NET_GDR_LEVEL").then(|| "PIX".to_string());
        assert!(r
            .verdict(Side::Recv, nccl::PTR_HOST, set)
            .contains("NCCL_NET_GDR_LEVEL=PIX"));
    }

    #[test]
    fn a_virtual_nic_is_placed_at_the_cpu_as_doctor_says() {
        let virtio = "/sys/devices/pci0000:00/0000:00:03.0/virtio2";
        let r = BufferReport::new(0, true, Some(virtio.into()), None);
        let v = r.verdict(Side::Recv, nccl::PTR_HOST, none);
        assert!(v.contains("does not end in a PCI function"), "{v}");
        assert!(v.contains("NCCL_NET_GDR_LEVEL=SYS"), "{v}");
        let real = BufferReport::new(
            0,
            true,
            Some("/sys/devices/pci0000:00/0000:00:03.0".into()),
            None,
        );
        let v = real.verdict(Side::Recv, nccl::PTR_HOST, none);
        assert!(v.contains("NCCL judged the path"), "{v}");
        assert!(v.contains("NCCL_NET_GDR_LEVEL PXB (default)"), "{v}");
    }

    #[test]
    fn gpu_buffers_and_sends_are_said() {
        let r = BufferReport::new(
            2,
            true,
            Some("/sys/devices/pci0000:00/0000:00:03.0".into()),
            None,
        );
        assert_eq!(
            r.verdict(Side::Send, nccl::PTR_CUDA, none),
            "NCCL passes GPU buffers on dev 2 (sends)"
        );
        let v = r.verdict(Side::Send, nccl::PTR_HOST, none);
        assert!(
            v.contains("0000:00:03.0") && v.contains("NCCL_NET_GDR_READ"),
            "{v}"
        );
        let read0 = |k: &str| (k == "NCCL_NET_GDR_READ").then(|| "0".to_string());
        assert!(r
            .verdict(Side::Send, nccl::PTR_HOST, read0)
            .contains("NCCL_NET_GDR_READ=1"));
    }

    #[test]
    fn said_once_per_side_and_only_where_offered() {
        let r = BufferReport::new(0, true, None, None);
        assert!(!r.sent[0].load(Ordering::Relaxed));
        r.note(Side::Send, nccl::PTR_HOST);
        r.note(Side::Send, nccl::PTR_HOST);
        assert!(r.sent[0].load(Ordering::Relaxed) && !r.sent[1].load(Ordering::Relaxed));
        let quiet = BufferReport::new(0, false, None, None);
        quiet.note(Side::Recv, nccl::PTR_HOST);
        assert!(!quiet.sent[1].load(Ordering::Relaxed));
    }
}
