//! `kura serve` prints each export's counters when it stops, and every `--stats-interval`
//! seconds while serving: one stderr line per layer of the device stack, top-down, indented two
//! spaces per level (`BlockDevice::stats`).
//!
//! Timing only bounds "no hang": every wait is many times what the work needs.

use kura_engine::{BlockDevice, BlockingIo};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

const PREFIX: &str = "kura serve: export disk: ";

/// The counter `name` in a line `kind a=1 b=2`.
fn counter(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no counter {name} in {line:?}"))
}

/// A running `kura serve` with export `disk`, its address and its stderr lines as they come.
struct Serving {
    child: Child,
    addr: String,
    lines: Receiver<String>,
}

impl Serving {
    fn start(args: &[&str]) -> Serving {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kura"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .arg("disk=coalesce(cache(mem:4M)?size=1M)")
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
        // Read to the end while the server runs, so it never blocks on the pipe.
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Serving { child, addr, lines }
    }

    /// Writes 8 blocks and reads them twice through one connection.
    fn write_and_read_twice(&self) {
        let mut client = kura_nbd::connect(self.addr.as_str(), "disk").expect("connect");
        let bs = client.geometry().block_size as usize;
        let data: Vec<u8> = (0..8 * bs).map(|i| (i % 251) as u8).collect();
        client.write_blocks(0, &data).expect("write");
        let mut back = vec![0; data.len()];
        client.read_blocks(0, &mut back).expect("first read");
        client.read_blocks(0, &mut back).expect("second read");
        assert!(back == data, "the data read back");
    }

    /// The next stderr line, waiting at most a minute.
    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .expect("kura serve went on printing")
    }

    /// SIGTERM, a bounded wait for exit 0, and every stderr line after the ones already read.
    fn stop(mut self) -> Vec<String> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM");
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for kura serve") {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "kura serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let lines: Vec<String> = self.lines.iter().collect();
        assert!(
            status.success(),
            "kura serve after SIGTERM: {status:?}\n{}",
            lines.join("\n")
        );
        lines
    }
}

/// The three layers' lines from `lines` (`coalesce`, `  cache`, `    mem`), checked for shape.
fn layers(lines: &[String]) -> Vec<&str> {
    let layers: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix(PREFIX))
        .collect();
    assert_eq!(layers.len(), 3, "one line per layer:\n{}", lines.join("\n"));
    assert!(layers[0].starts_with("coalesce "), "{}", layers[0]);
    assert!(layers[1].starts_with("  cache "), "{}", layers[1]);
    assert_eq!(layers[2], "    mem");
    layers
}

#[test]
fn sigterm_prints_every_layers_counters_top_down() {
    let serving = Serving::start(&[]);
    serving.write_and_read_twice();
    let lines = serving.stop();
    let layers = layers(&lines);
    println!("{}", layers.join("\n"));
    // A write, two reads and the flush on stop at least (the client may send more flushes).
    assert!(counter(layers[0], "requests") >= 4, "{}", layers[0]);
    assert!(counter(layers[0], "child_commands") >= 1, "{}", layers[0]);
    // 1 MiB of cache holds the 8 blocks, so the second read hits on every one.
    assert!(counter(layers[1], "hits") >= 8, "{}", layers[1]);
    assert_eq!(counter(layers[1], "evictions"), 0, "{}", layers[1]);
    let stopping = lines
        .iter()
        .position(|l| l.starts_with("kura: stopping"))
        .expect("the stopping message");
    let stopped = lines
        .iter()
        .position(|l| l.starts_with("kura: stopped"))
        .expect("the stop message");
    let first_layer = lines.iter().position(|l| l.starts_with(PREFIX));
    assert!(
        first_layer.is_some_and(|i| stopping < i && i < stopped),
        "the counters come between stopping and stopped:\n{}",
        lines.join("\n")
    );
}

#[test]
fn stats_interval_prints_the_counters_while_serving() {
    let serving = Serving::start(&["--stats-interval", "1"]);
    serving.write_and_read_twice();
    // The I/O is done before the next report, so a report with the second read's hits comes
    // (bounded: each line is waited for at most a minute).
    let report = loop {
        let line = serving.next_line();
        let Some(first) = line.strip_prefix(PREFIX) else {
            continue;
        };
        let mut report = vec![format!("{PREFIX}{first}")];
        report.push(serving.next_line());
        report.push(serving.next_line());
        if counter(layers(&report)[1], "hits") >= 8 {
            break report;
        }
    };
    let layers = layers(&report);
    assert_eq!(counter(layers[0], "requests"), 3, "a write and two reads");
    let after = serving.stop();
    assert!(
        after.iter().any(|l| l.starts_with("kura: stopped")),
        "{}",
        after.join("\n")
    );
}
