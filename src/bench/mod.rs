//! Benchmarks (`pgfleet bench …`). They print figures next to a floor measured
//! in the same run, as a ratio, because absolute timings on shared machines
//! mean little; none of them asserts a time.

pub mod backup;
pub mod chaos;
pub mod dr;
pub mod emulator;
pub mod failover;
mod failover_node;
pub mod fleet;
pub mod major_upgrade;
mod major_upgrade_bg;
pub mod rollout;
mod switchover;

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// The embedded API server: full LIST and watch fan-out at scale.
    Emulator(emulator::Args),
    /// The manager over many emulated clusters: cold converge, change rate, memory.
    Fleet(fleet::Args),
    /// Real PostgreSQL: failover unavailability and switchover write stall.
    Failover(failover::Args),
    /// Cross-cluster DR: planned switchover stall and automatic failover time against bare steps.
    Dr(dr::Args),
    /// In-place major upgrade 15 → 18: writer-seen downtime against bare pg_upgrade.
    MajorUpgrade(major_upgrade::Args),
    /// Fleet rollout pacing against the ideal for its stages, and failure → halt.
    Rollout(rollout::Args),
    /// Backup throughput against bare pgBackRest, and scheduled start spread.
    Backup(backup::Args),
    /// Randomized faults under checked workloads (real PostgreSQL); a markdown report.
    Chaos(chaos::Args),
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Emulator(a) => emulator::run(a).await,
        BenchCommand::Fleet(a) => fleet::run(a).await,
        BenchCommand::Failover(a) => failover::run(a).await,
        BenchCommand::Dr(a) => dr::run(a).await,
        BenchCommand::Rollout(a) => rollout::run(a).await,
        BenchCommand::MajorUpgrade(a) => major_upgrade::run(a).await,
        BenchCommand::Backup(a) => backup::run(a).await,
        BenchCommand::Chaos(a) => chaos::run(a).await,
    }
}
