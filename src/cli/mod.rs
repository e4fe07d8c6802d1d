//! The command line: argument definitions and dispatch to the library.

mod dr;
mod ops;
mod remote;
mod remote_ops;
mod rollout;
mod sim;
mod status;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "pgfleet",
    version,
    about = "Out-of-cluster fleet manager for PostgreSQL on Kubernetes",
    long_about = "pgfleet runs the operator pattern for every PostgresCluster in many Kubernetes \
clusters from one central service. `pgfleet run` with no arguments starts the embedded \
three-cluster fleet described by config/fleet.toml."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the fleet manager (default config: the embedded 3-cluster fleet).
    Run {
        /// Fleet TOML (default: config/fleet.toml, else the built-in default).
        #[arg(long, short, env = "PGFLEET_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Run emulated Kubernetes clusters on loopback until interrupted.
    Sim(sim::SimArgs),
    /// Planned switchover of a PostgresCluster (through the pooler when enabled).
    Switchover {
        /// <cluster>/<namespace>/<name>
        target: String,
        /// Instance to promote (default: the most advanced replica).
        #[arg(long)]
        to: Option<String>,
        /// Fleet TOML (to find the member cluster's kubeconfig).
        #[arg(long, short, env = "PGFLEET_CONFIG")]
        config: Option<PathBuf>,
        /// How long to wait for the outcome (0: do not wait).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Fleet rollouts declared in the TOML: dry run, status and controls.
    Rollout {
        #[command(subcommand)]
        command: rollout::RolloutCommand,
        /// Fleet TOML (to find the member clusters).
        #[arg(long, short, env = "PGFLEET_CONFIG", global = true)]
        config: Option<PathBuf>,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Cross-cluster disaster recovery (`[dr.<topology>]`): status,
    /// switchover, promotion.
    Dr {
        #[command(subcommand)]
        command: dr::DrCommand,
        /// Fleet TOML (to find the member clusters).
        #[arg(long, short, env = "PGFLEET_CONFIG", global = true)]
        config: Option<PathBuf>,
    },
    /// Fleet table from a running manager's API: members, PostgresClusters
    /// by phase, the ones needing attention.
    Status {
        /// Fleet TOML (to find the manager's listen address).
        #[arg(long, short, env = "PGFLEET_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// List member clusters or PostgresClusters from a running manager's API.
    Get {
        #[command(subcommand)]
        what: status::GetWhat,
        /// Fleet TOML (to find the manager's listen address).
        #[arg(long, short, env = "PGFLEET_CONFIG", global = true)]
        config: Option<PathBuf>,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
    /// Backups: `backup now <cluster>/<namespace>/<name>` runs one on demand.
    Backup {
        #[command(subcommand)]
        command: BackupCommand,
    },
    /// A new password for a managed role (the application owner or a
    /// spec.roles entry with a passwordSecret): set on the primary, then
    /// written to the role's Secret; open connections keep working.
    RotatePassword {
        /// <cluster>/<namespace>/<name>
        target: String,
        /// The role whose password to rotate.
        #[arg(long)]
        role: String,
        /// Fleet TOML (to find the member cluster's kubeconfig).
        #[arg(long, short, env = "PGFLEET_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
    /// Benchmarks that print figures and ratios to a floor from the same run.
    #[cfg(feature = "bench")]
    Bench {
        #[command(subcommand)]
        what: crate::bench::BenchCommand,
    },
    /// Check a fleet configuration without starting anything.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum BackupCommand {
    /// An on-demand full backup (a PostgresBackup record the manager runs).
    Now {
        /// <cluster>/<namespace>/<name>
        target: String,
        #[arg(long, short, env = "PGFLEET_CONFIG")]
        config: Option<PathBuf>,
        /// How long to wait for the outcome (0: do not wait).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
        #[command(flatten)]
        api: remote::ApiArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Report every problem in FILE with key and line; exit 2 if any.
    Check {
        /// Default: config/fleet.toml, else the built-in default.
        file: Option<PathBuf>,
    },
}

/// Runs the parsed command; returns the process exit code.
pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Sim(args) => sim::run(args).await.map(|_| 0),
        #[cfg(feature = "bench")]
        Command::Bench { what } => crate::bench::run(what).await.map(|_| 0),
        Command::Switchover {
            target,
            to,
            config,
            wait,
            api,
        } => match api.server {
            Some(_) => remote_ops::switchover(&api, &target, to.as_deref(), wait).await,
            None => ops::switchover(config.as_deref(), &target, to.as_deref(), wait).await,
        },
        Command::Rollout {
            command,
            config,
            api,
        } => match api.server {
            Some(_) => remote_ops::rollout(&api, &command).await,
            None => rollout::run(config.as_deref(), command).await,
        },
        Command::Dr { command, config } => dr::run(config.as_deref(), command).await,
        Command::Backup {
            command:
                BackupCommand::Now {
                    target,
                    config,
                    wait,
                    api,
                },
        } => match api.server {
            Some(_) => remote_ops::backup_now(&api, &target, wait).await,
            None => ops::backup_now(config.as_deref(), &target, wait).await,
        },
        Command::Status { config, api } => status::status(&api, config.as_deref()).await,
        Command::Get { what, config, api } => status::get(&what, &api, config.as_deref()).await,
        Command::RotatePassword {
            target,
            role,
            config,
        } => ops::rotate_password(config.as_deref(), &target, &role).await,
        Command::Crd => {
            print!("{}", crate::crd::yaml()?);
            Ok(0)
        }
        Command::Config {
            command: ConfigCommand::Check { file },
        } => {
            let (report, code) =
                crate::config::check_report(file.as_deref(), crate::fleet::check_kubeconfig);
            if code == 0 {
                println!("{report}");
            } else {
                eprintln!("{report}");
            }
            Ok(code)
        }
        Command::Run { config } => crate::manager::run_cli(config.as_deref()).await,
    }
}
