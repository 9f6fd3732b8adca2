//! Helpers shared by the NBD tests: servers over RAM disks, and a raw protocol client that can
//! send anything (well-formed or not) and read what comes back.

#![allow(dead_code)]

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::BlockDevice;
use kura_nbd::protocol::{
    self, client_flags, info_type, Command, InfoRequest, Opt, OptionReplyHeader, RequestHeader,
    SimpleReply, GREETING_LEN, OPTION_REPLY_HEADER_LEN, SIMPLE_REPLY_LEN,
};
use kura_nbd::{bind_loopback, serve, Export, ServeOptions, Server};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// A RAM disk of `bytes` and a handle on its storage.
pub fn mem_disk(bytes: u64) -> (Box<dyn BlockDevice>, MemStorage) {
    let dev = MemDevice::new(bytes, QueueOptions::default());
    let storage = dev.storage();
    (Box::new(dev), storage)
}

/// Serves `exports` on a free loopback port.
pub fn start(exports: Vec<Export>) -> Server {
    start_with(exports, ServeOptions::default())
}

pub fn start_with(exports: Vec<Export>, opts: ServeOptions) -> Server {
    let listener = bind_loopback(0).expect("bind loopback");
    serve(listener, exports, opts).expect("serve")
}

/// A client speaking raw protocol bytes.
pub struct Raw {
    pub s: TcpStream,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("raw protocol client");
        s.set_nodelay(true).expect("raw protocol client");
        Raw { s }
    }

    /// Reads the greeting and answers with `flags`.
    pub fn greet_with(&mut self, flags: u32) -> u16 {
        let mut g = [0u8; GREETING_LEN];
        self.s.read_exact(&mut g).expect("raw protocol client");
        let hflags = protocol::decode_greeting(&g).expect("raw protocol client");
        self.s
            .write_all(&flags.to_be_bytes())
            .expect("raw protocol client");
        hflags
    }

    pub fn greet(&mut self) -> u16 {
        self.greet_with(client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES)
    }

    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.s.write_all(bytes)
    }

    pub fn option(&mut self, opt: Opt, data: &[u8]) {
        self.send(&protocol::encode_option(opt, data).expect("raw protocol client"))
            .expect("raw protocol client");
    }

    pub fn option_reply(&mut self) -> io::Result<(OptionReplyHeader, Vec<u8>)> {
        let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
        self.s.read_exact(&mut h)?;
        let h = protocol::decode_option_reply_header(&h)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut data = vec![0u8; h.length as usize];
        self.s.read_exact(&mut data)?;
        Ok((h, data))
    }

    /// `NBD_OPT_GO` on `name`; returns the export size and flags.
    pub fn go(&mut self, name: &str) -> (u64, u16) {
        let req = InfoRequest {
            name: name.into(),
            requests: vec![info_type::BLOCK_SIZE],
        };
        self.option(Opt::Go, &req.encode());
        let mut export = None;
        loop {
            let (h, data) = self.option_reply().expect("raw protocol client");
            match h.reply {
                protocol::Rep::Info => {
                    if let protocol::Info::Export { size, flags } =
                        protocol::Info::decode(&data).expect("raw protocol client")
                    {
                        export = Some((size, flags));
                    }
                }
                protocol::Rep::Ack => return export.expect("NBD_INFO_EXPORT before ACK"),
                other => panic!(
                    "NBD_OPT_GO failed: {other} {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
    }

    /// Greets and enters transmission on `name`.
    pub fn open(addr: SocketAddr, name: &str) -> (Raw, u64) {
        let mut r = Raw::connect(addr);
        r.greet();
        let (size, _) = r.go(name);
        (r, size)
    }

    pub fn request(&mut self, command: Command, flags: u16, cookie: u64, offset: u64, length: u32) {
        let h = RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        };
        self.send(&h.encode()).expect("raw protocol client");
    }

    pub fn reply(&mut self) -> io::Result<SimpleReply> {
        let mut h = [0u8; SIMPLE_REPLY_LEN];
        self.s.read_exact(&mut h)?;
        SimpleReply::decode(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    pub fn data(&mut self, len: usize) -> Vec<u8> {
        let mut d = vec![0u8; len];
        self.s.read_exact(&mut d).expect("raw protocol client");
        d
    }

    /// A read that must succeed.
    pub fn read_at(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.request(Command::Read, 0, 7, offset, len);
        let r = self.reply().expect("raw protocol client");
        assert_eq!((r.error, r.cookie), (0, 7), "read at {offset}+{len}");
        self.data(len as usize)
    }

    /// A write that must succeed.
    pub fn write_at(&mut self, offset: u64, data: &[u8], flags: u16) {
        self.request(Command::Write, flags, 8, offset, data.len() as u32);
        self.send(data).expect("raw protocol client");
        let r = self.reply().expect("raw protocol client");
        assert_eq!(
            (r.error, r.cookie),
            (0, 8),
            "write at {offset}+{}",
            data.len()
        );
    }

    /// A command without payload; returns its error value.
    pub fn simple(&mut self, command: Command, flags: u16, offset: u64, length: u32) -> u32 {
        self.request(command, flags, 9, offset, length);
        let r = self.reply().expect("raw protocol client");
        assert_eq!(r.cookie, 9);
        r.error
    }

    /// True once the server has closed the connection (reads EOF or reset).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

/// The path of a tool on PATH, if installed.
pub fn tool(name: &str) -> Option<PathBuf> {
    kura_testkit::which(name)
}

/// Runs a tool to completion, killing it (and failing) after `limit`.
pub fn run_bounded(cmd: &mut std::process::Command, limit: Duration) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{cmd:?} ran past {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().expect("output")
}

/// Runs a tool (bounded at a minute) and fails the test, with its output, unless it succeeds.
pub fn run_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether every NBD client tool in `tools` is installed; the first missing one skips `test`
/// (naming the Debian package to install) and gives false.
pub fn have_tools(test: &str, tools: &[&str]) -> bool {
    for t in tools {
        let package = match *t {
            "qemu-img" => "qemu-utils",
            "nbdkit" => "nbdkit",
            _ => "libnbd-bin",
        };
        if let Some(m) = kura_testkit::missing_tool(t, &format!("apt-get install {package}")) {
            m.skip(test);
            return false;
        }
    }
    true
}

/// A deterministic pseudo-random fill.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
