//! What NCCL decided about GPU buffers, as the plugin sees it: NCCL registers a connection's
//! buffers with `regMr`, host memory (`NCCL_PTR_HOST`) or GPU memory (`NCCL_PTR_CUDA`). The
//! first registration of each direction on a device says which way NCCL went; where the plugin
//! offered GPU buffers and NCCL still registers host memory, one INFO line says why that is
//! likely and what to set. NCCL's own reason is its `GPU Direct RDMA Disabled for HCA …
//! (distance X > Y)` INFO line: the PCI path type between GPU and NIC against
//! `NCCL_NET_GDR_LEVEL` (default PXB); a NIC without a PCI path is placed at the CPU, farther
//! than PXB from every GPU.

use crate::nccl;
use std::sync::atomic::{AtomicBool, Ordering};

/// Per device: whether a send and a receive registration were reported yet.
pub struct BufferReport {
    dev: usize,
    /// The plugin told NCCL it takes GPU buffers on this device.
    offered: bool,
    /// The device's pciPath as NCCL got it (None: NULL).
    pci_path: Option<String>,
    sent: [AtomicBool; 2],
}

/// Which side registered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    Send,
    Recv,
}

impl BufferReport {
    pub fn new(dev: usize, offered: bool, pci_path: Option<String>) -> Self {
        BufferReport {
            dev,
            offered,
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
        let level = match env("NCCL_NET_GDR_LEVEL") {
            Some(v) => format!("NCCL_NET_GDR_LEVEL={v}"),
            None => "NCCL_NET_GDR_LEVEL (default PXB)".to_string(),
        };
        let place = match &self.pci_path {
            None => format!(
                "dev {dev} has no PCI path, so NCCL places it at the CPU, farther from every GPU \
                 than {level} allows: set NCCL_NET_GDR_LEVEL=SYS (or PHB where the GPU and the \
                 NIC share a CPU), or give the NIC a PCI path"
            ),
            Some(p) => format!(
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

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_nic_without_a_pci_path_is_explained() {
        let r = BufferReport::new(0, true, None);
        let v = r.verdict(Side::Recv, nccl::PTR_HOST, none);
        assert!(
            v.starts_with("NCCL uses host buffers on dev 0 (receives)"),
            "{v}"
        );
        assert!(v.contains("no PCI path"), "{v}");
        assert!(v.contains("NCCL_NET_GDR_LEVEL (default PXB)"), "{v}");
        assert!(v.contains("NCCL_NET_GDR_LEVEL=SYS"), "{v}");
        let set = |k: &str| (k == "NCCL_NET_GDR_LEVEL").then(|| "PIX".to_string());
        assert!(r
            .verdict(Side::Recv, nccl::PTR_HOST, set)
            .contains("NCCL_NET_GDR_LEVEL=PIX"));
    }

    #[test]
    fn gpu_buffers_and_sends_are_said() {
        let r = BufferReport::new(2, true, Some("/sys/devices/pci0000:00/0000:00:03.0".into()));
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
        let r = BufferReport::new(0, true, None);
        assert!(!r.sent[0].load(Ordering::Relaxed));
        r.note(Side::Send, nccl::PTR_HOST);
        r.note(Side::Send, nccl::PTR_HOST);
        assert!(r.sent[0].load(Ordering::Relaxed) && !r.sent[1].load(Ordering::Relaxed));
        let quiet = BufferReport::new(0, false, None);
        quiet.note(Side::Recv, nccl::PTR_HOST);
        assert!(!quiet.sent[1].load(Ordering::Relaxed));
    }
}
