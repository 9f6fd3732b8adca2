//! The ratios of `kura bench io`, each over the rounds of its interleaved points
//! ([`crate::stats`]): kura's `uring` against the better fio configuration, uring against
//! redirect at QD1, the null device against its target in the default run; and the first
//! `--device` against each of the others.

use super::image::{metric, registered_is_better};
use super::report::{HeadToHead, Ratio, Report, Sample, ThroughputPoint};
use crate::stats::{compare, lower_by, quotient, Goal, Spread};

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

/// A ratio line from per-round samples of kura and one peer.
#[allow(clippy::too_many_arguments)]
fn line(
    what: String,
    kura: &[f64],
    peer: &[f64],
    peer_name: &str,
    f: fn(f64, f64) -> f64,
    percent: bool,
    goal: Option<(Goal, String)>,
    modeled: bool,
) -> Ratio {
    let c = compare(kura, peer, f, goal.as_ref().map(|g| g.0));
    Ratio {
        what,
        kura: c.kura,
        peer: Some(c.peer),
        peer_name: Some(peer_name.to_string()),
        ratio: c.ratio,
        percent,
        target: goal.map(|g| g.1),
        verdict: c.verdict,
        modeled,
    }
}

/// The 4 KiB QD32 random-read target: kura at least as fast as fio.
fn target_of(h: &HeadToHead) -> Option<(Goal, String)> {
    (h.rw == "randread" && h.depth == 32 && h.bytes == 4096)
        .then(|| (Goal::AtLeast(1.0), "≥ 1.0".to_string()))
}

/// kura against the better fio configuration for one head-to-head point.
pub(super) fn fio_ratio(h: &HeadToHead) -> Vec<Ratio> {
    let registered = registered_is_better(h);
    let (peer, peer_name) = if registered {
        (&h.fio_registered, "fio --registerfiles --fixedbufs")
    } else {
        (&h.fio, "fio (plain; better than registered here)")
    };
    let vals = |v: &[Sample], g: fn(&Sample) -> f64| v.iter().map(g).collect::<Vec<f64>>();
    // kura over the peer on one metric, round by round.
    let versus = |what: String, get: fn(&Sample) -> f64, goal: Option<(Goal, String)>| {
        line(
            what,
            &vals(&h.kura, get),
            &vals(peer, get),
            peer_name,
            quotient,
            false,
            goal,
            false,
        )
    };
    let (get, _, _) = metric(h);
    let mut out = Vec::new();
    let k = h.bytes >> 10;
    if h.depth == 1 {
        let op = if h.rw.contains("write") {
            "write"
        } else {
            "read"
        };
        out.push(versus(
            format!("QD1 {k}K {op} latency µs, uring/fio (lower is better)"),
            get,
            None,
        ));
        if h.bytes != 4096 {
            return out;
        }
    } else if h.bytes >= 1 << 20 {
        let pattern = if h.rw == "read" {
            "seqread"
        } else {
            "seqwrite"
        };
        out.push(versus(
            format!("1M {pattern} QD{} MiB/s, uring/fio", h.depth),
            get,
            None,
        ));
        return out;
    }
    out.push(versus(
        format!("4K {} QD{} IOPS, uring/fio", h.rw, h.depth),
        |s| s.iops,
        target_of(h),
    ));
    out
}

/// Every ratio of the default run, from what was measured.
pub(super) fn ratios(r: &Report) -> Vec<Ratio> {
    let mut out: Vec<Ratio> = r.head_to_head.iter().flat_map(fio_ratio).collect();
    let rounds = |name: &str| {
        r.latency_rounds
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    };
    if let (Some(u), Some(d)) = (rounds("uring"), rounds("redirect")) {
        out.push(line(
            "QD1 4K read latency, uring lower than redirect by".into(),
            u,
            d,
            "redirect",
            lower_by,
            true,
            Some((Goal::AtLeast(0.5), "≥ 50 %".into())),
            false,
        ));
    }
    if let (Some(u), Some(d)) = (rounds("uring"), rounds("redirect-modeled")) {
        out.push(line(
            "QD1 4K read latency, uring lower than redirect (modeled Aurora link) by".into(),
            u,
            d,
            "redirect (modeled)",
            lower_by,
            true,
            None,
            true,
        ));
    }
    if !r.null_rounds.is_empty() {
        let millions: Vec<f64> = r.null_rounds.iter().map(|n| n / 1e6).collect();
        let s = Spread::of(&millions);
        let goal = Goal::AtLeast(5.0);
        out.push(Ratio {
            what: "null device commands/s on one core (millions)".into(),
            kura: s,
            peer: None,
            peer_name: None,
            ratio: s,
            percent: false,
            target: Some("≥ 5 M/s".into()),
            verdict: Some(goal.judge(&s)),
            modeled: false,
        });
    }
    out
}

/// With `--device`: the first device against each of the others, on the figures that separate
/// software paths (QD1 latency is mostly per-command cost; QD32 IOPS is how it scales). One
/// point each (the devices are measured one after another, not in rounds); a side measured over
/// a modeled link keeps that label.
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
            out.push(line(
                format!("QD1 4K read latency µs, {first}/{other} (lower is better)"),
                &[a.mean_us],
                &[b.mean_us],
                other,
                quotient,
                false,
                None,
                a.modeled || b.modeled,
            ));
        }
        for (pattern, bytes, depth) in [("read", 4096, 32), ("write", 4096, 32)] {
            if let (Some(a), Some(b)) = (
                find_tput(r, first, pattern, bytes, depth),
                find_tput(r, other, pattern, bytes, depth),
            ) {
                out.push(line(
                    format!("4K rand{pattern} QD{depth} IOPS, {first}/{other}"),
                    &[a.iops],
                    &[b.iops],
                    other,
                    quotient,
                    false,
                    None,
                    a.modeled || b.modeled,
                ));
            }
        }
        if let (Some(a), Some(b)) = (
            find_tput(r, first, "seqread", 1 << 20, 8),
            find_tput(r, other, "seqread", 1 << 20, 8),
        ) {
            out.push(line(
                format!("1M seqread QD8 MiB/s, {first}/{other}"),
                &[a.mib_per_s],
                &[b.mib_per_s],
                other,
                quotient,
                false,
                None,
                a.modeled || b.modeled,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Verdict;

    fn s(v: f64) -> Sample {
        Sample {
            iops: v,
            mean_us: 1e6 / v,
            mib_per_s: v / 256.0,
        }
    }

    fn h2h(
        rw: &str,
        bytes: usize,
        depth: usize,
        kura: &[f64],
        fio: &[f64],
        reg: &[f64],
    ) -> HeadToHead {
        HeadToHead {
            rw: rw.into(),
            bytes,
            depth,
            kura: kura.iter().map(|&v| s(v)).collect(),
            fio: fio.iter().map(|&v| s(v)).collect(),
            fio_registered: reg.iter().map(|&v| s(v)).collect(),
            fio_command: "fio".into(),
            fio_registered_command: "fio --registerfiles --fixedbufs".into(),
        }
    }

    #[test]
    fn kura_is_compared_with_the_better_fio_and_judged_on_the_whole_range() {
        // Registered fio is better (higher IOPS): kura 100/110/120k against 90/100/95k.
        let h = h2h(
            "randread",
            4096,
            32,
            &[100e3, 110e3, 120e3],
            &[50e3, 60e3, 55e3],
            &[90e3, 100e3, 95e3],
        );
        let r = fio_ratio(&h);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0].peer_name.as_deref(),
            Some("fio --registerfiles --fixedbufs")
        );
        let ratio = r[0].ratio;
        assert!((ratio.min - 1.1).abs() < 1e-9, "{ratio:?}");
        assert!((ratio.max - 120.0 / 95.0).abs() < 1e-9);
        assert_eq!(r[0].verdict, Some(Verdict::Met));
        assert_eq!(r[0].target.as_deref(), Some("≥ 1.0"));
        // The same kura against a registered fio that straddles it: within noise.
        let close = h2h(
            "randread",
            4096,
            32,
            &[100e3, 100e3],
            &[1.0, 1.0],
            &[90e3, 110e3],
        );
        assert_eq!(fio_ratio(&close)[0].verdict, Some(Verdict::WithinNoise));
        let behind = h2h(
            "randread",
            4096,
            32,
            &[80e3, 85e3],
            &[90e3, 95e3],
            &[1.0, 1.0],
        );
        let b = &fio_ratio(&behind)[0];
        assert_eq!(b.verdict, Some(Verdict::NotMet));
        assert!(b.peer_name.as_deref().unwrap().starts_with("fio (plain"));
    }

    #[test]
    fn qd1_points_compare_latency_where_lower_is_better() {
        // Latency 1e6/iops: kura 20 µs, plain fio 25 µs, registered fio 22 µs (better).
        let h = h2h("randread", 4096, 1, &[50e3], &[40e3], &[1e6 / 22.0]);
        let r = fio_ratio(&h);
        assert_eq!(r.len(), 2, "latency and IOPS at 4K QD1");
        assert!(r[0].what.contains("lower is better"));
        assert!((r[0].ratio.median - 20.0 / 22.0).abs() < 1e-9);
        assert!(r[0].verdict.is_none());
        let big = h2h("randread", 1 << 20, 1, &[5e3], &[4e3], &[4e3]);
        let r = fio_ratio(&big);
        assert_eq!(r.len(), 1, "other sizes: latency only");
        assert!(
            r[0].what.starts_with("QD1 1024K read latency"),
            "{}",
            r[0].what
        );
        let w = fio_ratio(&h2h("randwrite", 4096, 1, &[5e3], &[4e3], &[4e3]));
        assert!(
            w[0].what.starts_with("QD1 4K write latency"),
            "{}",
            w[0].what
        );
        let seq = h2h("read", 1 << 20, 8, &[512.0], &[256.0], &[256.0]);
        let r = fio_ratio(&seq);
        assert!(r[0].what.starts_with("1M seqread QD8 MiB/s"));
        assert_eq!(r[0].ratio.median, 2.0);
    }

    fn empty_report() -> Report {
        Report {
            file_system: "ext4".into(),
            rounds: 3,
            image: "x".into(),
            seconds_per_point: 1.0,
            ..Report::default()
        }
    }

    #[test]
    fn the_null_device_is_judged_alone_and_redirect_lower_by_in_percent() {
        let mut r = empty_report();
        r.null_rounds = vec![4.0e6, 6.0e6, 7.0e6];
        r.latency_rounds = vec![
            ("uring".into(), vec![10.0, 12.0, 11.0]),
            ("redirect".into(), vec![30.0, 30.0, 20.0]),
            ("redirect-modeled".into(), vec![60.0, 60.0, 60.0]),
        ];
        let out = ratios(&r);
        let null = out.iter().find(|x| x.what.starts_with("null")).unwrap();
        assert!(
            null.peer.is_none() && null.peer_name.is_none(),
            "no constant peer"
        );
        assert_eq!(
            null.verdict,
            Some(Verdict::WithinNoise),
            "4 to 7 M/s straddles 5"
        );
        let red = out
            .iter()
            .find(|x| x.what.ends_with("redirect by"))
            .unwrap();
        // Per round: 1-10/30, 1-12/30, 1-11/20 = 0.667, 0.6, 0.45.
        assert!((red.ratio.min - 0.45).abs() < 1e-9);
        assert_eq!(red.verdict, Some(Verdict::WithinNoise));
        assert!(red.percent);
        let modeled = out.iter().find(|x| x.what.contains("Aurora")).unwrap();
        assert!(modeled.modeled && modeled.verdict.is_none());
        assert!(super::super::report::ratio_line(modeled).contains("modeled"));
    }

    #[test]
    fn device_ratios_keep_the_modeled_label() {
        let mut r = empty_report();
        r.devices = vec![
            ("uring".into(), String::new()),
            ("redirect".into(), String::new()),
        ];
        for (backend, us, modeled) in [("uring", 10.0, false), ("redirect", 50.0, true)] {
            r.latency.push(super::super::report::LatencyPoint {
                backend: backend.into(),
                op: "read".into(),
                bytes: 4096,
                ops: 1,
                mean_us: us,
                p50_us: us,
                p99_us: us,
                modeled,
            });
        }
        let out = device_ratios(&r);
        assert_eq!(out.len(), 1);
        assert!(out[0].modeled);
        assert_eq!(out[0].ratio.median, 0.2);
        let printed = super::super::report::ratio_line(&out[0]);
        assert!(printed.contains("(modeled)"), "{printed}");
    }
}
