use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = pgfleet::cli::Cli::parse();
    // `run` installs logging and traces itself once its `[telemetry]`
    // settings are loaded (pgfleet::telemetry::init).
    if !matches!(cli.command, pgfleet::cli::Command::Run { .. }) {
        pgfleet::telemetry::init_logging();
    }
    // Before any socket: a fleet needs many (platform::limits).
    if let Err(e) = pgfleet::platform::limits::raise_open_files(None) {
        eprintln!("pgfleet: could not raise the open-file limit: {e}");
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pgfleet: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(pgfleet::cli::dispatch(cli)) {
        Ok(code) => std::process::ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("pgfleet: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
