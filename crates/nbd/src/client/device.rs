//! The NBD client as a kura [`BlockDevice`]: [`NbdClient`] splits commands into NBD requests,
//! queues their headers for the doorbell, tracks what is in flight, and runs the reply reader
//! thread that completes them (see the `client` module docs for the mapping and the timeouts).

use super::handshake::{ClientError, ExportDetails, Transport};
use super::ConnectOptions;
use crate::protocol::{
    self, tx_flags, Command, ErrorCode, RequestHeader, SimpleReply, MAX_PAYLOAD, SIMPLE_REPLY_LEN,
};
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Errno, Geometry, IoBuf, Opcode, Rejected,
    Request,
};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Socket buffer sizes of the request writer and reply reader.
const IO_BUFFER: usize = 256 << 10;

/// The device geometry for an export (see the `client` module docs).
pub(super) fn geometry(d: &ExportDetails, opts: &ConnectOptions) -> Result<Geometry, String> {
    let min = d.block_sizes.map_or(1, |b| b.min).max(1);
    let preferred = d
        .block_sizes
        .map_or(4096, |b| b.preferred)
        .clamp(512, 65536);
    let mut bs = opts.block_size.unwrap_or(preferred);
    if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
        return Err(format!(
            "block size {bs} is not a power of two from 512 to 65536"
        ));
    }
    if opts.block_size.is_none() {
        while bs > 512 && bs > min && !d.size.is_multiple_of(u64::from(bs)) {
            bs /= 2;
        }
    }
    if bs < min {
        return Err(format!(
            "block size {bs} is below the server's minimum block size {min}"
        ));
    }
    let max_payload = d
        .block_sizes
        .map_or(MAX_PAYLOAD, |b| b.max_payload)
        .min(MAX_PAYLOAD);
    if max_payload < bs {
        return Err(format!(
            "the server's maximum payload {max_payload} is below the block size {bs}"
        ));
    }
    if opts.queue_depth == 0 || opts.queue_depth > kura_engine::device::MAX_QUEUE_DEPTH {
        return Err(format!("queue depth {} is out of range", opts.queue_depth));
    }
    Ok(Geometry {
        block_size: bs,
        num_blocks: d.size / u64::from(bs),
        max_transfer: max_payload / bs * bs,
        queue_depth: opts.queue_depth,
        buffer_alignment: 1,
    })
}

/// One NBD request on the wire (by its cookie), part of a (possibly split) device command.
struct WireRequest {
    parent: u64,
    buf_offset: usize,
    len: usize,
    read: bool,
}

/// A device command in flight as one or more NBD requests.
struct Parent {
    tag: u64,
    op: Opcode,
    lba: u64,
    /// The read buffer (writes keep theirs in `NbdClient::write_bufs`).
    buf: Option<IoBuf>,
    remaining: usize,
    status: DeviceResult<()>,
}

/// What the submitting thread and the reply reader share.
#[derive(Default)]
struct Shared {
    /// NBD requests awaiting their reply, by cookie.
    on_wire: HashMap<u64, WireRequest>,
    parents: HashMap<u64, Parent>,
    /// Why the connection is gone, once it is.
    dead: Option<String>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request header waiting for the doorbell, with the slice of a write buffer it carries.
struct Queued {
    header: [u8; protocol::REQUEST_LEN],
    payload: Option<(u64, usize, usize)>,
}

/// A connected NBD export, usable as a kura device (one queue pair, one driving thread).
pub struct NbdClient {
    geo: Geometry,
    details: ExportDetails,
    export: String,
    peer: SocketAddr,
    stream: TcpStream,
    out: BufWriter<Box<dyn Write + Send>>,
    io_timeout: Option<Duration>,
    queued: Vec<Queued>,
    write_bufs: HashMap<u64, IoBuf>,
    shared: Arc<Mutex<Shared>>,
    done: Receiver<(u64, Completion)>,
    reader: Option<JoinHandle<()>>,
    in_flight: usize,
    next_cookie: u64,
    next_parent: u64,
    broken: Option<String>,
}

impl NbdClient {
    pub(super) fn start(
        transport: Transport,
        peer: SocketAddr,
        export: &str,
        details: ExportDetails,
        geo: Geometry,
        io_timeout: Option<Duration>,
    ) -> Result<NbdClient, ClientError> {
        let Transport {
            stream,
            input,
            output,
        } = transport;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (tx, rx) = mpsc::channel();
        let cut = stream.try_clone()?;
        let reader_shared = Arc::clone(&shared);
        let reader = thread::Builder::new()
            .name("nbd-client-rx".into())
            .spawn(move || read_replies(input, cut, &reader_shared, &tx))?;
        Ok(NbdClient {
            geo,
            details,
            export: export.to_owned(),
            peer,
            out: BufWriter::with_capacity(IO_BUFFER, output),
            io_timeout,
            stream,
            queued: Vec::new(),
            write_bufs: HashMap::new(),
            shared,
            done: rx,
            reader: Some(reader),
            in_flight: 0,
            next_cookie: 1,
            next_parent: 1,
            broken: None,
        })
    }

    /// What the handshake said about the export (size in bytes, flags, size constraints).
    pub fn details(&self) -> &ExportDetails {
        &self.details
    }

    /// The export's name as asked for.
    pub fn export_name(&self) -> &str {
        &self.export
    }

    /// Waits for everything in flight, then disconnects cleanly with `NBD_CMD_DISC`.
    pub fn close(mut self) -> DeviceResult<()> {
        let mut sink = Vec::new();
        while self.in_flight > 0 {
            let n = self.in_flight;
            self.poll(&mut sink, n)?;
            sink.clear();
        }
        self.disconnect();
        Ok(())
    }

    fn disconnect(&mut self) {
        if self.broken.is_none() && self.in_flight == 0 {
            let disc = RequestHeader {
                flags: 0,
                command: Command::Disc,
                cookie: 0,
                offset: 0,
                length: 0,
            };
            let _ = self
                .out
                .write_all(&disc.encode())
                .and_then(|()| self.out.flush());
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
        self.broken = Some("disconnected".into());
    }

    fn unsupported(&self, req: Request) -> Result<(), Rejected> {
        let op = req.op;
        Err(Rejected::new(
            req,
            DeviceError::Unsupported {
                op,
                backend: "nbd export",
            },
        ))
    }

    fn offline(&self, req: Request, reason: &str) -> Result<(), Rejected> {
        Err(Rejected::new(
            req,
            DeviceError::Offline {
                reason: format!("nbd://{}/{}: {reason}", self.peer, self.export),
            },
        ))
    }

    fn finish(&mut self, (parent, mut c): (u64, Completion), out: &mut Vec<Completion>) {
        if let Some(buf) = self.write_bufs.remove(&parent) {
            c.buf = Some(buf);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        out.push(c);
    }
}

impl BlockDevice for NbdClient {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        out.push(kura_engine::DriveStats::new("nbd"));
    }

    fn describe(&self) -> String {
        format!("nbd://{}/{}", self.peer, self.export)
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let mut req = req.admit(&self.geo, self.in_flight)?;
        let flags = self.details.flags;
        let (command, max_request) = match req.op {
            Opcode::Read => (Command::Read, u64::from(self.geo.max_transfer)),
            Opcode::Write => (Command::Write, u64::from(self.geo.max_transfer)),
            Opcode::Flush => (Command::Flush, 0),
            Opcode::WriteZeroes | Opcode::Discard => (
                Command::WriteZeroes,
                u64::from(u32::MAX / self.geo.block_size * self.geo.block_size),
            ),
        };
        let needs = match command {
            Command::Flush => tx_flags::SEND_FLUSH,
            Command::WriteZeroes => tx_flags::SEND_WRITE_ZEROES,
            _ => 0,
        };
        if flags & needs != needs {
            return self.unsupported(req);
        }
        if req.op.is_mutation() && req.op != Opcode::Flush && flags & tx_flags::READ_ONLY != 0 {
            let (op, lba) = (req.op, req.lba);
            return Err(Rejected::new(
                req,
                DeviceError::Io {
                    op,
                    lba,
                    errno: Errno(libc::EPERM),
                },
            ));
        }
        if let Some(reason) = self.broken.clone() {
            return self.offline(req, &reason);
        }
        let bs = u64::from(self.geo.block_size);
        let total = req.blocks * bs;
        let parent = self.next_parent;
        let read = req.op == Opcode::Read;
        let write = req.op == Opcode::Write;
        {
            let mut st = lock(&self.shared);
            if let Some(reason) = st.dead.clone() {
                drop(st);
                return self.offline(req, &reason);
            }
            let mut requests = 0;
            let mut off = 0u64;
            loop {
                let len = if command == Command::Flush {
                    0
                } else {
                    max_request.min(total - off)
                };
                let cookie = self.next_cookie;
                self.next_cookie = self.next_cookie.wrapping_add(1);
                st.on_wire.insert(
                    cookie,
                    WireRequest {
                        parent,
                        buf_offset: off as usize,
                        len: len as usize,
                        read,
                    },
                );
                let header = RequestHeader {
                    flags: 0,
                    command,
                    cookie,
                    offset: if command == Command::Flush {
                        0
                    } else {
                        req.lba * bs + off
                    },
                    length: len as u32,
                };
                self.queued.push(Queued {
                    header: header.encode(),
                    payload: write.then_some((parent, off as usize, len as usize)),
                });
                requests += 1;
                off += len;
                if off >= total {
                    break;
                }
            }
            st.parents.insert(
                parent,
                Parent {
                    tag: req.tag,
                    op: req.op,
                    lba: req.lba,
                    buf: if read { req.buf.take() } else { None },
                    remaining: requests,
                    status: Ok(()),
                },
            );
        }
        if write {
            if let Some(buf) = req.buf.take() {
                self.write_bufs.insert(parent, buf);
            }
        }
        self.next_parent += 1;
        self.in_flight += 1;
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        if self.queued.is_empty() {
            return Ok(());
        }
        let queued = std::mem::take(&mut self.queued);
        let mut sent = Ok(());
        for q in &queued {
            sent = self.out.write_all(&q.header);
            if let (Ok(()), Some((parent, off, len))) = (&sent, q.payload) {
                let data = self
                    .write_bufs
                    .get(&parent)
                    .and_then(|b| b.get(off..off + len));
                sent = match data {
                    Some(d) => self.out.write_all(d),
                    None => Err(io::Error::other("write buffer missing")),
                };
            }
            if sent.is_err() {
                break;
            }
        }
        let sent = sent.and_then(|()| self.out.flush());
        if let Err(e) = sent {
            // The reader sees the shutdown, fails every command in flight and exits.
            let reason = format!("sending requests failed: {e}");
            let _ = self.stream.shutdown(Shutdown::Both);
            self.broken = Some(reason.clone());
            return Err(DeviceError::Offline { reason });
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        // A failed doorbell still completes every command (with Offline) through the reader.
        let _ = self.ring_doorbell();
        let want = min_complete.min(self.in_flight);
        let mut got = 0;
        let mut cut = false;
        loop {
            match self.done.try_recv() {
                Ok(c) => {
                    self.finish(c, out);
                    got += 1;
                    continue;
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => break,
            }
            if got >= want {
                break;
            }
            let next = match self.io_timeout {
                Some(limit) => self.done.recv_timeout(limit).map_err(|e| match e {
                    RecvTimeoutError::Timeout => Some(limit),
                    RecvTimeoutError::Disconnected => None,
                }),
                None => self.done.recv().map_err(|_| None),
            };
            match next {
                Ok(c) => {
                    self.finish(c, out);
                    got += 1;
                }
                Err(Some(limit)) if !cut => {
                    // The server is alive on TCP but not answering: give up on the connection,
                    // which makes the reader complete everything in flight with Offline.
                    cut = true;
                    let reason = format!("no reply from the server within {limit:?}");
                    lock(&self.shared).dead.get_or_insert(reason.clone());
                    self.broken.get_or_insert(reason);
                    let _ = self.stream.shutdown(Shutdown::Both);
                }
                Err(_) => break,
            }
        }
        if got < want {
            return Err(DeviceError::Offline {
                reason: format!("nbd://{}/{}: reply reader is gone", self.peer, self.export),
            });
        }
        Ok(got)
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        let _ = self.ring_doorbell();
        self.disconnect();
    }
}

impl fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NbdClient")
            .field("peer", &self.peer)
            .field("export", &self.export)
            .field("geometry", &self.geo)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// The reply reader: matches replies to wire requests, reads read data into the parent's
/// buffer, and completes a parent when its last request is answered. On any failure it fails everything in
/// flight with `Offline` and marks the connection dead.
fn read_replies(
    input: Box<dyn Read + Send>,
    stream: TcpStream,
    shared: &Mutex<Shared>,
    done: &Sender<(u64, Completion)>,
) {
    let mut r = BufReader::with_capacity(IO_BUFFER, input);
    let reason = loop {
        let mut head = [0u8; SIMPLE_REPLY_LEN];
        if let Err(e) = r.read_exact(&mut head) {
            break format!("connection closed: {e}");
        }
        let reply = match SimpleReply::decode(&head) {
            Ok(reply) => reply,
            Err(e) => break format!("bad reply: {e}"),
        };
        let mut st = lock(shared);
        let Some(sent) = st.on_wire.remove(&reply.cookie) else {
            break format!("reply for unknown handle {:#x}", reply.cookie);
        };
        if sent.read && reply.error == 0 {
            let taken = st.parents.get_mut(&sent.parent).and_then(|p| p.buf.take());
            drop(st);
            let Some(mut buf) = taken else {
                break "read reply without a buffer".to_string();
            };
            let res = match buf.get_mut(sent.buf_offset..sent.buf_offset + sent.len) {
                Some(dst) => r.read_exact(dst),
                None => Err(io::Error::other("read reply larger than its buffer")),
            };
            st = lock(shared);
            if let Some(p) = st.parents.get_mut(&sent.parent) {
                p.buf = Some(buf);
            }
            if let Err(e) = res {
                break format!("connection closed mid-reply: {e}");
            }
        }
        let finished = match st.parents.get_mut(&sent.parent) {
            Some(p) => {
                if reply.error != 0 && p.status.is_ok() {
                    p.status = Err(DeviceError::Io {
                        op: p.op,
                        lba: p.lba,
                        errno: Errno(ErrorCode::from_code(reply.error).to_errno()),
                    });
                }
                p.remaining = p.remaining.saturating_sub(1);
                p.remaining == 0
            }
            None => false,
        };
        if finished {
            if let Some(p) = st.parents.remove(&sent.parent) {
                let _ = done.send((
                    sent.parent,
                    Completion {
                        tag: p.tag,
                        op: p.op,
                        status: p.status,
                        buf: p.buf,
                    },
                ));
            }
        }
    };
    let mut st = lock(shared);
    // A timeout in `poll` may have cut the connection; its reason is the better one.
    let reason = st.dead.get_or_insert(reason).clone();
    st.on_wire.clear();
    for (parent, p) in st.parents.drain() {
        let _ = done.send((
            parent,
            Completion {
                tag: p.tag,
                op: p.op,
                status: Err(DeviceError::Offline {
                    reason: reason.clone(),
                }),
                buf: p.buf,
            },
        ));
    }
    drop(st);
    let _ = stream.shutdown(Shutdown::Both);
}
