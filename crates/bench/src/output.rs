//! What every benchmark shares about its results: the `--quick`, `--json` and `--plot`
//! arguments (flattened into each bench's arguments with `#[command(flatten)]`) and
//! [`OutputArgs::emit`], which writes the JSON report and draws the PNG plot with the bench's
//! Python script.
//!
//! The plotting scripts are compiled into the binary so `kura` works from any directory; without
//! python3 or matplotlib the plot is skipped with the reason.

use anyhow::Context;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `--json` and `--plot`: where a bench's results go.
///
/// A bench names its default plot file with `#[command(mut_arg("plot", ...))]` and
/// [`plot_help`], so its `--help` says where the plot lands.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OutputArgs {
    /// Write every figure as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a PNG plot to this file (default: next to --json, else bench-out/BENCH.png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Do not draw the PNG plot (saves the Python start-up, about 1.5 s, in scripted runs).
    #[arg(long, conflicts_with = "plot")]
    pub no_plot: bool,
}

/// `--quick` and the [`OutputArgs`]: what every bench but `crc` takes besides its own options.
///
/// A bench says what its short run leaves out with `#[command(mut_arg("quick", ...))]`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// A short run for smoke tests.
    #[arg(long)]
    pub quick: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The help of `--plot` for the bench called `name` (its default file is `bench-out/NAME.png`).
pub fn plot_help(arg: clap::Arg, name: &str) -> clap::Arg {
    arg.help(format!(
        "Write a PNG plot to this file (default: next to --json, else bench-out/{name}.png)"
    ))
}

impl OutputArgs {
    /// Where the plot goes: `--plot`, else next to `--json`, else `bench-out/{name}.png`.
    pub fn png(&self, name: &str) -> PathBuf {
        match (&self.plot, &self.json) {
            (Some(p), _) => p.clone(),
            (None, Some(j)) => j.with_extension("png"),
            (None, None) => PathBuf::from(format!("bench-out/{name}.png")),
        }
    }

    /// Writes `report` as JSON to `--json` (if given), draws it with the plotting `script` to
    /// [`png`](Self::png), and prints where each went (or why the plot was skipped).
    pub fn emit(&self, name: &str, script: &str, report: &impl Serialize) -> anyhow::Result<()> {
        if let Some(path) = &self.json {
            create_parent(path)?;
            std::fs::write(path, serde_json::to_string_pretty(report)?)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("JSON: {}", path.display());
        }
        if self.no_plot {
            println!("plot: not drawn (--no-plot)");
            return Ok(());
        }
        let png = self.png(name);
        match render_with(script, report, &png) {
            Ok(()) => println!("plot: {}", png.display()),
            Err(e) => println!("plot skipped: {e}"),
        }
        Ok(())
    }
}

fn create_parent(path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    Ok(())
}

/// Runs a plotting `script` (Python source taking `JSON PNG` arguments) on `data`.
pub fn render_with(script: &str, data: &impl Serialize, png: &Path) -> anyhow::Result<()> {
    create_parent(png)?;
    let json = tempfile::NamedTempFile::new()?;
    std::fs::write(json.path(), serde_json::to_string(data)?)?;
    let mut child = Command::new("python3")
        .arg("-")
        .arg(json.path())
        .arg(png)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("python3 is not available ({e})"))?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin for python3"))?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("python3 failed");
        anyhow::bail!("{last}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_goes_where_asked_else_next_to_the_json_else_under_bench_out() {
        let mut o = OutputArgs::default();
        assert_eq!(o.png("io"), PathBuf::from("bench-out/io.png"));
        o.json = Some("r/x.json".into());
        assert_eq!(o.png("io"), PathBuf::from("r/x.png"));
        o.plot = Some("p.png".into());
        assert_eq!(o.png("io"), PathBuf::from("p.png"));
    }

    #[test]
    fn emit_writes_the_json_and_creates_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let o = OutputArgs {
            json: Some(dir.path().join("sub/r.json")),
            plot: Some(dir.path().join("sub/r.png")),
            no_plot: false,
        };
        o.emit("t", "import sys\n", &vec![1, 2]).unwrap();
        let text = std::fs::read_to_string(dir.path().join("sub/r.json")).unwrap();
        assert_eq!(serde_json::from_str::<Vec<u32>>(&text).unwrap(), vec![1, 2]);
    }

    #[test]
    fn no_plot_writes_the_json_and_leaves_the_png_undrawn() {
        let dir = tempfile::tempdir().unwrap();
        let o = OutputArgs {
            json: Some(dir.path().join("r.json")),
            plot: None,
            no_plot: true,
        };
        // A script that would fail proves it is never run.
        o.emit("t", "raise SystemExit(3)\n", &vec![1]).unwrap();
        assert!(dir.path().join("r.json").exists());
        assert!(!dir.path().join("r.png").exists());
    }

    #[test]
    fn every_bench_takes_the_shared_flags_and_names_its_plot() {
        use clap::{Args, Command};
        let benches = [
            ("io", crate::io::IoArgs::augment_args(Command::new("io"))),
            (
                "crc",
                crate::crc::CrcArgs::augment_args(Command::new("crc")),
            ),
            (
                "fs",
                crate::fs::FsBenchArgs::augment_args(Command::new("fs")),
            ),
            (
                "kv",
                crate::kv::KvBenchArgs::augment_args(Command::new("kv")),
            ),
            (
                "drives",
                crate::drives::DrivesArgs::augment_args(Command::new("drives")),
            ),
            (
                "genome",
                crate::genome::GenomeBenchArgs::augment_args(Command::new("genome")),
            ),
            (
                "crush",
                crate::crush::CrushBenchArgs::augment_args(Command::new("crush")),
            ),
        ];
        for (name, cmd) in benches {
            cmd.clone().debug_assert();
            let help = cmd.clone().render_long_help().to_string();
            assert!(help.contains(&format!("bench-out/{name}.png")), "{help}");
            assert!(help.contains("--json <JSON>"), "{help}");
            assert_eq!(help.contains("--quick"), name != "crc", "{help}");
        }
    }
}
