//! The ratios of `kura bench io`: kura against fio (and the targets) in the default run,
//! and the first `--device` against each of the others.

use super::report::{Ratio, Report, ThroughputPoint};

fn find_tput<'a>(
    r: &'a Report,
    backend: &str,
    pattern: &str,
    bytes: usize,
    depth: usize,
) -> Option<&'a ThroughputPoint> {
    r.throughput.iter().find(|t| {
        t.backend == backend && t.pattern == pattern && t.bytes == bytes && t.depth == depth
    })
}

fn ratio(what: String, kura: f64, peer: f64, target: Option<(&str, bool)>) -> Ratio {
    Ratio {
        what,
        kura,
        peer,
        ratio: if peer > 0.0 { kura / peer } else { 0.0 },
        target: target.map(|t| t.0.to_string()),
        met: target.map(|t| t.1),
    }
}

/// kura/fio ratios and the targets, from what was measured.
pub(super) fn ratios(r: &Report) -> Vec<Ratio> {
    let mut out = Vec::new();
    for f in &r.fio {
        let (pattern, kura) = match f.rw.as_str() {
            "randread" if f.depth == 1 => {
                if let Some(l) = r
                    .latency
                    .iter()
                    .find(|l| l.backend == "uring" && l.op == "read" && l.bytes == f.bytes)
                {
                    out.push(ratio(
                        format!(
                            "QD1 {}K read latency µs, uring vs fio (lower is better)",
                            f.bytes >> 10
                        ),
                        l.mean_us,
                        f.mean_lat_us,
                        None,
                    ));
                }
                ("read", find_tput(r, "uring", "read", f.bytes, 1))
            }
            "randread" => ("read", find_tput(r, "uring", "read", f.bytes, f.depth)),
            "randwrite" => ("write", find_tput(r, "uring", "write", f.bytes, f.depth)),
            "read" => (
                "seqread",
                find_tput(r, "uring", "seqread", f.bytes, f.depth),
            ),
            _ => (
                "seqwrite",
                find_tput(r, "uring", "seqwrite", f.bytes, f.depth),
            ),
        };
        let Some(k) = kura else { continue };
        if f.bytes >= 1 << 20 {
            out.push(ratio(
                format!("1M {pattern} QD{} MiB/s, uring/fio", f.depth),
                k.mib_per_s,
                f.mib_per_s,
                None,
            ));
        } else {
            let target = (pattern == "read" && f.depth == 32 && f.bytes == 4096)
                .then_some(("≥ 1.0", k.iops >= f.iops));
            out.push(ratio(
                format!("4K rand{pattern} QD{} IOPS, uring/fio", f.depth),
                k.iops,
                f.iops,
                target,
            ));
        }
    }
    let lat = |b: &str| {
        r.latency
            .iter()
            .find(|l| l.backend == b && l.op == "read" && l.bytes == 4096)
    };
    if let (Some(u), Some(d)) = (lat("uring"), lat("redirect")) {
        let lower = 1.0 - u.mean_us / d.mean_us;
        out.push(Ratio {
            what: "QD1 4K read latency, uring lower than redirect by".into(),
            kura: u.mean_us,
            peer: d.mean_us,
            ratio: lower,
            target: Some("≥ 50 %".into()),
            met: Some(lower >= 0.5),
        });
    }
    if let (Some(u), Some(d)) = (lat("uring"), lat("redirect-modeled")) {
        out.push(Ratio {
            what: "QD1 4K read latency, uring lower than redirect (modeled Aurora link) by".into(),
            kura: u.mean_us,
            peer: d.mean_us,
            ratio: 1.0 - u.mean_us / d.mean_us,
            target: None,
            met: None,
        });
    }
    if let Some(n) = r.null_cmds_per_sec {
        out.push(Ratio {
            what: "null device commands/s on one core (millions)".into(),
            kura: n / 1e6,
            peer: 5.0,
            ratio: n / 5e6,
            target: Some("≥ 5 M/s".into()),
            met: Some(n >= 5e6),
        });
    }
    out
}

/// With `--device`: the first device against each of the others, on the figures that separate
/// software paths (QD1 latency is mostly per-command cost; QD32 IOPS is how it scales).
pub(super) fn device_ratios(r: &Report) -> Vec<Ratio> {
    let mut out = Vec::new();
    let Some((first, _)) = r.devices.first() else {
        return out;
    };
    let lat = |b: &str| {
        r.latency
            .iter()
            .find(|l| l.backend == b && l.op == "read" && l.bytes == 4096)
    };
    for (other, _) in r.devices.iter().skip(1) {
        if let (Some(a), Some(b)) = (lat(first), lat(other)) {
            out.push(ratio(
                format!("QD1 4K read latency µs, {first}/{other} (lower is better)"),
                a.mean_us,
                b.mean_us,
                None,
            ));
        }
        for (pattern, bytes, depth) in [("read", 4096, 32), ("write", 4096, 32)] {
            if let (Some(a), Some(b)) = (
                find_tput(r, first, pattern, bytes, depth),
                find_tput(r, other, pattern, bytes, depth),
            ) {
                out.push(ratio(
                    format!("4K rand{pattern} QD{depth} IOPS, {first}/{other}"),
                    a.iops,
                    b.iops,
                    None,
                ));
            }
        }
        if let (Some(a), Some(b)) = (
            find_tput(r, first, "seqread", 1 << 20, 8),
            find_tput(r, other, "seqread", 1 << 20, 8),
        ) {
            out.push(ratio(
                format!("1M seqread QD8 MiB/s, {first}/{other}"),
                a.mib_per_s,
                b.mib_per_s,
                None,
            ));
        }
    }
    out
}
