pub const SPECS_HELP: &str = "";
#[derive(Debug, clap::Subcommand)]
pub enum DevCommand {
    Info,
}
pub fn run(_c: DevCommand) -> anyhow::Result<()> {
    Ok(())
}
