//! fio, the peer of `kura bench io`: run on the same file with the same pattern, size and depth
//! (io_uring engine, O_DIRECT), in two configurations — plain, and with registered files and
//! fixed buffers (`--registerfiles --fixedbufs`, as kura's `uring` backend uses them) — and its
//! JSON report parsed. Each run keeps its exact command line.

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
    /// Run with `--registerfiles --fixedbufs`.
    pub registered: bool,
    /// The command line, as run.
    pub command: String,
}

/// The fio binary on PATH, if any.
pub fn find() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("fio"))
        .find(|p| p.is_file())
}

/// One fio job's shape: `rw` is fio's name (`randread`, `randwrite`, `read`, `write`). Like
/// kura's points, it stops after `runtime` or after `io_bytes` of I/O, whichever comes first,
/// so both sides do the same work.
#[derive(Debug, Clone, Copy)]
pub struct FioJob<'a> {
    pub file: &'a Path,
    pub rw: &'a str,
    pub bytes: usize,
    pub depth: usize,
    pub runtime: Duration,
    pub io_bytes: u64,
    /// `--registerfiles --fixedbufs`: the file and buffers registered with the ring once.
    pub registered: bool,
}

/// fio's arguments for `job` (after the program name).
pub fn args(job: &FioJob) -> Vec<String> {
    let mut a = vec![
        "--name=kura-peer".to_string(),
        format!("--filename={}", job.file.display()),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        "--output-format=json".into(),
        "--randrepeat=0".into(),
    ];
    if job.registered {
        a.push("--registerfiles".into());
        a.push("--fixedbufs".into());
    }
    a.push(format!("--io_size={}", job.io_bytes));
    a.push(format!("--rw={}", job.rw));
    a.push(format!("--bs={}", job.bytes));
    a.push(format!("--iodepth={}", job.depth));
    a.push(format!("--runtime={}ms", job.runtime.as_millis().max(100)));
    a
}

/// Runs fio once.
pub fn run(fio: &Path, job: &FioJob) -> anyhow::Result<FioResult> {
    let argv = args(job);
    let out = Command::new(fio).args(&argv).output()?;
    if !out.status.success() {
        anyhow::bail!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut r = parse(
        &String::from_utf8_lossy(&out.stdout),
        job.rw,
        job.bytes,
        job.depth,
    )?;
    r.registered = job.registered;
    r.command = std::iter::once(fio.display().to_string())
        .chain(argv)
        .collect::<Vec<_>>()
        .join(" ");
    Ok(r)
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
        registered: false,
        command: String::new(),
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

    #[test]
    fn the_registered_variant_adds_exactly_registerfiles_and_fixedbufs() {
        let job = FioJob {
            file: Path::new("/t/img"),
            rw: "randread",
            bytes: 4096,
            depth: 32,
            runtime: Duration::from_millis(250),
            io_bytes: 1 << 20,
            registered: false,
        };
        let plain = args(&job);
        assert_eq!(
            plain,
            [
                "--name=kura-peer",
                "--filename=/t/img",
                "--ioengine=io_uring",
                "--direct=1",
                "--output-format=json",
                "--randrepeat=0",
                "--io_size=1048576",
                "--rw=randread",
                "--bs=4096",
                "--iodepth=32",
                "--runtime=250ms",
            ]
        );
        let registered = args(&FioJob {
            registered: true,
            ..job
        });
        let extra: Vec<&String> = registered.iter().filter(|a| !plain.contains(a)).collect();
        assert_eq!(extra, ["--registerfiles", "--fixedbufs"]);
        assert_eq!(registered.len(), plain.len() + 2);
        // Runtimes under 100 ms are raised to fio's useful minimum.
        let short = args(&FioJob {
            runtime: Duration::from_millis(5),
            ..job
        });
        assert!(short.contains(&"--runtime=100ms".to_string()));
    }
}
