//! fio, the peer of `kura bench io`: run on the same file with the same pattern, size and depth
//! (io_uring engine, O_DIRECT), and its JSON report parsed.

use serde::Serialize;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// One fio measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FioResult {
    pub rw: String,
    pub bytes: usize,
    pub depth: usize,
    pub iops: f64,
    /// Mean total latency (submission to completion) in µs.
    pub mean_lat_us: f64,
    pub mib_per_s: f64,
}

/// The fio binary on PATH, if any.
pub fn find() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("fio"))
        .find(|p| p.is_file())
}

/// Runs fio once; `rw` is fio's name (`randread`, `randwrite`, `read`, `write`). Like kura's
/// points, it stops after `runtime` or after `io_bytes` of I/O, whichever comes first, so both
/// sides do the same work.
pub fn run(
    fio: &Path,
    file: &Path,
    rw: &str,
    bytes: usize,
    depth: usize,
    runtime: Duration,
    io_bytes: u64,
) -> anyhow::Result<FioResult> {
    let out = Command::new(fio)
        .arg("--name=kura-peer")
        .arg(format!("--filename={}", file.display()))
        .args([
            "--ioengine=io_uring",
            "--direct=1",
            "--output-format=json",
            "--randrepeat=0",
        ])
        .arg(format!("--io_size={io_bytes}"))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bytes}"))
        .arg(format!("--iodepth={depth}"))
        .arg(format!("--runtime={}ms", runtime.as_millis().max(100)))
        .output()?;
    if !out.status.success() {
        anyhow::bail!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse(&String::from_utf8_lossy(&out.stdout), rw, bytes, depth)
}

/// Parses fio's JSON output (fio 3.x) for the first job.
pub fn parse(json: &str, rw: &str, bytes: usize, depth: usize) -> anyhow::Result<FioResult> {
    // fio may print notices before the JSON object.
    let start = json
        .find('{')
        .ok_or_else(|| anyhow::anyhow!("fio printed no JSON"))?;
    let v: serde_json::Value = serde_json::from_str(&json[start..])?;
    let dir = if rw.contains("write") {
        "write"
    } else {
        "read"
    };
    let side = &v["jobs"][0][dir];
    let num = |field: &serde_json::Value, what: &str| {
        field
            .as_f64()
            .ok_or_else(|| anyhow::anyhow!("fio JSON lacks {what}"))
    };
    Ok(FioResult {
        rw: rw.to_string(),
        bytes,
        depth,
        iops: num(&side["iops"], "iops")?,
        mean_lat_us: num(&side["lat_ns"]["mean"], "lat_ns.mean")? / 1000.0,
        mib_per_s: num(&side["bw_bytes"], "bw_bytes")? / 1048576.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "kura-peer",
      "read" : { "io_bytes" : 409600, "bw_bytes" : 209715200, "iops" : 51200.5,
                 "lat_ns" : { "min" : 1000, "max" : 90000, "mean" : 19500.0 } },
      "write" : { "io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.0,
                  "lat_ns" : { "min" : 0, "max" : 0, "mean" : 0.0 } }
    }
  ]
}"#;

    #[test]
    fn parses_the_side_that_did_io() {
        let r = parse(SAMPLE, "randread", 4096, 32).unwrap();
        assert_eq!(r.iops, 51200.5);
        assert_eq!(r.mean_lat_us, 19.5);
        assert_eq!(r.mib_per_s, 200.0);
        assert_eq!(parse(SAMPLE, "randwrite", 4096, 32).unwrap().iops, 0.0);
    }

    #[test]
    fn malformed_output_is_an_error() {
        assert!(parse("fio: engine not found", "read", 4096, 1).is_err());
        assert!(parse("{\"jobs\": []}", "read", 4096, 1).is_err());
    }
}
