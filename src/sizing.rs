//! How the plugin sizes itself when the settings leave it to the plugin: the CPUs a rank
//! has, how many progress threads and lanes they carry, and how many flows a device's speed
//! needs. `settings` applies it (`Settings::size_for_devices`) and writes the INFO sizing
//! line.

/// The CPUs this process has, as read once when the settings are parsed: those it may run
/// on, the machine's, and how many ranks share the machine.
#[derive(Debug, Clone, Copy)]
pub struct Cpus {
    /// CPUs this process may run on (its affinity mask, as `sched_getaffinity` gives it).
    pub allowed: usize,
    /// CPUs of the machine (/proc/cpuinfo; 0 if unreadable).
    pub machine: usize,
    /// Ranks sharing this machine, from what launchers put in the environment (Open MPI,
    /// MPICH/Hydra, Slurm, torchrun), if any says.
    pub local_ranks: Option<usize>,
}

impl Cpus {
    pub fn detect() -> Self {
        Cpus {
            allowed: std::thread::available_parallelism().map_or(1, |n| n.get()),
            machine: std::fs::read_to_string("/proc/cpuinfo")
                .map(|t| t.matches("processor\t").count())
                .unwrap_or(0),
            local_ranks: [
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MPI_LOCALNRANKS",
                "SLURM_NTASKS_PER_NODE",
                "LOCAL_WORLD_SIZE",
            ]
            .iter()
            .find_map(|k| std::env::var(k).ok()?.trim().parse().ok()),
        }
    }

    /// CPUs this process can count on: those it may use, shared with the other ranks of the
    /// machine when they may use the same ones (unbound ranks all see every CPU).
    pub fn per_rank(&self) -> usize {
        let machine = self.machine.max(self.allowed);
        match self.local_ranks {
            Some(n) if n > 1 && self.allowed == machine => (self.allowed / n).max(1),
            _ => self.allowed,
        }
    }
}

/// How long progress threads that fit in the rank's CPUs go without work before they sleep
/// (`NCCL_FABRIC_PROGRESS_SPIN_US` unset): longer than the gaps between a collective's
/// steps. On the GPU machine (two ranks on 16 cores) sleeping after 50 µs cost 15–25 % of
/// all_reduce's busbw and saved no CPU time.
pub const SPIN_US: u64 = 20_000;
/// The same for threads forced onto fewer CPUs than they need: on 2 cores, threads that sleep
/// after 50 µs moved 2–3× as much as threads that spin (`benches/transfer.rs`).
pub const SPIN_CROWDED_US: u64 = 50;

/// Threads NCCL itself keeps busy in each rank: its proxy thread, which calls the plugin,
/// and the thread that drives the GPU.
pub const NCCL_BUSY_THREADS: usize = 2;

/// Most progress threads `auto` gives a rank.
pub const MAX_AUTO_THREADS: usize = 8;

/// The rate one TCP flow is assumed to carry when `auto` picks a device's flows: low, since
/// flows cost no threads, only a connection and an endpoint each (clouds cap a flow at
/// 1–10 Gbps; NCCL's Socket transport opens 16 per comm there).
pub const FLOW_MBPS: u64 = 500;

/// How `auto` sizes the plugin for one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Lanes per direction per device where messages go whole (a device with flows has as
    /// many lanes as flows).
    pub lanes: usize,
    /// Progress threads per device.
    pub threads: usize,
    /// Whether to run them: they fit in the rank's CPUs beside NCCL's own busy threads.
    pub threaded: bool,
}

/// Lanes, progress threads and whether to run them, for `cpus` CPUs of one rank and
/// `devices` devices in use. The threads, half the CPUs (at least 2, at most
/// [`MAX_AUTO_THREADS`]) shared by the devices, drive every endpoint between them, however
/// many flows there are; where they do not fit beside NCCL's own, NCCL's calls drive. (On
/// the GPU machine, two ranks as two hosts with 8 CPUs each, all_reduce at 1 GiB moved
/// 3.9 GB/s with 2 threads, 7.2 with 4 and 6.2 with 8.) Where
/// messages go whole, NCCL's channels spread over (CPUs - 2) / (3 x devices) lanes, from 1 to
/// 4: each an endpoint on a domain of its own (on 16 cores shared by two ranks, 2 moved as
/// much as 3 and 4).
pub fn sizing_for(cpus: usize, devices: usize) -> Sizing {
    let devices = devices.max(1);
    let spare = cpus.saturating_sub(NCCL_BUSY_THREADS);
    let threads = ((cpus / 2).clamp(2, MAX_AUTO_THREADS) / devices).max(1);
    Sizing {
        lanes: (spare / (3 * devices)).clamp(1, 4),
        threads,
        threaded: threads_fit(cpus, threads * devices),
    }
}

/// Whether `threads` progress threads fit in `cpus` CPUs beside NCCL's own busy threads.
pub fn threads_fit(cpus: usize, threads: usize) -> bool {
    cpus.saturating_sub(NCCL_BUSY_THREADS) >= threads
}

/// The most flows `auto` gives a device: 32 for pieces and the first, which carries whole
/// messages and headers (see `comm::piece_flows`). Where a network caps each connection, a
/// comm moves as many connections' worth as it keeps busy, and NCCL's Socket transport keeps
/// 16 data sockets per comm busy in its cloud shape (2 threads x 8 sockets): 16 piece flows
/// could only match it. On the GPU machine (NCCL's 2 channels, a comm each way per channel,
/// every connection capped at 250 Mbit/s) Socket 2x8 moved 0.94 GB/s in all_reduce, the
/// plugin 0.80 with 17 flows and 1.00 with 32 (H100); uncapped, 32 flows moved about what 17
/// did (6.37 against 6.76 GB/s at 1 GiB, 6.05 against 5.97 on average; BENCHMARKS.md).
/// Flows cost nothing while messages go whole on the first one: their connections are made
/// when a comm first cuts a message over them. 32 piece flows, not 31: NCCL's 1 MiB slices go
/// in 32 pieces (`pace::FINE_PIECE`), and a flow that takes two holds up the whole message.
pub const MAX_AUTO_FLOWS: usize = 33;

/// The most lanes `auto` opens for a device's flows on one NIC; flows beyond them pair a
/// sending lane with a receiving one (connections of their own on the same endpoints), so
/// 33 flows cost no more endpoints, nor their buffers, than 12. 12, not fewer: the 32 piece
/// flows of each of the two comms a side that NCCL's two channels open between two ranks are
/// then 64 connections, none shared (`lane::first_lane`; on 8 lanes they would be 44), so
/// a network that caps each connection lets them all add up; and not more, for each endpoint
/// holds rxm's pools of eager buffers (60.2 MiB with the 33 KiB buffers of
/// `quirks::RXM_DEFAULTS`).
pub const MAX_FLOW_LANES: usize = 12;

/// The flows `auto` gives a device of `speed_mbps`: enough flows of [`FLOW_MBPS`] to carry
/// it, from 1 to [`MAX_AUTO_FLOWS`].
pub fn flows_for(speed_mbps: u64) -> usize {
    speed_mbps
        .div_ceil(FLOW_MBPS)
        .clamp(1, MAX_AUTO_FLOWS as u64) as usize
}

/// Lanes per role for a device of `flows` flows over `rails` NICs, where `lanes` were set,
/// or (`auto`) sized for the CPUs: a lane per flow too, up to [`MAX_FLOW_LANES`] on one NIC
/// (the flows beyond pair a sending lane with a receiving one), every flow on several (flow
/// `j` travels on rail `j mod rails` at both ends, a lane of its own).
pub fn lanes_for_flows(lanes: usize, auto: bool, flows: usize, rails: usize) -> usize {
    match (auto, rails > 1) {
        (true, true) => lanes.max(flows),
        (true, false) => lanes.max(flows.min(MAX_FLOW_LANES)),
        (false, _) => lanes,
    }
}

#[cfg(test)]
mod tests {
    use super::{
        flows_for, lanes_for_flows, sizing_for, Sizing, MAX_AUTO_THREADS, MAX_FLOW_LANES,
        NCCL_BUSY_THREADS,
    };

    #[test]
    fn ranks_sharing_a_machine_get_fewer_lanes_and_threads() {
        let sized = |lanes, threads, threaded| Sizing {
            lanes,
            threads,
            threaded,
        };
        assert_eq!(
            sizing_for(32, 1),
            sized(4, 8, true),
            "one rank on a GPU host"
        );
        assert_eq!(sizing_for(16, 1), sized(4, 8, true), "one rank on 16 cores");
        assert_eq!(
            sizing_for(16 / 2, 1),
            sized(2, 4, true),
            "two ranks sharing 16 cores"
        );
        assert_eq!(
            sizing_for(64 / 8, 1),
            sized(2, 4, true),
            "8 ranks on a 64-core node"
        );
        assert_eq!(
            sizing_for(32 / 8, 1),
            sized(1, 2, true),
            "8 ranks sharing 32 CPUs"
        );
        assert_eq!(
            sizing_for(8, 2),
            sized(1, 2, true),
            "two devices share the rank's CPUs"
        );
        assert_eq!(sizing_for(2, 1), sized(1, 2, false), "one rank on 2 cores");
        assert_eq!(
            sizing_for(1, 1),
            sized(1, 2, false),
            "a rank bound to one core"
        );
        for cpus in 1..=256 {
            for devices in 1..=4 {
                let s = sizing_for(cpus, devices);
                assert!((1..=4).contains(&s.lanes));
                assert!(s.threads * devices <= MAX_AUTO_THREADS.max(devices));
                assert!(
                    s.threads * devices <= (cpus / 2).max(2).max(devices),
                    "{cpus} CPUs: at most half of them busy (2 at least)"
                );
                if s.threaded {
                    assert!(
                        s.threads * devices + NCCL_BUSY_THREADS <= cpus,
                        "{cpus} CPUs, {devices} devices: the busy threads fit"
                    );
                }
            }
        }
    }

    #[test]
    fn flows_beyond_twelve_pair_lanes_on_one_nic() {
        assert_eq!(lanes_for_flows(4, true, 32, 1), MAX_FLOW_LANES);
        assert_eq!(lanes_for_flows(4, true, 20, 1), 12, "a veth's 20 flows");
        assert_eq!(lanes_for_flows(4, true, 8, 1), 8);
        assert_eq!(
            lanes_for_flows(4, true, 1, 1),
            4,
            "messages whole: by the CPUs"
        );
        assert_eq!(
            lanes_for_flows(4, true, 32, 2),
            32,
            "a lane per flow over 2 NICs"
        );
        assert_eq!(lanes_for_flows(4, false, 32, 1), 4, "as set");
    }

    #[test]
    fn flows_carry_the_device_at_a_low_rate_each() {
        assert_eq!(flows_for(0), 1);
        assert_eq!(flows_for(1000), 2, "a 1 Gbps NIC");
        assert_eq!(flows_for(5_000), 10);
        assert_eq!(flows_for(10_000), 20, "a 10 Gbps NIC (and a veth)");
        assert_eq!(flows_for(16_000), 32);
        assert_eq!(flows_for(16_500), 33);
        assert_eq!(flows_for(100_000), 33, "at most 33: 32 take pieces");
    }
}
