//! One opened drive behind several exports of one `kura serve` (`NAME=@OTHER`): the drive is
//! opened once (kura opens writable images exclusively, so it could not be opened twice), and
//! every export that names it gets a [`Port`], a [`BlockDevice`] of its own over the one driver.
//!
//! **How ports share the queue.** The drive sits in a mutex. A port submits under the lock with
//! its caller's tag swapped for a drive-wide one, and whichever port polls routes every completion
//! the drive returns to the port that submitted it. A port waiting for its own completions blocks
//! in the drive's `poll` while holding the lock; other ports' submissions then wait for the next
//! completion of any port, never longer. Requests of different exports are in flight together
//! and complete in any order: nothing orders overlapping ranges written through two doors (as
//! with two clients of one NBD export), so users that need an order must wait for one door's
//! completion before using the other. A flush through any door makes durable every write any
//! door completed before it.
//!
//! Block status ([`BlockDevice::allocation`]) through a port first completes what every port
//! has in flight, as the device contract asks.

use anyhow::{bail, Context};
use kura_engine::device::child_stats;
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, DriveStats, Extent, Geometry, Rejected,
    Request,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The drive and who asked for what is in flight on it.
struct Hub {
    dev: Box<dyn BlockDevice>,
    next_tag: u64,
    /// Drive tag -> (port, the port caller's tag).
    owners: HashMap<u64, (usize, u64)>,
    /// Completions polled from the drive, waiting for their port's `poll`.
    routed: Vec<Vec<Completion>>,
    /// Requests each port submitted.
    submitted: Vec<u64>,
}

impl Hub {
    /// Polls the drive (waiting for `min` completions) and routes what comes back.
    fn pump(&mut self, min: usize) -> DeviceResult<usize> {
        let mut got = Vec::new();
        let n = self.dev.poll(&mut got, min)?;
        for mut c in got {
            if let Some((port, tag)) = self.owners.remove(&c.tag) {
                c.tag = tag;
                self.routed[port].push(c);
            }
        }
        Ok(n)
    }
}

/// One export's view of a shared drive.
pub struct Port {
    hub: Arc<Mutex<Hub>>,
    id: usize,
    geo: Geometry,
    /// Accepted and not yet returned by `poll`.
    in_flight: usize,
    describe: String,
}

/// Opens `ports` views of `dev`.
pub fn share(dev: Box<dyn BlockDevice>, ports: usize) -> Vec<Port> {
    let geo = dev.geometry();
    let describe = format!("shared({})", dev.describe());
    let hub = Arc::new(Mutex::new(Hub {
        dev,
        next_tag: 0,
        owners: HashMap::new(),
        routed: (0..ports).map(|_| Vec::new()).collect(),
        submitted: vec![0; ports],
    }));
    (0..ports)
        .map(|id| Port {
            hub: hub.clone(),
            id,
            geo,
            in_flight: 0,
            describe: describe.clone(),
        })
        .collect()
}

impl Port {
    fn lock(&self) -> MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves this port's routed completions into `out`.
    fn take(&mut self, hub: &mut Hub, out: &mut Vec<Completion>) -> usize {
        let mine = &mut hub.routed[self.id];
        let n = mine.len();
        self.in_flight -= n;
        out.append(mine);
        n
    }
}

impl BlockDevice for Port {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn submit(&mut self, mut req: Request) -> Result<(), Rejected> {
        let hub = self.hub.clone();
        let mut hub = hub.lock().unwrap_or_else(PoisonError::into_inner);
        let tag = hub.next_tag;
        hub.next_tag += 1;
        let theirs = std::mem::replace(&mut req.tag, tag);
        hub.owners.insert(tag, (self.id, theirs));
        if let Err(mut rejected) = hub.dev.submit(req) {
            hub.owners.remove(&tag);
            rejected.request.tag = theirs;
            return Err(rejected);
        }
        hub.submitted[self.id] += 1;
        self.in_flight += 1;
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.lock().dev.ring_doorbell()
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let target = min_complete.min(self.in_flight);
        let hub = self.hub.clone();
        let mut hub = hub.lock().unwrap_or_else(PoisonError::into_inner);
        hub.pump(0)?;
        let mut n = self.take(&mut hub, out);
        while n < target {
            if hub.dev.in_flight() == 0 {
                // Every request of this port has been routed already; nothing more can come.
                return Err(DeviceError::Offline {
                    reason: "shared drive lost track of a request".into(),
                });
            }
            hub.pump(1)?;
            n += self.take(&mut hub, out);
        }
        Ok(n)
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn stats(&self, out: &mut Vec<DriveStats>) {
        let hub = self.lock();
        out.push(
            DriveStats::new("shared")
                .with("port", self.id as u64)
                .with("submitted", hub.submitted[self.id])
                .with("ports", hub.submitted.len() as u64),
        );
        child_stats(&*hub.dev, out);
    }

    fn allocation(&mut self, lba: u64, blocks: u64) -> DeviceResult<Option<Vec<Extent>>> {
        let mut hub = self.lock();
        // The drive answers only with nothing in flight; other ports' requests finish first
        // (their completions wait for their own polls).
        while hub.dev.in_flight() > 0 {
            hub.pump(1)?;
        }
        hub.dev.allocation(lba, blocks)
    }
}

/// Which door an export is served through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Nbd,
    VhostUser,
    Ublk,
}

impl Door {
    /// The name `kura serve ctl show` reports.
    pub fn name(self) -> &'static str {
        match self {
            Door::Nbd => "nbd",
            Door::VhostUser => "vhost-user",
            Door::Ublk => "ublk",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Door::Nbd => "export",
            Door::VhostUser => "--vhost-user",
            Door::Ublk => "--ublk",
        }
    }
}

/// An export whose drive is open.
pub struct Opened {
    pub door: Door,
    pub name: String,
    /// The drive's spec (for `@OTHER`, OTHER's).
    pub spec: String,
    pub read_only: bool,
    pub dev: Box<dyn BlockDevice>,
    /// Set when the drive backs several exports: the name of the export that opened it.
    pub shared: Option<String>,
}

/// Opens the drive of every export given as `NAME=SPEC[:ro]` through its door; `NAME=@OTHER`
/// (`:ro` allowed) shares export OTHER's drive instead of opening one. Names are unique across
/// all doors. NBD exports open their spec as given (`:ro` is enforced by the server); ublk and
/// vhost-user exports open a `:ro` spec read-only.
pub fn open_all(args: &[(Door, &str)]) -> anyhow::Result<Vec<Opened>> {
    struct Decl<'a> {
        door: Door,
        name: &'a str,
        spec: &'a str,
        ro: bool,
    }
    let mut decls: Vec<Decl<'_>> = Vec::new();
    for &(door, arg) in args {
        let (name, spec) = arg
            .split_once('=')
            .with_context(|| format!("{} `{arg}` is not NAME=SPEC", door.flag()))?;
        let (spec, ro) = match spec.strip_suffix(":ro") {
            Some(s) => (s, true),
            None => (spec, false),
        };
        if name.is_empty() {
            bail!("{} `{arg}`: the export needs a name", door.flag());
        }
        if decls.iter().any(|d| d.name == name) {
            bail!("export name `{name}` is used twice (names are unique across NBD, --ublk and --vhost-user)");
        }
        decls.push(Decl {
            door,
            name,
            spec,
            ro,
        });
    }
    let base_of = |d: &Decl<'_>| -> anyhow::Result<Option<usize>> {
        let Some(other) = d.spec.strip_prefix('@') else {
            return Ok(None);
        };
        let i = decls
            .iter()
            .position(|b| b.name == other)
            .with_context(|| {
                format!(
                    "export `{}=@{other}`: there is no export named `{other}`",
                    d.name
                )
            })?;
        let base = &decls[i];
        if base.spec.starts_with('@') {
            bail!(
                "export `{}=@{other}`: `{other}` itself shares a drive; name the export that opens it",
                d.name
            );
        }
        if base.ro && !d.ro {
            bail!(
                "export `{}=@{other}`: `{other}` is read-only, so `{}` must be too (append :ro)",
                d.name,
                d.name
            );
        }
        Ok(Some(i))
    };
    let mut bases = Vec::with_capacity(decls.len());
    for d in &decls {
        bases.push(base_of(d)?);
    }
    // Each drive once, then its ports: the opening export takes port 0, sharers the rest in order.
    let mut ports: HashMap<usize, std::vec::IntoIter<Port>> = HashMap::new();
    let mut own: HashMap<usize, Box<dyn BlockDevice>> = HashMap::new();
    for (i, d) in decls.iter().enumerate() {
        if bases[i].is_some() {
            continue;
        }
        let dev = if d.ro && d.door != Door::Nbd {
            crate::dev::open_dev_read_only(d.spec)?
        } else {
            crate::dev::open_dev(d.spec)?
        };
        let sharers = bases.iter().filter(|b| **b == Some(i)).count();
        if sharers == 0 {
            own.insert(i, dev);
        } else {
            ports.insert(i, share(dev, sharers + 1).into_iter());
        }
    }
    let mut opened = Vec::with_capacity(decls.len());
    for (i, d) in decls.iter().enumerate() {
        let base = bases[i].unwrap_or(i);
        let (dev, shared): (Box<dyn BlockDevice>, _) = match own.remove(&i) {
            Some(dev) => (dev, None),
            None => {
                let port = ports
                    .get_mut(&base)
                    .and_then(Iterator::next)
                    .context("a shared drive has fewer ports than exports")?;
                (Box::new(port), Some(decls[base].name.to_string()))
            }
        };
        opened.push(Opened {
            door: d.door,
            name: d.name.to_string(),
            spec: decls[base].spec.to_string(),
            read_only: d.ro,
            dev,
            shared,
        });
    }
    Ok(opened)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kura_engine::{BlockingIo, BufferPool};

    #[test]
    fn each_port_passes_the_conformance_suite_while_the_other_has_requests_in_flight() {
        let dev = kura_engine::open("mem:8M").unwrap();
        let mut ports = share(dev, 2);
        let mut b = ports.pop().unwrap();
        let mut a = ports.pop().unwrap();
        // Port b keeps reads in flight (not polled) while a runs the suite, so the drive's
        // completions for b must be routed past a.
        for tag in 0..4 {
            let buf = BufferPool::global().alloc(4096).unwrap();
            b.submit(Request::read(tag, 1000 + tag, 1, buf)).unwrap();
        }
        b.ring_doorbell().unwrap();
        for (name, outcome) in kura_engine::conformance::suite(&mut a, 0, 512, 7) {
            assert!(outcome.is_ok(), "{name}: {outcome:?}");
        }
        let mut out = Vec::new();
        assert_eq!(b.poll(&mut out, 4).unwrap(), 4);
        let mut tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
        tags.sort_unstable();
        assert_eq!(tags, vec![0, 1, 2, 3]);
        assert!(out.iter().all(|c| c.status.is_ok()));
        assert_eq!(b.in_flight(), 0);
        for (name, outcome) in kura_engine::conformance::suite(&mut b, 600, 256, 9) {
            assert!(outcome.is_ok(), "{name}: {outcome:?}");
        }
    }

    #[test]
    fn a_write_through_one_port_reads_back_through_the_other() {
        let mut ports = share(kura_engine::open("mem:1M").unwrap(), 2);
        let data = vec![0xa5u8; 4096];
        ports[0].write_blocks(3, &data).unwrap();
        ports[0].flush_all().unwrap();
        let mut back = vec![0u8; 4096];
        ports[1].read_blocks(3, &mut back).unwrap();
        assert_eq!(back, data);
        let stats = kura_engine::device::stats_of(&ports[1]);
        assert_eq!(stats[0].kind, "shared");
        assert_eq!(stats[0].counter("ports"), Some(2));
        assert!(ports[1].describe().starts_with("shared(mem"));
    }
}
