//! Sizing what was left to the plugin (lanes, threads, spinning) for the devices in use,
//! and the one line that says how it sized itself.

use super::Settings;
use crate::sizing::{sizing_for, threads_fit, Cpus, NCCL_BUSY_THREADS, SPIN_CROWDED_US, SPIN_US};
use std::time::Duration;

impl Settings {
    /// Sizes what was left to the plugin for the devices NCCL will be told of: the progress
    /// threads of every device share the rank's CPUs.
    pub fn size_for_devices(&mut self, devices: usize) {
        let sized = sizing_for(self.cpus.per_rank(), devices);
        self.devices = devices.max(1);
        if self.lanes_auto {
            self.lanes = sized.lanes;
        }
        if self.thread_count_auto {
            self.threads = sized.threads;
        }
        if self.threads_auto {
            self.progress_thread = sized.threaded;
        }
        if self.spin_auto {
            // Threads that fit spin through a collective's gaps; threads forced onto fewer
            // CPUs than they need (the count set, or threads where the sizing gave none)
            // sleep soon, giving the cores back to NCCL's and each other.
            let fit = threads_fit(self.cpus.per_rank(), self.threads * self.devices);
            let us = if fit { SPIN_US } else { SPIN_CROWDED_US };
            self.progress_spin = Some(Duration::from_micros(us));
        }
    }

    /// Threads of the plugin that are busy while data moves (tcp's sleep in the gaps, other
    /// providers' spin): the progress threads of every device, none without them (NCCL's
    /// calls then drive), whatever the flows.
    pub fn busy_threads(&self) -> usize {
        if self.progress_thread {
            self.threads * self.devices
        } else {
            0
        }
    }

    /// One line on how the plugin sized itself: CPUs, local ranks, threads, each device's
    /// flows and lanes (`devices`, one text each), and what to change.
    pub fn sizing(&self, devices: &[String]) -> String {
        let Cpus {
            allowed: cpus,
            machine,
            local_ranks,
        } = self.cpus;
        let ranks = local_ranks.map_or("unknown".to_string(), |n| n.to_string());
        let hint = if !self.progress_thread && self.threads_auto && machine >= 4 * cpus.max(1) {
            format!(
                " This process is bound to {cpus} of the machine's {machine} CPUs (mpirun \
                 binds one core per rank by default): the plugin then runs no threads of its \
                 own and one lane, and moves less than with more cores (progress threads on \
                 the same core are slower still). Run with --bind-to none, or give each rank \
                 more cores (e.g. mpirun --map-by slot:PE=8)"
            )
        } else {
            String::new()
        };
        let threads = match self.progress_thread {
            true => format!(
                "{} progress thread(s) per device drive all its endpoints{} ({} busy thread(s) \
                 of the plugin while data moves, however many flows)",
                self.threads,
                match self.calls_help {
                    true => ", NCCL's calls taking turns too",
                    false => "",
                },
                self.busy_threads()
            ),
            false => "no progress threads: NCCL's calls drive the endpoints".into(),
        };
        format!(
            "sizing: {cpus} CPUs allowed (machine {machine}), local ranks {ranks}, so {} CPUs \
             for this rank, {NCCL_BUSY_THREADS} of them NCCL's; {threads}; {} (NCCL_FABRIC_FLOWS, \
             NCCL_FABRIC_LANES, NCCL_FABRIC_THREADS, NCCL_FABRIC_PROGRESS_THREAD override).{hint}",
            self.cpus.per_rank(),
            devices.join("; "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::parse::tests::parse;
    use crate::settings::table::setting;
    use crate::settings::{LANES, PROGRESS_SPIN_US, PROGRESS_THREAD, THREADS};

    #[test]
    fn threads_forced_onto_too_few_cpus_sleep_sooner() {
        let sized = |pairs: &[(&str, &str)], cpus: usize| {
            let mut s = parse(pairs).unwrap();
            s.cpus = Cpus {
                allowed: cpus,
                machine: cpus,
                local_ranks: Some(1),
            };
            s.size_for_devices(1);
            (s.progress_thread, s.progress_spin)
        };
        let us = |n| Some(Duration::from_micros(n));
        assert_eq!(
            setting(PROGRESS_SPIN_US).default,
            SPIN_US.to_string(),
            "documented default"
        );
        assert_eq!(sized(&[], 16), (true, us(SPIN_US)), "16 CPUs: threads fit");
        assert_eq!(
            sized(&[], 2),
            (false, us(SPIN_CROWDED_US)),
            "2 CPUs: no threads"
        );
        assert_eq!(
            sized(&[(PROGRESS_THREAD, "yes")], 2),
            (true, us(SPIN_CROWDED_US)),
            "threads forced onto 2 CPUs sleep after 50 µs"
        );
        assert_eq!(
            sized(&[(THREADS, "16")], 16),
            (true, us(SPIN_CROWDED_US)),
            "16 threads do not fit in 16 CPUs beside NCCL's"
        );
        assert_eq!(
            sized(&[(LANES, "16")], 16),
            (true, us(SPIN_US)),
            "lanes cost no threads"
        );
        assert_eq!(
            sized(&[(PROGRESS_THREAD, "yes"), (PROGRESS_SPIN_US, "300")], 2),
            (true, us(300)),
            "a value set is kept"
        );
        assert_eq!(
            sized(&[(PROGRESS_SPIN_US, "10000000")], 16),
            (true, None),
            "never"
        );
    }
}
