//! `remote:HOST[:PORT][/EXPORT]?tls=1&ca=PATH&timeout=SECS&reconnect=0|1` — a drive served by
//! another kura (or any NBD server), as a device kind: the [`NbdClient`] plus bounded waits, one
//! reconnect per dropped connection, and replay of what is safe to replay: reads.
//!
//! **Bounded waits.** Connecting and every handshake read are limited by `timeout` (10 s by
//! default), and so is every wait for a reply and every socket write once transmitting. A server
//! that stops answering has its connection cut after `timeout`; a dead one gives a typed error
//! ([`crate::ClientError::Timeout`] or `Connect` at open, [`RemoteError::ReconnectFailed`] and
//! `DeviceError::Offline` later), never a hang.
//!
//! **Reconnect and replay.** When the connection drops (the server went away, a timeout cut it,
//! a network error), every command in flight comes back from the client as `Offline`. The drive
//! then connects again, once, and:
//! - reads are sent again: they change nothing;
//! - writes, write-zeroes and discards that were *not acknowledged* fail with
//!   [`RemoteError::WritesLostInCut`] (as `DeviceError::Offline`), and the drive is poisoned:
//!   every later mutation is refused until it is opened again; reads still work. They are never
//!   sent again, because nothing tells the client that the old connection is dead at the server:
//!   a cut by timeout may leave those requests in the server's socket buffer or on the network,
//!   to run after a replay and after newer writes of ours, putting old data over new. (NBD has no
//!   way to fence an old connection; until a server offers one, the caller decides.) Writes the
//!   client refused before sending them, because it already knew its connection was gone, are
//!   sent on the new connection unless the drive is poisoned;
//! - flush: acknowledged writes that no flush covered may have lived only in the old server
//!   session's volatile cache (a restarted server lost them). A flush on the new connection
//!   cannot vouch for them, so a flush across a reconnect fails with
//!   [`RemoteError::FlushAcrossReconnect`] (as `DeviceError::Offline`) unless no write was
//!   acknowledged since the last successful flush, in which case it is simply sent again. The
//!   failure poisons the drive as any failed flush does.
//!
//! A command whose replay also fails completes with that error; if reconnecting fails, the drive
//! is offline for good ([`RemoteError::ReconnectFailed`]). The new connection must show the same
//! geometry. `reconnect=0` turns all of this off (the plain client's behaviour).

use crate::client::{connect_with, ClientError, ConnectOptions, NbdClient};
use crate::tls::ClientTls;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Geometry, Opcode, OpenError, Rejected,
    Request, Spec,
};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::time::Duration;

/// The IANA port of NBD, when the target names none.
const DEFAULT_PORT: u16 = 10809;
/// `timeout=` unless given, in seconds.
const DEFAULT_TIMEOUT_S: f64 = 10.0;

/// Why the drive failed a command beyond what the server said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    #[error(
        "flush across a reconnect: {unflushed} write(s) acknowledged on the lost connection were \
         never flushed, so whether they are durable is unknown"
    )]
    FlushAcrossReconnect { unflushed: u64 },
    #[error(
        "{count} write(s) in flight when the connection dropped were neither acknowledged nor \
         sent again (the old connection may still deliver them); reopen the drive to write again"
    )]
    WritesLostInCut { count: u64 },
    #[error("the connection to {addr} dropped and reconnecting failed: {reason}")]
    ReconnectFailed { addr: String, reason: String },
}

/// Where the drive connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub export: String,
}

impl Target {
    /// `HOST[:PORT][/EXPORT]`; an IPv6 host goes in brackets (`[::1]:10809/disk`).
    pub fn parse(text: &str) -> Result<Target, String> {
        let (hostport, export) = text.split_once('/').unwrap_or((text, ""));
        let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("{text:?}: an IPv6 address needs a closing `]`"))?;
            (h, after.strip_prefix(':'))
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{text:?} names no host (HOST[:PORT][/EXPORT])"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p
                .parse()
                .map_err(|_| format!("{text:?}: port {p:?} is not a number from 0 to 65535"))?,
        };
        Ok(Target {
            host: host.to_owned(),
            port,
            export: export.to_owned(),
        })
    }

    /// `host:port`, bracketed for IPv6, for connecting.
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Counts of what the drive has done since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Successful reconnects.
    pub reconnects: u64,
    /// Unacknowledged mutations failed (not replayed) at a reconnect.
    pub failed_in_cut: u64,
    /// Commands sent again on a new connection.
    pub replayed: u64,
    /// Flushes failed because they spanned a reconnect with unflushed acknowledged writes.
    pub refused_flushes: u64,
}

/// A command the caller gave us, while the client has it.
struct Entry {
    tag: u64,
    op: Opcode,
    lba: u64,
    blocks: u64,
    replayed: bool,
    /// For a flush: mutations acknowledged when it was submitted (what it will cover).
    acked_before: u64,
}

/// The drive; see the module docs.
pub struct Remote {
    target: Target,
    opts: ConnectOptions,
    reconnect: bool,
    client: Option<NbdClient>,
    geo: Geometry,
    /// Commands at the client, by the tag the client knows them under.
    entries: HashMap<u64, Entry>,
    next_id: u64,
    ready: VecDeque<Completion>,
    /// Mutations acknowledged on the current connection.
    acked: u64,
    /// Of those, how many the last successful flush covers.
    flushed: u64,
    /// Acknowledged, never-flushed mutations of connections that were lost.
    lost: u64,
    poison: FlushPoison,
    offline: Option<String>,
    last_error: Option<RemoteError>,
    stats: RemoteStats,
}

impl Remote {
    /// Connects to `target` with `opts`; `reconnect` enables the recovery in the module docs.
    pub fn connect(
        target: Target,
        opts: ConnectOptions,
        reconnect: bool,
    ) -> Result<Remote, ClientError> {
        let client = connect_with(target.addr().as_str(), &target.export, opts.clone())?;
        Ok(Remote {
            geo: client.geometry(),
            target,
            opts,
            reconnect,
            client: Some(client),
            entries: HashMap::new(),
            next_id: 1,
            ready: VecDeque::new(),
            acked: 0,
            flushed: 0,
            lost: 0,
            poison: FlushPoison::default(),
            offline: None,
            last_error: None,
            stats: RemoteStats::default(),
        })
    }

    /// Reconnects, replays, refused flushes.
    pub fn stats(&self) -> RemoteStats {
        self.stats
    }

    /// The last failure that was the drive's own (not the server's), if any.
    pub fn last_error(&self) -> Option<&RemoteError> {
        self.last_error.as_ref()
    }

    /// Completes `e` with `status` for the caller, keeping the flush bookkeeping.
    fn finish(&mut self, e: Entry, status: DeviceResult<()>, buf: Option<kura_engine::IoBuf>) {
        match (e.op, &status) {
            (Opcode::Flush, Ok(())) => self.flushed = self.flushed.max(e.acked_before),
            (Opcode::Write | Opcode::WriteZeroes | Opcode::Discard, Ok(())) => self.acked += 1,
            _ => {}
        }
        self.poison.observe(e.op, &status);
        self.ready.push_back(Completion {
            tag: e.tag,
            op: e.op,
            status,
            buf,
        });
    }

    fn refuse_flush(&mut self, e: Entry) {
        let err = RemoteError::FlushAcrossReconnect {
            unflushed: self.lost,
        };
        self.stats.refused_flushes += 1;
        let reason = err.to_string();
        self.last_error = Some(err);
        self.finish(e, Err(DeviceError::Offline { reason }), None);
    }

    /// Sorts a completion from the client: done, or to be replayed after a reconnect.
    fn on_inner(&mut self, c: Completion, retry: &mut Vec<(Entry, Option<kura_engine::IoBuf>)>) {
        let Some(e) = self.entries.remove(&c.tag) else {
            return;
        };
        let dropped = matches!(c.status, Err(DeviceError::Offline { .. }));
        if dropped && self.reconnect && !e.replayed && self.offline.is_none() {
            retry.push((e, c.buf));
        } else {
            self.finish(e, c.status, c.buf);
        }
    }

    /// The connection dropped: collect everything the old client had, connect again once, and
    /// replay what `retry` holds (see the module docs).
    fn recover(&mut self, mut retry: Vec<(Entry, Option<kura_engine::IoBuf>)>) {
        if let Some(mut old) = self.client.take() {
            let mut done = Vec::new();
            while old.in_flight() > 0 {
                let n = old.in_flight();
                if old.poll(&mut done, n).is_err() {
                    break;
                }
            }
            for c in done {
                self.on_inner(c, &mut retry);
            }
        }
        // Anything the old client never handed back is lost with its buffer.
        let stranded: Vec<u64> = self.entries.keys().copied().collect();
        for id in stranded {
            if let Some(e) = self.entries.remove(&id) {
                let reason = "the connection dropped and the command was lost".to_string();
                self.finish(e, Err(DeviceError::Offline { reason }), None);
            }
        }
        self.lost += self.acked - self.flushed.min(self.acked);
        self.acked = 0;
        self.flushed = 0;

        let addr = self.target.addr();
        let fresh = connect_with(addr.as_str(), &self.target.export, self.opts.clone())
            .map_err(|e| e.to_string())
            .and_then(|c| {
                let g = c.geometry();
                if (g.block_size, g.num_blocks) == (self.geo.block_size, self.geo.num_blocks) {
                    Ok(c)
                } else {
                    Err(format!(
                        "the export now has {} blocks of {} bytes, not {} of {}",
                        g.num_blocks, g.block_size, self.geo.num_blocks, self.geo.block_size
                    ))
                }
            });
        let client = match fresh {
            Ok(c) => c,
            Err(reason) => {
                let err = RemoteError::ReconnectFailed { addr, reason };
                let reason = err.to_string();
                self.last_error = Some(err);
                self.offline = Some(reason.clone());
                for (e, buf) in retry {
                    let reason = reason.clone();
                    self.finish(e, Err(DeviceError::Offline { reason }), buf);
                }
                return;
            }
        };
        self.client = Some(client);
        self.stats.reconnects += 1;
        let (mutations, retry): (Vec<_>, Vec<_>) = retry
            .into_iter()
            .partition(|(e, _)| e.op.is_mutation() && e.op != Opcode::Flush);
        if !mutations.is_empty() {
            let err = RemoteError::WritesLostInCut {
                count: mutations.len() as u64,
            };
            let reason = err.to_string();
            self.last_error = Some(err);
            self.poison.poison(reason.clone());
            self.stats.failed_in_cut += mutations.len() as u64;
            for (e, buf) in mutations {
                let reason = reason.clone();
                self.finish(e, Err(DeviceError::Offline { reason }), buf);
            }
        }
        for (mut e, buf) in retry {
            if e.op == Opcode::Flush && self.poison.is_poisoned() {
                let error =
                    self.poison
                        .check(Opcode::Flush)
                        .err()
                        .unwrap_or(DeviceError::Offline {
                            reason: "the drive is poisoned".into(),
                        });
                self.finish(e, Err(error), buf);
                continue;
            }
            if e.op == Opcode::Flush && self.lost > 0 {
                self.refuse_flush(e);
                continue;
            }
            e.replayed = true;
            e.acked_before = 0;
            self.stats.replayed += 1;
            let req = Request {
                tag: 0,
                op: e.op,
                lba: e.lba,
                blocks: e.blocks,
                buf,
            };
            if let Err((e, rejected)) = self.send(e, req) {
                self.finish(e, Err(rejected.error), rejected.request.buf);
            }
        }
        if let Some(c) = self.client.as_mut() {
            let _ = c.ring_doorbell();
        }
    }

    /// Hands `req` to the client under a fresh id; on refusal gives both back.
    fn send(&mut self, e: Entry, mut req: Request) -> Result<(), (Entry, Rejected)> {
        let id = self.next_id;
        self.next_id += 1;
        req.tag = id;
        let Some(client) = self.client.as_mut() else {
            let reason = self
                .offline
                .clone()
                .unwrap_or_else(|| "not connected".into());
            return Err((e, Rejected::new(req, DeviceError::Offline { reason })));
        };
        match client.submit(req) {
            Ok(()) => {
                self.entries.insert(id, e);
                Ok(())
            }
            Err(rejected) => Err((e, rejected)),
        }
    }
}

impl BlockDevice for Remote {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The drive's reconnect counters, then its current connection.
    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = self.stats;
        out.push(
            kura_engine::DriveStats::new("remote")
                .with("reconnects", s.reconnects)
                .with("replayed", s.replayed)
                .with("failed_in_cut", s.failed_in_cut)
                .with("refused_flushes", s.refused_flushes),
        );
        if let Some(client) = &self.client {
            kura_engine::device::child_stats(client, out);
        }
    }

    fn describe(&self) -> String {
        format!(
            "remote:{}/{}{}",
            self.target.addr(),
            self.target.export,
            if self.opts.tls.is_some() {
                "?tls=1"
            } else {
                ""
            }
        )
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight())?;
        if let Err(e) = self.poison.check(req.op) {
            return Err(Rejected::new(req, e));
        }
        if let Some(reason) = self.offline.clone() {
            return Err(Rejected::new(req, DeviceError::Offline { reason }));
        }
        let e = Entry {
            tag: req.tag,
            op: req.op,
            lba: req.lba,
            blocks: req.blocks,
            replayed: false,
            acked_before: self.acked,
        };
        if req.op == Opcode::Flush && self.lost > 0 {
            self.refuse_flush(e);
            return Ok(());
        }
        match self.send(e, req) {
            Ok(()) => Ok(()),
            Err((e, rejected))
                if self.reconnect && matches!(rejected.error, DeviceError::Offline { .. }) =>
            {
                // The client already knows its connection is gone: recover, then try once more.
                let mut req = rejected.request;
                req.tag = e.tag;
                self.recover(Vec::new());
                if let Some(reason) = self.offline.clone() {
                    return Err(Rejected::new(req, DeviceError::Offline { reason }));
                }
                // Recovery may have failed writes of the old connection and poisoned the drive.
                if let Err(error) = self.poison.check(req.op) {
                    return Err(Rejected::new(req, error));
                }
                if req.op == Opcode::Flush && self.lost > 0 {
                    self.refuse_flush(e);
                    return Ok(());
                }
                // What a flush covers is counted on the new connection.
                let e = Entry {
                    acked_before: self.acked,
                    ..e
                };
                self.send(e, req).map_err(|(e, mut r)| {
                    r.request.tag = e.tag;
                    r
                })
            }
            Err((e, mut rejected)) => {
                rejected.request.tag = e.tag;
                Err(rejected)
            }
        }
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        // A failed send cuts the connection; `poll` then collects and replays what was in flight.
        if let Some(c) = self.client.as_mut() {
            let _ = c.ring_doorbell();
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let want = min_complete.min(self.in_flight());
        let mut got = 0;
        loop {
            while let Some(c) = self.ready.pop_front() {
                out.push(c);
                got += 1;
            }
            let Some(client) = self.client.as_mut() else {
                break;
            };
            let pending = client.in_flight();
            if pending == 0 || (got >= want && self.entries.is_empty()) {
                break;
            }
            let need = if got >= want { 0 } else { 1 };
            let mut done = Vec::new();
            let broke = client.poll(&mut done, need).is_err();
            let mut retry = Vec::new();
            let polled = done.len();
            for c in done {
                self.on_inner(c, &mut retry);
            }
            if broke || !retry.is_empty() {
                if self.reconnect {
                    self.recover(retry);
                } else {
                    for (e, buf) in retry {
                        let reason = "the connection dropped".to_string();
                        self.finish(e, Err(DeviceError::Offline { reason }), buf);
                    }
                }
                continue;
            }
            if polled == 0 && got >= want {
                break;
            }
        }
        if got < want {
            return Err(DeviceError::Offline {
                reason: self
                    .offline
                    .clone()
                    .unwrap_or_else(|| "completions were lost".into()),
            });
        }
        Ok(got)
    }

    fn in_flight(&self) -> usize {
        self.entries.len() + self.ready.len()
    }
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("target", &self.target)
            .field("geometry", &self.geo)
            .field("in_flight", &self.in_flight())
            .field("stats", &self.stats)
            .finish()
    }
}

/// Opens `remote:HOST[:PORT][/EXPORT]` with options `tls=0|1`, `ca=PATH` (PEM CA certificates,
/// required with TLS), `cert=PATH` and `key=PATH` (a client certificate and its key, for servers
/// that verify clients: `kura serve --tls-ca`), `timeout=SECS`, `reconnect=0|1`, `qd=N` and
/// `bs=N`.
pub fn open(spec: &Spec) -> Result<Remote, OpenError> {
    spec.check_options(&[
        "tls",
        "ca",
        "cert",
        "key",
        "timeout",
        "reconnect",
        "qd",
        "bs",
    ])?;
    let text = spec.require_target()?;
    let target = Target::parse(text).map_err(OpenError::Invalid)?;
    let secs: f64 = spec.num_option("timeout")?.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(OpenError::Invalid(format!(
            "{spec}: timeout={secs} is not between 0 and 86400 seconds"
        )));
    }
    let limit = Duration::from_secs_f64(secs);
    let identity = match (spec.option("cert"), spec.option("key")) {
        (Some(cert), Some(key)) => Some((Path::new(cert), Path::new(key))),
        (None, None) => None,
        _ => {
            return Err(OpenError::Invalid(format!(
                "{spec}: a client certificate needs both cert=PATH and key=PATH"
            )))
        }
    };
    let tls = match (spec.bool_option("tls")?.unwrap_or(false), spec.option("ca")) {
        (true, Some(ca)) => Some(
            match identity {
                Some((cert, key)) => {
                    ClientTls::with_client_cert(Path::new(ca), &target.host, cert, key)
                }
                None => ClientTls::new(Path::new(ca), &target.host),
            }
            .map_err(|e| OpenError::Invalid(format!("{spec}: {e}")))?,
        ),
        (true, None) => {
            return Err(OpenError::Invalid(format!(
                "{spec}: tls=1 needs ca=PATH (the PEM certificate of the CA that signed the \
                 server's certificate)"
            )))
        }
        (false, Some(_)) => {
            return Err(OpenError::Invalid(format!(
                "{spec}: ca= is only used with tls=1"
            )))
        }
        (false, None) if identity.is_some() => {
            return Err(OpenError::Invalid(format!(
                "{spec}: cert= and key= are only used with tls=1"
            )))
        }
        (false, None) => None,
    };
    let mut opts = ConnectOptions {
        handshake_timeout: limit,
        io_timeout: Some(limit),
        tls,
        ..ConnectOptions::default()
    };
    if let Some(qd) = spec.num_option("qd")? {
        opts.queue_depth = qd;
    }
    opts.block_size = spec.num_option("bs")?;
    let reconnect = spec.bool_option("reconnect")?.unwrap_or(true);
    Remote::connect(target, opts, reconnect).map_err(|e| OpenError::Invalid(format!("{spec}: {e}")))
}
