//! `kura serve` prints each export's counters when it stops: one stderr line per layer of the
//! device stack, top-down, indented two spaces per level (`BlockDevice::stats`).
//!
//! Timing only bounds "no hang": every wait is many times what the work needs.

use kura_engine::{BlockDevice, BlockingIo};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The counter `name` in a line `kind a=1 b=2`.
fn counter(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no counter {name} in {line:?}"))
}

#[test]
fn sigterm_prints_every_layers_counters_top_down() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "disk=coalesce(cache(mem:4M)?size=1M)",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kura serve");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut banner = String::new();
    stderr.read_line(&mut banner).expect("banner");
    let addr = banner
        .split_whitespace()
        .find_map(|w| w.strip_prefix("nbd://"))
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .to_string();
    // The rest of stderr, read to the end while the server runs so it never blocks on the pipe.
    let rest = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let mut client = kura_nbd::connect(addr.as_str(), "disk").expect("connect");
    let bs = client.geometry().block_size as usize;
    let data: Vec<u8> = (0..8 * bs).map(|i| (i % 251) as u8).collect();
    client.write_blocks(0, &data).expect("write");
    let mut back = vec![0; data.len()];
    client.read_blocks(0, &mut back).expect("first read");
    client.read_blocks(0, &mut back).expect("second read");
    assert!(back == data, "the data read back");
    drop(client);

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for kura serve") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "kura serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = rest.join().expect("stderr reader");
    assert!(
        status.success(),
        "kura serve after SIGTERM: {status:?}\n{text}"
    );

    let layers: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("kura serve: export disk: "))
        .collect();
    let kinds: Vec<&str> = layers
        .iter()
        .map(|l| l.split(' ').find(|w| !w.is_empty()).unwrap_or(""))
        .collect();
    println!("{}", layers.join("\n"));
    assert_eq!(kinds, ["coalesce", "cache", "mem"], "stderr:\n{text}");
    assert!(layers[0].starts_with("coalesce "), "{}", layers[0]);
    assert!(layers[1].starts_with("  cache "), "{}", layers[1]);
    assert!(layers[2].starts_with("    mem"), "{}", layers[2]);
    // A write, two reads and the flush on stop at least (the client may send more flushes).
    assert!(counter(layers[0], "requests") >= 4, "{}", layers[0]);
    assert!(counter(layers[0], "child_commands") >= 1, "{}", layers[0]);
    // 1 MiB of cache holds the 8 blocks, so the second read hits on every one.
    assert!(counter(layers[1], "hits") >= 8, "{}", layers[1]);
    assert_eq!(counter(layers[1], "evictions"), 0, "{}", layers[1]);
    let lines: Vec<&str> = text.lines().collect();
    let stopped = lines
        .iter()
        .position(|l| l.starts_with("kura: stopped"))
        .expect("the stop message");
    let last_layer = lines
        .iter()
        .rposition(|l| l.starts_with("kura serve: export disk: "))
        .expect("a layer line");
    assert!(
        last_layer < stopped,
        "the counters come before the stop message"
    );
}
