//! `nccl-net-fabric`: the plugin's command-line companion.
//!
//! - `doctor [--json] [--selftest]`: which libfabric provider NCCL would get, whether GPU
//!   buffers (FI_HMEM) would be used, and why; with `--selftest`, also a loopback transfer
//!   through the installed plugin's table. Exits non-zero when nothing is usable.
//! - `demo [--plugin PATH]`: loads the plugin `.so` as NCCL does, prints its provider report
//!   and devices, then moves data through the exported table over loopback.
//! - `settings [--markdown]`: the `NCCL_FABRIC_*` settings with their values in this
//!   environment, validated, and what `auto` resolves to on this machine.
//! - `conform [--provider NAME] [--domain NAME] [--json] [--peer HOST:PORT | --listen PORT]`:
//!   NCCL's call pattern against one provider in two processes, one row per check; exits 1
//!   when a check NCCL needs fails.

mod conform;
mod demo;
mod doctor;
mod settings;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "nccl-net-fabric",
    version,
    about = "The companion of the nccl-net-fabric NCCL network plugin: which libfabric \
             provider NCCL would use and why, a loopback demo, and the plugin's settings"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Which libfabric provider NCCL would use, whether GPU buffers (FI_HMEM) would be
    /// used, and why; exits 1 when nothing is usable
    Doctor {
        /// The report as one JSON object
        #[arg(long)]
        json: bool,
        /// Every candidate with its verdict, and where each device's values came from
        #[arg(long)]
        verbose: bool,
        /// Then move data through the plugin's exported table over loopback, as NCCL would
        #[arg(long)]
        selftest: bool,
        /// The plugin library the self-test loads (default: the one installed with this tool)
        #[arg(long, value_name = "PATH", requires = "selftest")]
        plugin: Option<PathBuf>,
    },
    /// Load the plugin as NCCL does and run a loopback transfer through its table
    Demo {
        /// The plugin library (default: the one installed or built with this tool)
        #[arg(long, value_name = "PATH")]
        plugin: Option<PathBuf>,
    },
    /// NCCL's call pattern against one provider, in two processes through the plugin's table:
    /// one row per check (what was tried, what the provider did, what it means under NCCL);
    /// exits 1 when a check NCCL needs fails
    Conform {
        /// The libfabric provider (NCCL_FABRIC_PROVIDER), e.g. `tcp;ofi_rxm`
        #[arg(long, value_name = "NAME")]
        provider: Option<String>,
        /// The domain (NCCL_FABRIC_DOMAINS), e.g. `eth0`
        #[arg(long, value_name = "NAME")]
        domain: Option<String>,
        /// The report as one JSON object
        #[arg(long)]
        json: bool,
        /// Run against the other side on another host, started there with --listen
        #[arg(long, value_name = "HOST:PORT", conflicts_with = "listen")]
        peer: Option<String>,
        /// Be the other side for a `conform --peer` on another host
        #[arg(long, value_name = "PORT")]
        listen: Option<u16>,
        /// The plugin library (default: the one installed or built with this tool)
        #[arg(long, value_name = "PATH")]
        plugin: Option<PathBuf>,
        /// (internal) the other side on this host, started by `conform` itself
        #[arg(long, value_name = "HOST:PORT", hide = true)]
        responder_of: Option<String>,
    },
    /// The NCCL_FABRIC_* settings: this environment's values, validated, and what `auto`
    /// resolves to here; exits 1 on an invalid value
    Settings {
        /// Print the documentation table (Markdown) instead
        #[arg(long)]
        markdown: bool,
    },
}

fn main() -> ExitCode {
    // SAFETY: restoring the default action for SIGPIPE before any thread starts: a closed
    // pipe (`doctor | head`) then ends this tool quietly, as it does any Unix filter,
    // instead of making every later print fail.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match cli.command {
        Command::Doctor {
            json,
            verbose,
            selftest,
            plugin,
        } => {
            let code = doctor::run(json, verbose);
            if !selftest || code != ExitCode::SUCCESS {
                return code;
            }
            println!();
            demo::selftest(plugin)
        }
        Command::Demo { plugin } => demo::run(plugin),
        Command::Conform {
            provider,
            domain,
            json,
            peer,
            listen,
            plugin,
            responder_of,
        } => conform::run(conform::Args {
            provider,
            domain,
            json,
            peer,
            listen,
            responder_of,
            plugin,
        }),
        Command::Settings { markdown: true } => {
            print!("{}", nccl_net_fabric::settings::markdown_table());
            ExitCode::SUCCESS
        }
        Command::Settings { markdown: false } => settings::run(),
    }
}
