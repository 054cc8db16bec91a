//! Policy tests on synthetic candidates: every row of the setopt table, every
//! `NCCL_FABRIC_HMEM` mode, provider and domain filters.

use super::*;
use crate::settings::Settings;

const EOPNOTSUPP: i32 = -(sys::FI_EOPNOTSUPP as i32);
const EINVAL: i32 = -(sys::FI_EINVAL as i32);
const ENOPROTOOPT: i32 = -(sys::FI_ENOPROTOOPT as i32);
const ENOSYS: i32 = -(sys::FI_ENOSYS as i32);
const EIO: i32 = -5;

fn cand(pass: Pass, provider: &str, domain: &str, hmem: bool, setopt: i32) -> Candidate {
    let mut caps = sys::FI_TAGGED as u64 | sys::FI_MSG as u64;
    if hmem {
        caps |= sys::FI_HMEM;
    }
    Candidate {
        pass,
        provider: provider.into(),
        fabric: "f".into(),
        domain: domain.into(),
        caps,
        mr_mode: 0,
        api_version: crate::fabric::fi_version(1, 18),
        src: None,
        loopback: domain == "lo",
        setopt: Some(Ok(setopt)),
        names: None,
    }
}

/// An FI_HMEM-capable provider found by both passes, plus tcp;ofi_rxm on the host pass.
fn world(hmem_answer: i32) -> Vec<Candidate> {
    vec![
        cand(Pass::Hmem, "gpuprov", "nic0", true, hmem_answer),
        cand(Pass::Host, "tcp;ofi_rxm", "eth0", false, ENOPROTOOPT),
        cand(Pass::Host, "gpuprov", "nic0", false, hmem_answer),
    ]
}

fn settings(hmem: &str) -> Settings {
    Settings::from_lookup(|k| (k == crate::settings::HMEM).then(|| hmem.to_string())).unwrap()
}

#[test]
fn answer_zero_with_hmem_gives_gpu_buffers() {
    let d = decide(&world(0), &settings("auto"));
    assert!(d.gpu);
    assert_eq!(d.provider, "gpuprov");
    assert_eq!(d.devices, vec![0]);
    assert!(
        d.hmem_reason.contains("promises no CUDA calls"),
        "{}",
        d.hmem_reason
    );
    assert!(d.verdicts[0].accepted);
}

#[test]
fn eopnotsupp_means_no_gpu_buffers() {
    let d = decide(&world(EOPNOTSUPP), &settings("auto"));
    assert!(!d.gpu);
    assert!(
        d.hmem_reason.contains("needs the CUDA API"),
        "{}",
        d.hmem_reason
    );
    assert!(d.failure.is_none());
    // Host fallback: network provider first.
    assert_eq!(d.provider, "tcp;ofi_rxm");
}

#[test]
fn einval_means_no_cuda() {
    let d = decide(&world(EINVAL), &settings("auto"));
    assert!(!d.gpu);
    assert!(
        d.hmem_reason.contains("no CUDA library or device"),
        "{}",
        d.hmem_reason
    );
}

#[test]
fn unknown_option_means_no_unless_forced() {
    for unknown in [ENOPROTOOPT, ENOSYS] {
        let d = decide(&world(unknown), &settings("auto"));
        assert!(!d.gpu, "{unknown}");
        assert!(
            d.hmem_reason.contains("does not know the option"),
            "{}",
            d.hmem_reason
        );

        let d = decide(&world(unknown), &settings("force"));
        assert!(d.gpu, "force accepts {unknown}");
        assert_eq!(d.provider, "gpuprov");
        assert!(
            d.verdicts[0].reason.contains("NCCL_FABRIC_HMEM=force"),
            "{}",
            d.verdicts[0].reason
        );
    }
}

#[test]
fn force_does_not_override_a_refusal() {
    let d = decide(&world(EOPNOTSUPP), &settings("force"));
    assert!(!d.gpu);
}

#[test]
fn other_answers_reject_the_provider() {
    let d = decide(&world(EIO), &settings("auto"));
    assert!(!d.gpu);
    assert_eq!(d.provider, "tcp;ofi_rxm");
    assert!(!d.verdicts[0].accepted);
    assert!(
        d.verdicts[0].reason.contains("provider rejected"),
        "{}",
        d.verdicts[0].reason
    );
    assert!(d.verdicts[2].reason.contains("provider rejected"));
}

#[test]
fn probe_failure_rejects_with_the_error() {
    let mut c = world(0);
    c[0].setopt = Some(Err("fi_enable failed: boom".into()));
    let d = decide(&c, &settings("auto"));
    assert!(!d.gpu);
    assert!(d.verdicts[0].reason.contains("fi_enable failed: boom"));
}

#[test]
fn require_fails_naming_the_closest_candidate() {
    let d = decide(&world(EINVAL), &settings("require"));
    let Some(Failure::HmemRequired(text)) = d.failure else {
        panic!("expected failure")
    };
    // The FI_HMEM entry, not the host-only ones: it came closest.
    assert!(
        text.contains("closest gpuprov on nic0 (Hmem pass)"),
        "{text}"
    );
    assert!(
        !text.contains("tcp;ofi_rxm"),
        "one candidate, not all: {text}"
    );
    assert!(text.contains("no CUDA library or device"), "{text}");
    assert!(text.contains("NCCL_FABRIC_HMEM=auto"), "{text}");
    assert!(d.devices.is_empty());

    let d = decide(&world(0), &settings("require"));
    assert!(d.failure.is_none());
    assert!(d.gpu);
}

#[test]
fn off_uses_host_buffers_even_when_gpu_would_work() {
    let d = decide(&world(0), &settings("off"));
    assert!(!d.gpu);
    assert!(d.hmem_reason.contains("NCCL_FABRIC_HMEM=off"));
    assert!(d.devices.iter().all(|&i| world(0)[i].pass == Pass::Host));
}

#[test]
fn host_only_world_falls_back_and_says_why() {
    let c = vec![
        cand(Pass::Host, "tcp;ofi_rxm", "eth1", false, ENOPROTOOPT),
        cand(Pass::Host, "tcp;ofi_rxm", "eth0", false, ENOPROTOOPT),
    ];
    let d = decide(&c, &settings("auto"));
    assert_eq!(
        d.devices,
        vec![0, 1],
        "every interface of the chosen provider is a device"
    );
    assert!(!d.gpu);
    assert!(d.hmem_reason.contains("found nothing"), "{}", d.hmem_reason);
    // With a provider named, the FI_HMEM pass looked at that provider only: say so.
    let named = Settings::from_lookup(|k| {
        (k == crate::settings::PROVIDER).then(|| "tcp;ofi_rxm".to_string())
    })
    .unwrap();
    let d = decide(&c, &named);
    assert!(
        d.hmem_reason
            .contains("no provider among NCCL_FABRIC_PROVIDER=tcp;ofi_rxm offers FI_HMEM"),
        "{}",
        d.hmem_reason
    );
}

#[test]
fn shm_measured_answers_settle_on_host() {
    // As measured with FI_PROVIDER=shm: -92 on 1.17, -22 on 2.1.
    for answer in [ENOPROTOOPT, EINVAL] {
        let c = vec![
            cand(Pass::Hmem, "shm", "shm", true, answer),
            cand(Pass::Host, "shm", "shm", false, answer),
        ];
        let d = decide(&c, &settings("auto"));
        assert!(!d.gpu);
        assert_eq!(d.devices, vec![1]);
        assert!(
            d.hmem_reason.contains("shm offers FI_HMEM but"),
            "{}",
            d.hmem_reason
        );
    }
}

#[test]
fn local_only_providers_are_kept_but_ranked_last() {
    let c = vec![
        cand(Pass::Host, "shm", "shm", false, ENOPROTOOPT),
        cand(Pass::Host, "tcp;ofi_rxm", "lo", false, ENOPROTOOPT),
    ];
    let d = decide(&c, &settings("auto"));
    assert_eq!(d.provider, "tcp;ofi_rxm");
    assert!(
        d.verdicts[0]
            .reason
            .contains("preferred (network providers come before single-host ones)"),
        "{}",
        d.verdicts[0].reason
    );
    let only_shm = decide(&c[..1], &settings("auto"));
    assert_eq!(only_shm.provider, "shm");
}

#[test]
fn user_provider_order_wins() {
    let c = vec![
        cand(Pass::Host, "tcp;ofi_rxm", "lo", false, ENOPROTOOPT),
        cand(Pass::Host, "shm", "shm", false, ENOPROTOOPT),
    ];
    let s = Settings::from_lookup(|k| {
        (k == crate::settings::PROVIDER).then(|| "shm,tcp;ofi_rxm".into())
    })
    .unwrap();
    assert_eq!(decide(&c, &s).provider, "shm");
    let s = Settings::from_lookup(|k| (k == crate::settings::PROVIDER).then(|| "verbs".into()))
        .unwrap();
    let d = decide(&c, &s);
    assert!(matches!(d.failure, Some(Failure::NoProvider(_))));
    assert!(d.verdicts[0].reason.contains("NCCL_FABRIC_PROVIDER"));
}

#[test]
fn native_tcp_is_refused_unless_allowed() {
    let c = vec![
        cand(Pass::Host, "tcp", "lo", false, ENOPROTOOPT),
        cand(Pass::Host, "tcp;ofi_rxm", "lo", false, EINVAL),
    ];
    let d = decide(&c, &settings("auto"));
    assert_eq!(d.provider, "tcp;ofi_rxm");
    assert!(d.verdicts[0].reason.contains("8963"));
    let s = Settings::from_lookup(|k| (k == crate::settings::ALLOW_TCP_RDM).then(|| "yes".into()))
        .unwrap();
    assert_eq!(decide(&c, &s).provider, "tcp");
}

#[test]
fn excluded_domains_are_not_devices() {
    let c = vec![
        cand(Pass::Host, "tcp;ofi_rxm", "docker0", false, ENOPROTOOPT),
        cand(Pass::Host, "tcp;ofi_rxm", "eth0", false, ENOPROTOOPT),
    ];
    let d = decide(&c, &settings("auto"));
    assert_eq!(d.devices, vec![1]);
    assert!(d.verdicts[0].reason.contains("EXCLUDE_DOMAINS"));
    let s = Settings::from_lookup(|k| (k == crate::settings::DOMAINS).then(|| "docker*".into()))
        .unwrap();
    let s = Settings {
        exclude_domains: vec![],
        ..s
    };
    assert_eq!(decide(&c, &s).devices, vec![0]);
}

#[test]
fn nothing_at_all_is_a_failure_naming_the_request() {
    let d = decide(&[], &settings("auto"));
    let Some(Failure::NoProvider(text)) = d.failure else {
        panic!()
    };
    assert!(text.contains("no libfabric provider matched"), "{text}");
}

/// tcp;ofi_rxm as fi_getinfo lists it on a host with one NIC: eth0 by link-local IPv6 first,
/// then IPv4, then loopback by IPv4 and IPv6.
fn host_with_one_nic() -> Vec<Candidate> {
    let at = |domain: &str, addr: &str| {
        let mut c = cand(Pass::Host, "tcp;ofi_rxm", domain, false, ENOPROTOOPT);
        c.src = Some(addr.parse().unwrap());
        c
    };
    vec![
        at("eth0", "[fe80::fc:ff:fe00:1]:0"),
        at("eth0", "192.0.2.2:0"),
        at("eth0", "[fd00::2]:0"),
        at("lo", "127.0.0.1:0"),
        at("lo", "[::1]:0"),
    ]
}

#[test]
fn loopback_is_no_device_beside_a_real_nic() {
    let world = host_with_one_nic();
    let d = decide(&world, &settings("auto"));
    assert_eq!(d.devices, vec![1], "eth0 by IPv4 only: {:?}", d.verdicts);
    assert!(!d.loopback_only);
    for i in [3, 4] {
        assert!(!d.verdicts[i].accepted);
        assert!(
            d.verdicts[i].reason.contains(LOOPBACK_LEFT_OUT),
            "{}",
            d.verdicts[i].reason
        );
    }
    for i in [0, 2] {
        assert!(
            d.verdicts[i].reason.contains("one device per interface"),
            "{}",
            d.verdicts[i].reason
        );
    }
}

#[test]
fn an_interface_without_ipv4_serves_by_its_routable_ipv6() {
    let mut world = host_with_one_nic();
    world.remove(1);
    let d = decide(&world, &settings("auto"));
    assert_eq!(d.devices, vec![1]);
    assert!(d.verdicts[1].reason.contains("chosen"));
}

#[test]
fn loopback_alone_is_a_device_and_said_so() {
    let world: Vec<Candidate> = host_with_one_nic().into_iter().skip(3).collect();
    let d = decide(&world, &settings("auto"));
    assert_eq!(d.devices, vec![0]);
    assert!(d.loopback_only);
    assert!(LOOPBACK_ONLY.contains("this job can span one host"));
}

#[test]
fn named_domains_are_devices_loopback_included() {
    let world = host_with_one_nic();
    for (named, want) in [("eth0,lo", vec![1, 3]), ("lo", vec![3])] {
        let s = Settings::from_lookup(|k| (k == crate::settings::DOMAINS).then(|| named.into()))
            .unwrap();
        let d = decide(&world, &s);
        assert_eq!(d.devices, want, "NCCL_FABRIC_DOMAINS={named}");
    }
}
