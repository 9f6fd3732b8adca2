//! `kura bench crc`: the slides' CRC32C microbenchmark — a table-driven scalar loop, the SSE4.2
//! `crc32` instruction one word at a time, and vectorized folding (`crc-fast`, what AccelFS
//! uses), with the `crc32c` crate as an outside peer — from 64 B to 1 MiB, in GiB/s. The
//! methods take turns at each size over `--rounds` rounds (A B C D A B C D …, stats::interleave);
//! each point is the median [min–max] of its rounds, and each method is compared with the crate
//! round by round.

use crate::output::{plot_help, OutputArgs};
use crate::stats::{Compared, Spread};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Arguments of `kura bench crc`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("plot", |a| plot_help(a, "crc")))]
pub struct CrcArgs {
    /// Seconds per measured point in each round.
    #[arg(long, default_value_t = 0.2)]
    pub seconds: f64,
    /// Rounds, the methods interleaved in each (default 5).
    #[arg(long)]
    pub rounds: Option<usize>,
    #[command(flatten)]
    pub output: OutputArgs,
}

const PLOT_SCRIPT: &str = include_str!("../../../scripts/plot_crc.py");

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct CrcPoint {
    pub method: String,
    pub bytes: usize,
    /// The median over the rounds.
    pub gib_per_s: f64,
    /// Median and min–max over the rounds.
    pub range: Spread,
    /// This method against the `crc32c` crate, round by round (absent for the crate itself).
    pub versus_crate: Option<Compared>,
}

/// The methods in the order they take turns; the last is the outside peer.
const METHODS: [&str; 4] = [
    "table",
    "crc32 instruction",
    "folding (crc-fast)",
    "crc32c crate",
];

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

/// One round of `method` on `d`, in GiB/s; `None` where the CPU lacks the method.
fn measure(method: &str, d: &[u8], seconds: f64) -> Option<f64> {
    let n = d.len();
    Some(match method {
        "table" => gib_per_s(n, seconds, || crc32c_table(std::hint::black_box(d))),
        "crc32 instruction" => {
            crc32c_instruction(d)?;
            gib_per_s(n, seconds, || {
                crc32c_instruction(std::hint::black_box(d)).unwrap_or(0)
            })
        }
        "folding (crc-fast)" => gib_per_s(n, seconds, || {
            crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, std::hint::black_box(d)) as u32
        }),
        _ => gib_per_s(n, seconds, || crc32c::crc32c(std::hint::black_box(d))),
    })
}

/// Each method's points at one size from its rounds' samples (`None`: not available here),
/// the last method being the peer the others are compared with.
fn points_of(bytes: usize, samples: &[Option<Vec<f64>>]) -> Vec<CrcPoint> {
    let peer = samples.last().cloned().flatten().unwrap_or_default();
    METHODS
        .iter()
        .zip(samples)
        .filter_map(|(m, s)| {
            let s = s.as_ref()?;
            let range = Spread::of(s);
            Some(CrcPoint {
                method: m.to_string(),
                bytes,
                gib_per_s: range.median,
                range,
                versus_crate: (*m != METHODS[3])
                    .then(|| crate::stats::compare(s, &peer, crate::stats::quotient, None)),
            })
        })
        .collect()
}

/// One method's round at one size, for stats::interleave.
type Side<'a> = dyn FnMut(usize) -> Result<f64, ()> + 'a;

/// Runs `kura bench crc`.
pub fn run(args: &CrcArgs) -> anyhow::Result<()> {
    if !(0.001..=60.0).contains(&args.seconds) {
        anyhow::bail!("--seconds must be between 0.001 and 60");
    }
    let rounds = crate::stats::rounds(args.rounds, false, 1);
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
    let has_instruction = crc32c_instruction(&data[..8]).is_some();
    let mut points = Vec::new();
    println!(
        "CRC32C throughput (GiB/s), {} s per point, median [min-max] of {rounds} interleaved round(s)",
        args.seconds
    );
    println!(
        "{:>9} {:>22} {:>22} {:>22} {:>22} {:>14}",
        "size", "table", "crc32 instr.", "folding (kura)", "crc32c crate", "folding/crate"
    );
    for &n in SIZES {
        let d = &data[..n];
        let mut sides: Vec<Box<Side<'_>>> = METHODS
            .iter()
            .filter(|m| has_instruction || **m != "crc32 instruction")
            .map(|m| {
                let seconds = args.seconds;
                Box::new(move |_| measure(m, d, seconds).ok_or(())) as Box<Side<'_>>
            })
            .collect();
        let mut refs: Vec<&mut Side<'_>> = sides.iter_mut().map(|b| b.as_mut() as _).collect();
        let taken = crate::stats::interleave(rounds, &mut refs)
            .map_err(|()| anyhow::anyhow!("a CRC32C method failed on {n} bytes"))?;
        let mut taken = taken.into_iter();
        let samples: Vec<Option<Vec<f64>>> = METHODS
            .iter()
            .map(|m| {
                if has_instruction || *m != "crc32 instruction" {
                    taken.next()
                } else {
                    None
                }
            })
            .collect();
        let at = points_of(n, &samples);
        let show = |m: &str| {
            at.iter()
                .find(|p| p.method == m)
                .map_or("n/a".to_string(), |p| p.range.show(2))
        };
        let ratio = at
            .iter()
            .find(|p| p.method == METHODS[2])
            .and_then(|p| p.versus_crate.as_ref())
            .map_or("-".to_string(), |c| c.ratio.show(2));
        println!(
            "{:>8}B {:>22} {:>22} {:>22} {:>22} {:>14}",
            n,
            show(METHODS[0]),
            show(METHODS[1]),
            show(METHODS[2]),
            show(METHODS[3]),
            ratio
        );
        points.extend(at);
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
            rounds: Some(3),
            output: OutputArgs {
                json: Some(json.clone()),
                plot: Some(dir.path().join("crc.png")),
                no_plot: false,
            },
        })
        .unwrap();
        let v: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert!(v.len() >= SIZES.len() * 3);
        assert!(v.iter().all(|p| p["gib_per_s"].as_f64().unwrap() > 0.0));
        for p in &v {
            assert_eq!(p["range"]["rounds"], 3, "{p}");
            assert_eq!(p["range"]["median"], p["gib_per_s"]);
            let vs = &p["versus_crate"];
            assert_eq!(vs.is_null(), p["method"] == "crc32c crate", "{p}");
            if !vs.is_null() {
                assert_eq!(vs["ratio"]["rounds"], 3, "{p}");
            }
        }
    }

    #[test]
    fn points_are_medians_compared_with_the_crate_round_by_round() {
        let samples = vec![
            Some(vec![1.0, 3.0, 2.0]),
            None,
            Some(vec![8.0, 4.0, 6.0]),
            Some(vec![2.0, 2.0, 4.0]),
        ];
        let p = points_of(64, &samples);
        assert_eq!(
            p.iter().map(|p| p.method.as_str()).collect::<Vec<_>>(),
            ["table", "folding (crc-fast)", "crc32c crate"],
            "a method the CPU lacks has no point"
        );
        assert_eq!(
            (p[0].gib_per_s, p[0].range.min, p[0].range.max),
            (2.0, 1.0, 3.0)
        );
        // folding against the crate per round: 8/2, 4/2, 6/4.
        let r = p[1].versus_crate.as_ref().unwrap().ratio;
        assert_eq!((r.median, r.min, r.max), (2.0, 1.5, 4.0));
        assert!(p[2].versus_crate.is_none());
    }
}
