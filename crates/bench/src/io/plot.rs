//! The PNG plot of `kura bench io`, drawn by `scripts/plot_bench.py` (matplotlib, the field's
//! plotting tool) from the JSON report. The script is compiled into the binary so `kura` works
//! from any directory; without python3 or matplotlib the plot is skipped with the reason.

use super::Report;
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const SCRIPT: &str = include_str!("../../../../scripts/plot_bench.py");

/// Renders a `kura bench io` report to `png`.
pub fn render(report: &Report, png: &Path) -> anyhow::Result<()> {
    render_with(SCRIPT, report, png)
}

/// Runs a plotting `script` (Python source taking `JSON PNG` arguments) on `data`.
pub fn render_with(script: &str, data: &impl Serialize, png: &Path) -> anyhow::Result<()> {
    if let Some(parent) = png.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
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
