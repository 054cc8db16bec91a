//! Layout of every NCCL type the plugin defines, against NCCL's x86-64 ABI.

use nccl_net_fabric::nccl::{DeviceHandleV8, NetV11, NetV8, PropertiesV11, PropertiesV8};
use std::mem::{offset_of, size_of};

#[test]
fn properties_v8_layout() {
    assert_eq!(size_of::<PropertiesV8>(), 64);
    assert_eq!(offset_of!(PropertiesV8, name), 0);
    assert_eq!(offset_of!(PropertiesV8, pci_path), 8);
    assert_eq!(offset_of!(PropertiesV8, guid), 16);
    assert_eq!(offset_of!(PropertiesV8, ptr_support), 24);
    assert_eq!(offset_of!(PropertiesV8, reg_is_global), 28);
    assert_eq!(offset_of!(PropertiesV8, speed), 32);
    assert_eq!(offset_of!(PropertiesV8, port), 36);
    assert_eq!(offset_of!(PropertiesV8, latency), 40);
    assert_eq!(offset_of!(PropertiesV8, max_comms), 44);
    assert_eq!(offset_of!(PropertiesV8, max_recvs), 48);
    assert_eq!(offset_of!(PropertiesV8, net_device_type), 52);
    assert_eq!(offset_of!(PropertiesV8, net_device_version), 56);
}

#[test]
fn device_handle_v8_layout() {
    assert_eq!(size_of::<DeviceHandleV8>(), 32);
    assert_eq!(offset_of!(DeviceHandleV8, net_device_type), 0);
    assert_eq!(offset_of!(DeviceHandleV8, net_device_version), 4);
    assert_eq!(offset_of!(DeviceHandleV8, handle), 8);
    assert_eq!(offset_of!(DeviceHandleV8, size), 16);
    assert_eq!(offset_of!(DeviceHandleV8, needs_proxy_progress), 24);
}

#[test]
fn net_v8_table_layout() {
    assert_eq!(size_of::<NetV8>(), 152);
    let order = [
        offset_of!(NetV8, name),
        offset_of!(NetV8, init),
        offset_of!(NetV8, devices),
        offset_of!(NetV8, get_properties),
        offset_of!(NetV8, listen),
        offset_of!(NetV8, connect),
        offset_of!(NetV8, accept),
        offset_of!(NetV8, reg_mr),
        offset_of!(NetV8, reg_mr_dma_buf),
        offset_of!(NetV8, dereg_mr),
        offset_of!(NetV8, isend),
        offset_of!(NetV8, irecv),
        offset_of!(NetV8, iflush),
        offset_of!(NetV8, test),
        offset_of!(NetV8, close_send),
        offset_of!(NetV8, close_recv),
        offset_of!(NetV8, close_listen),
        offset_of!(NetV8, get_device_mr),
        offset_of!(NetV8, irecv_consumed),
    ];
    for (i, off) in order.iter().enumerate() {
        assert_eq!(*off, i * 8, "field {i} of ncclNet_v8_t");
    }
}

#[test]
fn result_codes_match_nccl() {
    use nccl_net_fabric::nccl::NcclResult as R;
    let codes = [
        (R::Success, 0),
        (R::UnhandledCudaError, 1),
        (R::SystemError, 2),
        (R::InternalError, 3),
        (R::InvalidArgument, 4),
        (R::InvalidUsage, 5),
        (R::RemoteError, 6),
        (R::InProgress, 7),
    ];
    for (r, v) in codes {
        assert_eq!(r as i32, v);
        assert_eq!(R::from_raw(v), Some(r));
    }
}

#[test]
fn properties_v11_layout() {
    assert_eq!(size_of::<PropertiesV11>(), 112);
    assert_eq!(offset_of!(PropertiesV11, ptr_support), 24);
    assert_eq!(offset_of!(PropertiesV11, force_flush), 32);
    assert_eq!(offset_of!(PropertiesV11, speed), 36);
    assert_eq!(offset_of!(PropertiesV11, latency), 44);
    assert_eq!(offset_of!(PropertiesV11, max_recvs), 52);
    assert_eq!(offset_of!(PropertiesV11, net_device_version), 60);
    assert_eq!(offset_of!(PropertiesV11, v_props), 64);
    assert_eq!(offset_of!(PropertiesV11, max_p2p_bytes), 88);
    assert_eq!(offset_of!(PropertiesV11, max_coll_bytes), 96);
    assert_eq!(offset_of!(PropertiesV11, max_multi_request_size), 104);
}

#[test]
fn net_v11_table_layout() {
    assert_eq!(size_of::<NetV11>(), 176);
    assert_eq!(offset_of!(NetV11, isend), 10 * 8);
    assert_eq!(offset_of!(NetV11, irecv_consumed), 18 * 8);
    assert_eq!(offset_of!(NetV11, make_v_device), 19 * 8);
    assert_eq!(offset_of!(NetV11, finalize), 20 * 8);
    assert_eq!(offset_of!(NetV11, set_net_attr), 21 * 8);
}

/// Sizes and a few offsets of every other version's types (NCCL's headers, x86-64).
#[test]
fn every_version_layout() {
    use nccl_net_fabric::nccl::*;
    assert_eq!(size_of::<PropertiesV6>(), 48);
    assert_eq!(offset_of!(PropertiesV6, speed), 28);
    assert_eq!(offset_of!(PropertiesV6, max_recvs), 44);
    assert_eq!(size_of::<NetV6>(), 17 * 8);
    assert_eq!(offset_of!(NetV6, close_listen), 16 * 8);
    assert_eq!(size_of::<PropertiesV7>(), 56);
    assert_eq!(offset_of!(PropertiesV7, net_device_version), 52);
    assert_eq!(size_of::<NetV7>(), 19 * 8);
    assert_eq!(offset_of!(NetV7, irecv_consumed), 18 * 8);
    assert_eq!(size_of::<PropertiesV9>(), 104);
    assert_eq!(offset_of!(PropertiesV9, force_flush), 32);
    assert_eq!(offset_of!(PropertiesV9, v_props), 64);
    assert_eq!(offset_of!(PropertiesV9, max_p2p_bytes), 88);
    assert_eq!(offset_of!(PropertiesV9, max_coll_bytes), 96);
    assert_eq!(size_of::<NetV9>(), 20 * 8);
    assert_eq!(offset_of!(NetV9, make_v_device), 19 * 8);
    assert_eq!(size_of::<NetV10>(), 20 * 8);
    assert_eq!(offset_of!(NetV10, isend), 10 * 8);
    assert_eq!(size_of::<VDevicePropsV12>(), 36);
    assert_eq!(size_of::<PropertiesV12>(), 128);
    assert_eq!(offset_of!(PropertiesV12, v_props), 64);
    assert_eq!(offset_of!(PropertiesV12, max_p2p_bytes), 104);
    assert_eq!(offset_of!(PropertiesV12, max_coll_bytes), 112);
    assert_eq!(offset_of!(PropertiesV12, max_multi_request_size), 120);
    assert_eq!(offset_of!(PropertiesV12, rail_id), 124);
    assert_eq!(offset_of!(PropertiesV12, plane_id), 126);
    assert_eq!(size_of::<NetV12>(), 22 * 8);
    assert_eq!(offset_of!(NetV12, set_net_attr), 21 * 8);
    assert_eq!(size_of::<ProfilerDescrV1>(), 24);
    assert_eq!(offset_of!(ProfilerDescrV1, part), 4);
    assert_eq!(offset_of!(ProfilerDescrV1, tag), 8);
    assert_eq!(offset_of!(ProfilerDescrV1, length), 16);
}
