//! `getProperties` in the layout of each version, from the version-free [`Properties`].

use crate::device::Properties;
use crate::nccl::{
    PropertiesV11, PropertiesV12, PropertiesV6, PropertiesV7, PropertiesV8, PropertiesV9,
    VDevicePropsV11, VDevicePropsV12, NET_DEVICE_HOST, NET_DEVICE_INVALID_VERSION,
};
use std::ffi::c_char;

fn name(p: &Properties) -> *mut c_char {
    p.name.as_ptr().cast_mut()
}

fn pci_path(p: &Properties) -> *mut c_char {
    p.pci_path
        .as_ref()
        .map_or(std::ptr::null_mut(), |s| s.as_ptr().cast_mut())
}

pub fn v6(p: &Properties, _dev: i32) -> PropertiesV6 {
    PropertiesV6 {
        name: name(p),
        pci_path: pci_path(p),
        guid: p.guid,
        ptr_support: p.ptr_support,
        speed: p.speed_mbps,
        port: p.port,
        latency: p.latency_us,
        max_comms: p.max_comms,
        max_recvs: p.max_recvs,
    }
}

pub fn v7(p: &Properties, dev: i32) -> PropertiesV7 {
    let v6 = v6(p, dev);
    PropertiesV7 {
        name: v6.name,
        pci_path: v6.pci_path,
        guid: v6.guid,
        ptr_support: v6.ptr_support,
        speed: v6.speed,
        port: v6.port,
        latency: v6.latency,
        max_comms: v6.max_comms,
        max_recvs: v6.max_recvs,
        net_device_type: NET_DEVICE_HOST,
        net_device_version: NET_DEVICE_INVALID_VERSION,
    }
}

pub fn v8(p: &Properties, dev: i32) -> PropertiesV8 {
    let v7 = v7(p, dev);
    PropertiesV8 {
        name: v7.name,
        pci_path: v7.pci_path,
        guid: v7.guid,
        ptr_support: v7.ptr_support,
        reg_is_global: 0,
        speed: v7.speed,
        port: v7.port,
        latency: v7.latency,
        max_comms: v7.max_comms,
        max_recvs: v7.max_recvs,
        net_device_type: v7.net_device_type,
        net_device_version: v7.net_device_version,
    }
}

/// v9 and v10 (the same layout). `maxP2pBytes` must be > 0: NCCL fails connection setup
/// otherwise.
pub fn v9(p: &Properties, dev: i32) -> PropertiesV9 {
    let v8 = v8(p, dev);
    PropertiesV9 {
        name: v8.name,
        pci_path: v8.pci_path,
        guid: v8.guid,
        ptr_support: v8.ptr_support,
        reg_is_global: v8.reg_is_global,
        force_flush: 0,
        speed: v8.speed,
        port: v8.port,
        latency: v8.latency,
        max_comms: v8.max_comms,
        max_recvs: v8.max_recvs,
        net_device_type: v8.net_device_type,
        net_device_version: v8.net_device_version,
        v_props: VDevicePropsV11 {
            ndevs: 1,
            devs: [dev, 0, 0, 0],
        },
        max_p2p_bytes: p.max_message,
        max_coll_bytes: p.max_message,
    }
}

pub fn v11(p: &Properties, dev: i32) -> PropertiesV11 {
    let v9 = v9(p, dev);
    PropertiesV11 {
        name: v9.name,
        pci_path: v9.pci_path,
        guid: v9.guid,
        ptr_support: v9.ptr_support,
        reg_is_global: v9.reg_is_global,
        force_flush: v9.force_flush,
        speed: v9.speed,
        port: v9.port,
        latency: v9.latency,
        max_comms: v9.max_comms,
        max_recvs: v9.max_recvs,
        net_device_type: v9.net_device_type,
        net_device_version: v9.net_device_version,
        v_props: v9.v_props,
        max_p2p_bytes: v9.max_p2p_bytes,
        max_coll_bytes: v9.max_coll_bytes,
        max_multi_request_size: 1,
    }
}

/// v12: rail and plane ids are not known to libfabric: -1 (undefined).
pub fn v12(p: &Properties, dev: i32) -> PropertiesV12 {
    let v11 = v11(p, dev);
    PropertiesV12 {
        name: v11.name,
        pci_path: v11.pci_path,
        guid: v11.guid,
        ptr_support: v11.ptr_support,
        reg_is_global: v11.reg_is_global,
        force_flush: v11.force_flush,
        speed: v11.speed,
        port: v11.port,
        latency: v11.latency,
        max_comms: v11.max_comms,
        max_recvs: v11.max_recvs,
        net_device_type: v11.net_device_type,
        net_device_version: v11.net_device_version,
        v_props: VDevicePropsV12 {
            ndevs: 1,
            devs: [dev, 0, 0, 0, 0, 0, 0, 0],
        },
        max_p2p_bytes: v11.max_p2p_bytes,
        max_coll_bytes: v11.max_coll_bytes,
        max_multi_request_size: v11.max_multi_request_size,
        rail_id: -1,
        plane_id: -1,
    }
}
