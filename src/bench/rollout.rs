//! `pgfleet bench rollout` (being written).

#[derive(clap::Args, Debug)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
