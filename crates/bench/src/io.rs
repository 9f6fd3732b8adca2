//! PLACEHOLDER — `kura bench io` is being written now.

/// Arguments of `kura bench io`.
#[derive(Debug, clap::Args)]
pub struct IoArgs {}

/// Runs `kura bench io`.
pub fn run(_args: &IoArgs) -> anyhow::Result<()> {
    anyhow::bail!("kura bench io is not built yet")
}
