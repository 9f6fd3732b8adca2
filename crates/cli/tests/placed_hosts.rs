//! `placed(...)` over several hosts: three network namespaces, each joined to this one by a
//! veth pair and running `kura serve` of its own image, are the legs (`remote:` NBD exports) of
//! one placed drive with two replicas. One host's server is killed in the middle of a stream of
//! writes; every write the drive acknowledged must read back, from the surviving replicas. Then
//! the host is restarted (its image holds stale copies; a reopen keeps it out of service, since
//! the flush after the kill marked it stale on the others), a fourth host is added, and
//! `kura drive rebalance` (no `--resync 1` needed: leg 1 is marked) moves chunks onto the new
//! host and refills the restarted one from the others; every acknowledged write reads back through the four-host spec, and a
//! kill of the restarted host afterwards still loses nothing.
//! Everything (servers, namespaces, links) is torn down when the test ends, pass or fail.
//!
//! Needs root and iproute2's `ip netns`; skips otherwise. Not covered: the client in its own
//! namespace (it runs in the test's).

mod common;

use kura_engine::{BlockDevice, BlockingIo, Registry};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOSTS: usize = 3;
const PORT: u16 = 10809;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces, links and servers of one test; dropping it removes them all.
struct Hosts {
    namespaces: Vec<String>,
    links: Vec<String>,
    servers: Vec<Option<Child>>,
    addrs: Vec<SocketAddr>,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for s in self.servers.iter_mut().flatten() {
            let _ = s.kill();
            let _ = s.wait();
        }
        for l in &self.links {
            let _ = Command::new("ip").args(["link", "del", l]).output();
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

impl Hosts {
    /// `HOSTS` namespaces `kura-ph<pid>-<i>`, host `i` at 10.<net>.<i>.2 (this side .1).
    fn new(dir: &Path) -> Hosts {
        let mut h = Hosts {
            namespaces: Vec::new(),
            links: Vec::new(),
            servers: Vec::new(),
            addrs: Vec::new(),
        };
        for _ in 0..HOSTS {
            h.add(dir);
        }
        h
    }

    /// One more host: namespace, veth pair, a 64 MiB image and its server.
    fn add(&mut self, dir: &Path) {
        let pid = std::process::id();
        let net = 100 + pid % 100;
        let h = self;
        {
            let i = h.namespaces.len();
            let ns = format!("kura-ph{pid}-{i}");
            let (near, far) = (format!("vk{pid}h{i}"), format!("vp{pid}h{i}"));
            ip(&["netns", "add", &ns]);
            h.namespaces.push(ns.clone());
            ip(&["link", "add", &near, "type", "veth", "peer", "name", &far]);
            h.links.push(near.clone());
            ip(&["link", "set", &far, "netns", &ns]);
            ip(&["addr", "add", &format!("10.{net}.{i}.1/24"), "dev", &near]);
            ip(&["link", "set", &near, "up"]);
            let host_addr = format!("10.{net}.{i}.2");
            ip(&[
                "netns",
                "exec",
                &ns,
                "ip",
                "addr",
                "add",
                &format!("{host_addr}/24"),
                "dev",
                &far,
            ]);
            ip(&["netns", "exec", &ns, "ip", "link", "set", &far, "up"]);
            ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
            let img = dir.join(format!("host{i}.img"));
            std::fs::File::create(&img)
                .and_then(|f| f.set_len(64 << 20))
                .expect("create image");
            h.addrs
                .push(format!("{host_addr}:{PORT}").parse().expect("address"));
            h.servers.push(None);
            h.start(i, &img);
        }
    }

    /// Starts host `i`'s server in its namespace and waits until it accepts connections.
    fn start(&mut self, i: usize, img: &Path) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.namespaces[i]])
            .arg(env!("CARGO_BIN_EXE_kura"))
            .args([
                "serve",
                "--insecure",
                "--listen",
                &self.addrs[i].to_string(),
            ])
            .arg(format!("disk=file:{}", img.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kura serve");
        self.servers[i] = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&self.addrs[i], Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "host {i}'s server never listened on {}",
                self.addrs[i]
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills host `i`'s server (`ip netns exec` runs it in place, so this is the server).
    fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.servers[i].take() {
            s.kill().expect("kill the server");
            s.wait().expect("reap the server");
        }
    }
}

fn can_run() -> bool {
    // The effective uid is the second field of /proc/self/status's Uid line.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    root && kura_testkit::which("ip").is_some()
}

fn pattern(block: u64, round: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (block.wrapping_mul(31) ^ round.wrapping_mul(7) ^ i) as u8)
        .collect()
}

#[test]
fn a_host_killed_mid_write_loses_no_acknowledged_write() {
    let test = "a_host_killed_mid_write_loses_no_acknowledged_write";
    if !can_run() {
        kura_testkit::skip(test, "netns", "needs root and iproute2 (ip netns)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut hosts = Hosts::new(dir.path());
    let mut registry = Registry::engine();
    kura_vdrive::register(&mut registry);
    kura_nbd::register(&mut registry);
    let legs: Vec<String> = hosts
        .addrs
        .iter()
        .map(|a| format!("remote:{a}/disk"))
        .collect();
    let spec = format!("placed({})?replicas=2&chunk=1M", legs.join(","));
    let mut dev: Box<dyn BlockDevice> = registry.open(&spec).expect("open the placed drive");
    let blocks = dev.geometry().num_blocks;
    assert!(blocks >= 8192, "{blocks} blocks");
    // Round 0 fills every 29th block; in round 1 host 1 dies after a third of the writes.
    let written: Vec<u64> = (0..blocks).step_by(29).collect();
    let mut last_round = vec![None::<u64>; written.len()];
    for round in 0..2u64 {
        for (k, &b) in written.iter().enumerate() {
            if round == 1 && k == written.len() / 3 {
                hosts.kill(1);
            }
            match dev.write_blocks(b, &pattern(b, round)) {
                Ok(()) => last_round[k] = Some(round),
                Err(e) => panic!("write of block {b} in round {round} failed: {e}"),
            }
        }
    }
    let text = dev.describe();
    assert!(text.contains("leg 1 out of service"), "{text}");
    // The flush acknowledges round 1 only after hosts 0 and 2 record leg 1 as stale.
    dev.flush_all().expect("flush with host 1 down");
    for (k, &b) in written.iter().enumerate() {
        let mut out = vec![0u8; 4096];
        dev.read_blocks(b, &mut out)
            .unwrap_or_else(|e| panic!("read of block {b}: {e}"));
        let round = last_round[k].expect("every write was acknowledged");
        assert!(
            out == pattern(b, round),
            "block {b} lost its round-{round} data"
        );
    }
    drop(dev);
    // Host 1 comes back with its stale image. Reopened without a resync, the drive keeps leg 1
    // out of service (the other legs mark it stale) and serves round 1 everywhere.
    hosts.start(1, &dir.path().join("host1.img"));
    let mut dev: Box<dyn BlockDevice> = registry.open(&spec).expect("reopen, host 1 back");
    let text = dev.describe();
    assert!(
        text.contains("leg 1 out of service") && text.contains("marked stale"),
        "{text}"
    );
    for (k, &b) in written.iter().enumerate() {
        let mut out = vec![0u8; 4096];
        dev.read_blocks(b, &mut out)
            .unwrap_or_else(|e| panic!("read of block {b} after the reopen: {e}"));
        let round = last_round[k].expect("every write was acknowledged");
        assert!(
            out == pattern(b, round),
            "block {b}: stale data after the reopen, not round {round}"
        );
    }
    drop(dev);
    // Host 3 joins; the rebalance (no --resync needed: leg 1 is marked) refills host 1 from the
    // others and moves host 3's share onto it.
    hosts.add(dir.path());
    let four: Vec<String> = hosts
        .addrs
        .iter()
        .map(|a| format!("remote:{a}/disk"))
        .collect();
    let spec4 = format!("placed({})?replicas=2&chunk=1M", four.join(","));
    let out = common::ok(&["drive", "rebalance", &spec4, "--quiet"]);
    assert!(out.contains("1 new legs formatted"), "{out}");
    assert!(out.contains("stale copies forgotten"), "{out}");
    assert!(out.contains("[1] marked stale by the other legs"), "{out}");
    eprintln!("{out}");
    let check = |dev: &mut Box<dyn BlockDevice>, when: &str| {
        for (k, &b) in written.iter().enumerate() {
            let mut out = vec![0u8; 4096];
            dev.read_blocks(b, &mut out)
                .unwrap_or_else(|e| panic!("{when}: read of block {b}: {e}"));
            let round = last_round[k].expect("every write was acknowledged");
            assert!(
                out == pattern(b, round),
                "{when}: block {b} lost its round-{round} data"
            );
        }
    };
    let mut dev: Box<dyn BlockDevice> = registry.open(&spec4).expect("open over four hosts");
    assert_eq!(dev.geometry().num_blocks, blocks);
    check(&mut dev, "after the rebalance");
    drop(dev);
    // Host 1's copies are current now: losing host 2 instead still reads everything.
    hosts.kill(2);
    let opened = registry.open(&spec4);
    assert!(
        opened.is_err(),
        "host 2 is down, so the drive does not open"
    );
    hosts.start(2, &dir.path().join("host2.img"));
    let mut dev: Box<dyn BlockDevice> = registry.open(&spec4).expect("reopen");
    hosts.kill(2);
    check(&mut dev, "with host 2 killed after the rebalance");
    drop(dev);
    drop(hosts);
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let pid = std::process::id().to_string();
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains(&format!("kura-ph{pid}-")),
        "namespaces left behind"
    );
}
