//! `kura drive` as a user runs it: format an image, write a pattern through the head, snapshot,
//! overwrite, read the snapshot view, roll back, clone, delete, and clear errors for mistakes.

mod common;

use common::{fails, kura, ok_text, text};

#[test]
fn snapshot_overwrite_view_rollback_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let child = format!("file:{}/d.img?size=8M", dir.path().display());
    let head = format!("snapshot({child})");
    let out = ok_text(&["drive", "format", &child, "--chunk", "32K", "--size", "2M"]);
    assert!(out.contains("2097152 bytes per version"), "{out}");
    fails(
        &["drive", "format", &child],
        "already holds a snapshot drive",
    );

    ok_text(&["dev", "write", &head, "--pattern", "5"]);
    ok_text(&["drive", "snapshot", &head, "before"]);
    fails(&["drive", "snapshot", &head, "before"], "exists already");
    ok_text(&[
        "dev",
        "write",
        &head,
        "--lba",
        "100",
        "--blocks",
        "40",
        "--pattern",
        "6",
    ]);

    let list = ok_text(&["drive", "list", &child]);
    assert!(list.contains("head") && list.contains("before"), "{list}");
    assert!(list.contains("snapshot"), "{list}");

    let view = format!("{head}?at=before");
    let out = ok_text(&["dev", "verify", &view, "--seed", "5"]);
    assert!(out.contains("all hold pattern 5"), "{out}");
    let o = kura(&["dev", "verify", &head, "--seed", "5"]);
    assert!(
        text(&o).contains("40 of 512 block(s) differ") && text(&o).contains("first at LBA 100"),
        "{}",
        text(&o)
    );
    ok_text(&[
        "dev", "verify", &head, "--lba", "100", "--blocks", "40", "--seed", "6",
    ]);
    fails(
        &["dev", "write", &view, "--blocks", "1", "--pattern", "7"],
        "read-only snapshot view",
    );

    ok_text(&["drive", "rollback", &head, "before"]);
    let out = ok_text(&["dev", "verify", &head, "--seed", "5"]);
    assert!(out.contains("all hold pattern 5"), "{out}");

    ok_text(&["drive", "clone", &child, "before", "work"]);
    let branch = format!("{head}?branch=work");
    ok_text(&[
        "dev",
        "write",
        &branch,
        "--lba",
        "0",
        "--blocks",
        "8",
        "--pattern",
        "8",
    ]);
    ok_text(&[
        "dev", "verify", &branch, "--lba", "0", "--blocks", "8", "--seed", "8",
    ]);
    ok_text(&["dev", "verify", &head, "--seed", "5"]);
    let list = ok_text(&["drive", "list", &child]);
    assert!(list.contains("work") && list.contains("clone"), "{list}");

    ok_text(&["drive", "delete", &child, "work"]);
    ok_text(&["drive", "delete", &child, "before"]);
    let list = ok_text(&["drive", "list", &child]);
    assert!(!list.contains("before") && !list.contains("work"), "{list}");
}

#[test]
fn drive_mistakes_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let child = format!("file:{}/e.img?size=4M", dir.path().display());
    ok_text(&["dev", "create", &child]);
    fails(&["drive", "list", &child], "not a snapshot drive");
    ok_text(&["drive", "format", &child]);
    fails(
        &["drive", "rollback", &child, "nope"],
        "no snapshot or clone named `nope`",
    );
    fails(
        &["drive", "delete", &child, "head"],
        "cannot delete the head",
    );
    fails(&["drive", "snapshot", &child, "a/b"], "bad name");
    fails(
        &["drive", "list", &format!("snapshot({child})?at=x")],
        "without options",
    );
    fails(
        &["drive", "format", &child, "--force", "--chunk", "3000"],
        "power of two",
    );
    fails(
        &["dev", "info", &format!("snapshot({child})?at=nope")],
        "no snapshot or clone named `nope`",
    );
    let help = ok_text(&["drive", "--help"]);
    assert!(
        help.contains("rollback") && help.contains("?at=NAME"),
        "{help}"
    );
}
