//! `kura bench crc`: the slides' CRC32C microbenchmark — a table-driven scalar loop, the SSE4.2
//! `crc32` instruction one word at a time, and vectorized folding (`crc-fast`, what AccelFS
//! uses), with the `crc32c` crate as an outside peer — from 64 B to 1 MiB, in GiB/s.

use crate::output::{plot_help, OutputArgs};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Arguments of `kura bench crc`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("plot", |a| plot_help(a, "crc")))]
pub struct CrcArgs {
    /// Seconds per measured point.
    #[arg(long, default_value_t = 0.2)]
    pub seconds: f64,
    #[command(flatten)]
    pub output: OutputArgs,
}

const PLOT_SCRIPT: &str = include_str!("../../../scripts/plot_crc.py");

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct CrcPoint {
    pub method: String,
    pub bytes: usize,
    pub gib_per_s: f64,
}

const SIZES: &[usize] = &[64, 256, 1024, 4096, 16384, 65536, 262144, 1048576];

/// The Castagnoli polynomial, reflected.
const POLY: u32 = 0x82F6_3B78;

fn table() -> &'static [u32; 256] {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
            *slot = c;
        }
        t
    })
}

/// Byte-at-a-time table-driven CRC32C, the portable baseline.
pub fn crc32c_table(data: &[u8]) -> u32 {
    let t = table();
    !data.iter().fold(!0u32, |c, &b| {
        t[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

/// CRC32C with the SSE4.2 `crc32` instruction, 8 bytes per step; `None` without SSE4.2.
pub fn crc32c_instruction(data: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE4.2, checked just above.
            return Some(unsafe { crc32c_sse42(data) });
        }
    }
    let _ = data;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = !0u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        c = _mm_crc32_u64(c, u64::from_le_bytes(b));
    }
    let mut c = c as u32;
    for &b in words.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

fn gib_per_s(bytes: usize, seconds: f64, mut f: impl FnMut() -> u32) -> f64 {
    let budget = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut iters = 0u64;
    let mut sink = 0u32;
    while start.elapsed() < budget || iters == 0 {
        for _ in 0..64 {
            sink ^= f();
        }
        iters += 64;
    }
    std::hint::black_box(sink);
    (bytes as f64 * iters as f64) / start.elapsed().as_secs_f64() / (1u64 << 30) as f64
}

/// Runs `kura bench crc`.
pub fn run(args: &CrcArgs) -> anyhow::Result<()> {
    if !(0.001..=60.0).contains(&args.seconds) {
        anyhow::bail!("--seconds must be between 0.001 and 60");
    }
    let data: Vec<u8> = (0..SIZES[SIZES.len() - 1])
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
        .collect();
    // Every method must agree before any is timed.
    for &n in SIZES {
        let d = &data[..n];
        let want = crc32c_table(d);
        let fast = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, d) as u32;
        if fast != want
            || crc32c::crc32c(d) != want
            || crc32c_instruction(d).is_some_and(|c| c != want)
        {
            anyhow::bail!("CRC32C implementations disagree on {n} bytes");
        }
    }
    let mut points = Vec::new();
    println!("CRC32C throughput (GiB/s), {} s per point", args.seconds);
    println!(
        "{:>9} {:>12} {:>14} {:>16} {:>14}",
        "size", "table", "crc32 instr.", "folding (kura)", "crc32c crate"
    );
    for &n in SIZES {
        let d = &data[..n];
        let table = gib_per_s(n, args.seconds, || crc32c_table(std::hint::black_box(d)));
        let instr = crc32c_instruction(d).map(|_| {
            gib_per_s(n, args.seconds, || {
                crc32c_instruction(std::hint::black_box(d)).unwrap_or(0)
            })
        });
        let fold = gib_per_s(n, args.seconds, || {
            crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, std::hint::black_box(d)) as u32
        });
        let peer = gib_per_s(n, args.seconds, || crc32c::crc32c(std::hint::black_box(d)));
        let shown = instr.map_or("n/a".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:>8}B {table:>12.2} {shown:>14} {fold:>16.2} {peer:>14.2}",
            n
        );
        points.push(CrcPoint {
            method: "table".into(),
            bytes: n,
            gib_per_s: table,
        });
        if let Some(v) = instr {
            points.push(CrcPoint {
                method: "crc32 instruction".into(),
                bytes: n,
                gib_per_s: v,
            });
        }
        points.push(CrcPoint {
            method: "folding (crc-fast)".into(),
            bytes: n,
            gib_per_s: fold,
        });
        points.push(CrcPoint {
            method: "crc32c crate".into(),
            bytes: n,
            gib_per_s: peer,
        });
    }
    args.output.emit("crc", PLOT_SCRIPT, &points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_gives_the_check_value() {
        assert_eq!(crc32c_table(b"123456789"), 0xE306_9283);
        if let Some(c) = crc32c_instruction(b"123456789") {
            assert_eq!(c, 0xE306_9283);
        }
        let odd: Vec<u8> = (0..1001u32).map(|i| i as u8).collect();
        assert_eq!(
            crc32c_instruction(&odd).unwrap_or(crc32c_table(&odd)),
            crc32c_table(&odd)
        );
    }

    #[test]
    fn a_short_run_measures_every_size() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("crc.json");
        run(&CrcArgs {
            seconds: 0.001,
            output: OutputArgs {
                json: Some(json.clone()),
                plot: Some(dir.path().join("crc.png")),
            },
        })
        .unwrap();
        let v: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert!(v.len() >= SIZES.len() * 3);
        assert!(v.iter().all(|p| p["gib_per_s"].as_f64().unwrap() > 0.0));
    }
}
