//! (in progress)
#[derive(clap::Args, Debug)]
pub struct Options {}

pub fn run(_opts: Options) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
