//! `nccl-net-fabric`: the plugin's command-line companion.
//!
//! - `doctor [--json]`: which libfabric provider NCCL would get, whether GPU buffers
//!   (FI_HMEM) would be used, and why; exits non-zero when nothing is usable.
//! - `demo [--plugin PATH]`: loads the plugin `.so` as NCCL does, prints its provider report
//!   and devices, then moves data through the exported table over loopback.
//! - `settings`: the `NCCL_FABRIC_*` settings table (Markdown).

mod demo;
mod doctor;

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: nccl-net-fabric <command>\n\n  doctor [--json]        which provider NCCL would use, FI_HMEM verdict and why\n  \
         demo [--plugin PATH]   load the plugin like NCCL and run a loopback transfer\n  \
         settings               print the NCCL_FABRIC_* settings table"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("doctor") => doctor::run(&args[1..]),
        Some("demo") => demo::run(&args[1..]),
        Some("settings") => {
            print!("{}", nccl_net_fabric::settings::markdown_table());
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}
