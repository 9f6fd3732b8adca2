//! `kura serve --qos` and `kura serve ctl`: two tenants on one server, one limited, read at
//! once; the limited one stays within ±5 % of its limit while the other keeps going, and a limit
//! changed through the control socket takes effect while both keep serving.

mod common;

use common::{fails, ok, Serving};
use kura_bench::qos::closed_loop;
use std::time::Duration;

/// Completions before this are the bucket's burst and the ramp-up.
const SETTLE: Duration = Duration::from_millis(400);
const RUN: Duration = Duration::from_millis(2400);

/// Reads from both exports at once; the limited one's and the free one's IOPS after SETTLE.
fn contend(addr: &str) -> (f64, f64) {
    let connect =
        |name: &str| kura_nbd::open::open_address(&format!("{addr}/{name}")).expect("connect");
    let (mut limited, mut free) = (connect("limited"), connect("free"));
    let (lim, other) = std::thread::scope(|s| {
        let t = s.spawn(|| closed_loop(&mut limited, 8, 1, RUN, 3).expect("limited load"));
        let other = closed_loop(&mut free, 8, 1, RUN, 5).expect("free load");
        (t.join().expect("limited thread"), other)
    });
    (
        lim.rate_between(SETTLE, RUN),
        other.rate_between(SETTLE, RUN),
    )
}

fn within_5_percent(got: f64, limit: f64) {
    assert!(
        (got - limit).abs() <= 0.05 * limit,
        "the limited tenant got {got:.1} IOPS against a limit of {limit}"
    );
}

#[test]
fn a_limited_tenant_keeps_its_limit_beside_a_free_one_and_ctl_changes_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = |n: &str| format!("file:{}?size=32M", dir.path().join(n).display());
    let ctl = dir.path().join("ctl.sock");
    let ctl_s = ctl.to_str().unwrap();
    let limited = format!("limited={}", img("a.img"));
    let free = format!("free={}", img("b.img"));
    let server = Serving::start(&[
        &limited,
        &free,
        "--listen",
        "127.0.0.1:0",
        "--qos",
        "limited=read_iops=300,burst=50ms",
        "--ctl",
        ctl_s,
    ]);
    let mode = std::fs::metadata(&ctl).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let addr = server.addr();
    let (lim, other) = contend(&addr);
    within_5_percent(lim, 300.0);
    assert!(
        other > 4.0 * 300.0,
        "the free tenant got only {other:.0} IOPS"
    );

    let set = ok(&[
        "serve",
        "ctl",
        "--socket",
        ctl_s,
        "set",
        "limited",
        "read_iops=150",
    ]);
    assert!(set.contains("limited read_iops=150 "), "{set}");
    let (lim, other) = contend(&addr);
    within_5_percent(lim, 150.0);
    assert!(
        other > 4.0 * 150.0,
        "the free tenant got only {other:.0} IOPS"
    );

    let shown = ok(&["serve", "ctl", "--socket", ctl_s, "show"]);
    assert!(shown.contains("limited read_iops=150 "), "{shown}");
    assert!(shown.contains("free read_iops=off "), "{shown}");
    fails(
        &["serve", "ctl", "--socket", ctl_s, "set", "nope", "iops=1"],
        "no export named `nope`",
    );
    fails(
        &["serve", "ctl", "--socket", ctl_s, "set", "free", "iops=0"],
        "positive",
    );
    assert!(server.stop().success());
    assert!(!ctl.exists(), "the control socket is removed at exit");
}

#[test]
fn bad_qos_arguments_are_refused() {
    fails(
        &["serve", "a=mem:1M", "--qos", "b=iops=5"],
        "no export named `b`",
    );
    fails(
        &["serve", "a=mem:1M", "--qos", "a=iops=fast"],
        "not a number",
    );
    fails(
        &["serve", "ctl", "--socket", "/nonexistent/ctl.sock", "show"],
        "is `kura serve --ctl` running?",
    );
}
