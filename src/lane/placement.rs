//! Which lanes a comm's flows take: how many flows a comm may have, the lane each flow takes
//! counted from the comm's first, the lane each comm of a role starts on, and the progress
//! thread that drives each lane comms start on.

use super::Role;

/// The most flows a comm may have on `lanes` shared lanes per role over `rails` NICs: a
/// connection each, so a lane each over several NICs (flow j must travel on rail j mod rails
/// at both ends), else every pair of a sending and a receiving lane (see [`flow_lane`]), up
/// to a flow for headers and one per piece a message can be cut into.
pub fn most_flows(lanes: usize, rails: usize) -> usize {
    let lanes = lanes.max(1);
    match rails > 1 {
        true => lanes,
        false => (lanes * lanes).min(crate::tags::MAX_FLOWS),
    }
}

/// Which lane, counted from a comm's first, flow `k` of its `flows` takes of `lanes`. Up to
/// one flow per lane, the lanes in turn. Where the flows outnumber the lanes, a sending
/// comm goes round its lanes once per `lanes` flows, while a receiving one gives each lane
/// `flows / lanes` (rounded up) consecutive flows: flow k then pairs sending lane k mod L
/// with receiving lane k div m, a different pair of endpoints, so a connection of its own,
/// for every flow (up to L x L flows on L lanes a side, when both ends have the same lanes).
pub fn flow_lane(role: Role, k: usize, flows: usize, lanes: usize) -> usize {
    let lanes = lanes.max(1);
    match role {
        Role::Sending => k % lanes,
        Role::Receiving => (k / flows.div_ceil(lanes).max(1)) % lanes,
    }
}

/// The lanes, counted in the pool, that the flows of a comm of `flows` flows take where its
/// first lane is `first`, of `lanes` (see [`flow_lane`]): flow 0's first.
pub fn flow_slots(
    role: Role,
    first: usize,
    flows: usize,
    lanes: usize,
) -> impl Iterator<Item = usize> {
    let lanes = lanes.max(1);
    (0..flows).map(move |k| (first + flow_lane(role, k, flows, lanes)) % lanes)
}

/// The lane the `n`-th comm of a role starts on, of `lanes`, for comms of `flows` flows (the
/// lanes from the first on) on a device of `rails` NICs. Over several rails, a lane of the
/// first rail (see `LaneConfig::rails`). Where the lanes hold several whole sets of flows,
/// consecutive comms start a set apart (0, 16, 1, 17, … for 32 lanes and 16 flows): their
/// flows are then distinct connections, which a network that caps each one lets add up.
/// Where they hold one set, sending comms start in turn and receiving ones two lanes apart:
/// the c-th comm between two ranks then pairs sending lane n + k with receiving lane 2n + k,
/// so its flows are connections no earlier comm of theirs has (up to `lanes` comms), where
/// starting both in turn gave every comm the same connections.
pub fn first_lane(role: Role, n: usize, lanes: usize, flows: usize, rails: usize) -> usize {
    let lanes = lanes.max(1);
    if rails > 1 {
        return n.wrapping_mul(rails) % lanes;
    }
    let sets = lanes / flows.max(1);
    match (sets, flows, role) {
        (_, 0 | 1, _) => n % lanes,
        (0 | 1, _, Role::Sending) => n % lanes,
        (0 | 1, _, Role::Receiving) => n.wrapping_mul(2) % lanes,
        _ => ((n % sets) * flows + n / sets) % lanes,
    }
}

/// The progress thread, of `threads`, that drives lane `slot` of a role where comms start on
/// it (see [`first_lane`]): the comms of a role take the threads in turn, receiving ones half
/// the threads on from sending ones. A rank's channels each have a sending and a receiving
/// comm, whose first lanes carry their whole messages and headers, so these lanes then get
/// threads of their own as far as the threads go (with every lane handed to the least
/// loaded thread, a channel's sending and receiving first lanes shared one thread while
/// others had none). `None` for a lane no comm starts on (later flows only): the least
/// loaded thread takes it.
pub fn lane_thread(
    role: Role,
    slot: usize,
    lanes: usize,
    flows: usize,
    rails: usize,
    threads: usize,
) -> Option<usize> {
    let threads = threads.max(1);
    let n = (0..lanes.max(1)).find(|&n| first_lane(role, n, lanes, flows, rails) == slot)?;
    let offset = match role {
        Role::Sending => 0,
        Role::Receiving => threads / 2,
    };
    Some((n + offset) % threads)
}

#[cfg(test)]
mod tests {
    use super::{first_lane, flow_lane, flow_slots, lane_thread, Role};

    #[test]
    fn the_first_lanes_of_a_ranks_channels_get_threads_of_their_own() {
        // Comms of a channel come in pairs, a sending and a receiving one; each pair's first
        // lanes carry whole messages. The first lanes of `channels` pairs on `threads`
        // threads: no thread drives more than its share of them.
        for (lanes, flows) in [(16, 16), (2, 1), (4, 1), (32, 16), (8, 4)] {
            for threads in 1..=8 {
                for channels in 1..=4 {
                    let firsts: std::collections::HashSet<(Role, usize)> = (0..channels)
                        .flat_map(|n| {
                            [Role::Sending, Role::Receiving]
                                .map(|role| (role, first_lane(role, n, lanes, flows, 1)))
                        })
                        .collect();
                    let mut load = vec![0; threads];
                    for &(role, slot) in &firsts {
                        let t = lane_thread(role, slot, lanes, flows, 1, threads)
                            .expect("a comm starts there");
                        load[t] += 1;
                    }
                    assert!(
                        load.iter().all(|&l| l <= firsts.len().div_ceil(threads)),
                        "{lanes} lanes, {flows} flows, {threads} threads, {channels} channels: {load:?}"
                    );
                }
            }
        }
        assert_eq!(lane_thread(Role::Sending, 1, 16, 16, 1, 4), Some(1));
        assert_eq!(lane_thread(Role::Receiving, 0, 16, 16, 1, 4), Some(2));
        assert_eq!(lane_thread(Role::Receiving, 2, 16, 16, 1, 4), Some(3));
        assert_eq!(
            lane_thread(Role::Receiving, 1, 16, 16, 1, 4),
            None,
            "no comm starts there"
        );
    }

    #[test]
    fn flows_beyond_the_lanes_pair_lanes_no_other_flow_pairs() {
        for lanes in 1..=8 {
            for flows in 1..=(lanes * lanes).min(crate::tags::MAX_FLOWS) {
                let pairs: std::collections::HashSet<(usize, usize)> = (0..flows)
                    .map(|k| {
                        let send = flow_lane(Role::Sending, k, flows, lanes);
                        let recv = flow_lane(Role::Receiving, k, flows, lanes);
                        assert!(send < lanes && recv < lanes);
                        (send, recv)
                    })
                    .collect();
                assert_eq!(pairs.len(), flows, "{flows} flows on {lanes} lanes");
            }
        }
        let on = |role, flows, lanes| -> Vec<usize> {
            (0..flows)
                .map(|k| flow_lane(role, k, flows, lanes))
                .collect()
        };
        // Up to a flow per lane, both ends take the lanes in turn, as before.
        assert_eq!(on(Role::Receiving, 4, 16), vec![0, 1, 2, 3]);
        assert_eq!(on(Role::Sending, 4, 16), vec![0, 1, 2, 3]);
        assert_eq!(on(Role::Sending, 6, 4), vec![0, 1, 2, 3, 0, 1]);
        assert_eq!(on(Role::Receiving, 6, 4), vec![0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn comms_start_a_set_of_flows_apart_where_the_lanes_hold_several_sets() {
        let starts = |lanes, flows, rails| -> Vec<usize> {
            (0..6)
                .map(|n| first_lane(Role::Sending, n, lanes, flows, rails))
                .collect()
        };
        assert_eq!(
            starts(16, 16, 1),
            vec![0, 1, 2, 3, 4, 5],
            "one set: in turn"
        );
        // One set: the c-th comm's flows are connections of its own (sending lane n + k to
        // receiving lane 2n + k), for 16 comms on 16 lanes.
        let mut pairs = std::collections::HashSet::new();
        for c in 0..16 {
            let (s, r) = (
                first_lane(Role::Sending, c, 16, 16, 1),
                first_lane(Role::Receiving, c, 16, 16, 1),
            );
            for k in 0..16 {
                assert!(
                    pairs.insert(((s + k) % 16, (r + k) % 16)),
                    "comm {c} flow {k}"
                );
            }
        }
        assert_eq!(
            starts(4, 1, 1),
            vec![0, 1, 2, 3, 0, 1],
            "whole messages: in turn"
        );
        assert_eq!(starts(32, 16, 1), vec![0, 16, 1, 17, 2, 18]);
        assert_eq!(starts(48, 16, 1), vec![0, 16, 32, 1, 17, 33]);
        assert_eq!(starts(16, 16, 4), vec![0, 4, 8, 12, 0, 4], "the first rail");
        // The default shape where NCCL runs two channels between two ranks: two comms a
        // side of 33 flows on 12 lanes a role (`sizing::MAX_FLOW_LANES`). Their 64 piece flows
        // (all but each comm's first) are 64 connections, none shared, so that a network
        // capping each connection lets all of them add up.
        let mut pieces = std::collections::HashSet::new();
        for c in 0..2 {
            let slots = |role| flow_slots(role, first_lane(role, c, 12, 33, 1), 33, 12);
            let pairs = slots(Role::Sending).zip(slots(Role::Receiving));
            for (k, pair) in pairs.enumerate().skip(1) {
                assert!(pieces.insert(pair), "comm {c} flow {k}: {pair:?} taken");
            }
        }
        // Two comms that start one after the other share no lane.
        let lanes_of = |first: usize| (first..first + 16).map(|k| k % 32).collect::<Vec<_>>();
        let (a, b) = (
            lanes_of(first_lane(Role::Receiving, 0, 32, 16, 1)),
            lanes_of(first_lane(Role::Receiving, 1, 32, 16, 1)),
        );
        assert!(a.iter().all(|k| !b.contains(k)));
    }
}
