//! The priority drive: a probe under it sees foreground commands arrive behind at most `bgdepth`
//! background commands, background progress under a saturating foreground, dispatched bytes in
//! the ratio of the weights, handles on separate threads against their own models, per-class
//! flush durability across a power cut, and clear errors for bad options.

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{
    BlockDevice, BlockingIo, Completion, DeviceError, DeviceResult, Geometry, IoBuf, Rejected,
    Request,
};
use kura_vdrive::{ClassHandle, Priority, PriorityOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const BS: usize = 4096;
const BLOCKS: u64 = 1024;
/// Foreground requests use LBAs below this, background ones above, so the probe tells them apart.
const HALF: u64 = BLOCKS / 2;

fn opts(bg_depth: usize, bg_chunk: Option<u64>) -> PriorityOptions {
    PriorityOptions { bg_depth, bg_chunk }
}

#[derive(Default)]
struct Seen {
    on_child: HashMap<u64, bool>,
    bg_now: usize,
    /// Most background commands on the child when a foreground one arrived.
    bg_ahead_of_fg: usize,
    bg_max: usize,
    /// Longest background command, in blocks.
    bg_longest: u64,
    bytes: [u64; 2],
}

/// A device that records what the scheduler sends it.
struct Probe {
    inner: MemDevice,
    seen: Arc<Mutex<Seen>>,
}

impl BlockDevice for Probe {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn describe(&self) -> String {
        "probe".into()
    }
    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let bg = req.lba >= HALF;
        let (tag, bytes) = (req.tag, req.blocks * BS as u64);
        self.inner.submit(req)?;
        let mut s = self.seen.lock().expect("probe log");
        s.on_child.insert(tag, bg);
        s.bytes[usize::from(bg)] += bytes;
        if bg {
            s.bg_longest = s.bg_longest.max(bytes / BS as u64);
            s.bg_now += 1;
            s.bg_max = s.bg_max.max(s.bg_now);
        } else {
            s.bg_ahead_of_fg = s.bg_ahead_of_fg.max(s.bg_now);
        }
        Ok(())
    }
    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.inner.ring_doorbell()
    }
    fn poll(&mut self, out: &mut Vec<Completion>, min: usize) -> DeviceResult<usize> {
        let from = out.len();
        let n = self.inner.poll(out, min)?;
        let mut s = self.seen.lock().expect("probe log");
        for c in &out[from..] {
            if s.on_child.remove(&c.tag) == Some(true) {
                s.bg_now -= 1;
            }
        }
        Ok(n)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

fn probed(
    qd: u32,
    weights: &[u32],
    bg_depth: usize,
    bg_chunk: Option<u64>,
) -> (Vec<ClassHandle>, Arc<Mutex<Seen>>) {
    let queue = QueueOptions {
        queue_depth: qd,
        ..QueueOptions::default()
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let probe = Probe {
        inner: MemDevice::new(BLOCKS * BS as u64, queue).shuffled(7),
        seen: Arc::clone(&seen),
    };
    let handles = Priority::classes(Box::new(probe), weights, opts(bg_depth, bg_chunk))
        .expect("valid priority drive");
    (handles, seen)
}

/// Submits `req`, polling `dev` for room; pushes completions to `done`.
fn submit(dev: &mut ClassHandle, mut req: Request, done: &mut Vec<Completion>) {
    loop {
        match dev.submit(req) {
            Ok(()) => return,
            Err(r) if matches!(r.error, DeviceError::QueueFull { .. }) => {
                req = r.request;
                dev.poll(done, 1).expect("poll");
            }
            Err(r) => panic!("refused: {}", r.error),
        }
    }
}

#[test]
fn foreground_waits_behind_at_most_bgdepth_and_background_progresses() {
    behind_at_most_bgdepth(None);
    behind_at_most_bgdepth(Some(8 << 10));
}

fn behind_at_most_bgdepth(chunk: Option<u64>) {
    let (mut handles, seen) = probed(64, &[8, 1], 2, chunk);
    let mut bg = handles.pop().expect("a class");
    let mut fg = handles.pop().expect("a class");
    assert!(fg.is_foreground() && !bg.is_foreground());
    let mut rng = SmallRng::seed_from_u64(1);
    let (mut bg_done, mut fg_done) = (Vec::new(), Vec::new());
    let mut tag = 0;
    for _ in 0..300 {
        // Keep 32 background writes of 8 blocks queued at all times.
        while bg.in_flight() < 32 {
            tag += 1;
            let lba = rng.gen_range(HALF..BLOCKS - 8);
            submit(
                &mut bg,
                Request::write(tag, lba, 8, IoBuf::zeroed(8 * BS)),
                &mut bg_done,
            );
        }
        bg.ring_doorbell().expect("doorbell");
        // One foreground read at QD1.
        tag += 1;
        let lba = rng.gen_range(0..HALF);
        submit(
            &mut fg,
            Request::read(tag, lba, 1, IoBuf::zeroed(BS)),
            &mut fg_done,
        );
        let before = fg_done.len();
        while fg_done.len() == before {
            fg.poll(&mut fg_done, 1).expect("poll");
        }
        bg.poll(&mut bg_done, 0).expect("poll");
    }
    while bg.in_flight() > 0 {
        bg.poll(&mut bg_done, 1).expect("poll");
    }
    assert_eq!(fg_done.len(), 300);
    assert!(fg_done.iter().chain(&bg_done).all(|c| c.status.is_ok()));
    let s = seen.lock().expect("probe log");
    assert_eq!(
        s.bg_longest,
        chunk.map_or(8, |c| c / BS as u64),
        "background commands are cut to bgchunk, and only then"
    );
    assert!(
        s.bg_ahead_of_fg <= 2,
        "a foreground command reached the child behind {} background ones (bgdepth 2)",
        s.bg_ahead_of_fg
    );
    assert_eq!(s.bg_max, 2, "background fills its allowance and no more");
    assert!(
        bg_done.len() >= 300,
        "background made progress next to the foreground: {} writes",
        bg_done.len()
    );
}

/// Keeps every class backlogged with 8-block writes and returns the bytes the child received per
/// class once `total` bytes have gone by.
fn dispatched_bytes(weights: &[u32], bg_depth: usize, total: u64) -> Vec<u64> {
    let mem = MemDevice::new(
        BLOCKS * BS as u64,
        QueueOptions {
            queue_depth: 4,
            ..QueueOptions::default()
        },
    );
    let mut handles =
        Priority::classes(Box::new(mem), weights, opts(bg_depth, None)).expect("valid weights");
    let mut done = Vec::new();
    let mut tag = 0;
    let mut sum = 0;
    while sum < total {
        for h in handles.iter_mut() {
            while h.in_flight() < 48 {
                tag += 1;
                let lba = (tag * 8) % (BLOCKS - 8);
                submit(
                    h,
                    Request::write(tag, lba, 8, IoBuf::zeroed(8 * BS)),
                    &mut done,
                );
            }
        }
        handles[0].poll(&mut done, 1).expect("poll class 0");
        for h in handles.iter_mut().skip(1) {
            h.poll(&mut done, 0).expect("poll a class");
        }
        done.clear();
        sum = handles.iter().map(|h| h.stats().dispatched_bytes).sum();
    }
    handles.iter().map(|h| h.stats().dispatched_bytes).collect()
}

#[test]
fn dispatched_bytes_follow_the_weights_when_every_class_is_backlogged() {
    for weights in [[3u32, 1, 1], [4, 2, 1], [1, 1, 1]] {
        let bytes = dispatched_bytes(&weights, 4, 96 << 20);
        let unit = bytes[0] as f64 / f64::from(weights[0]);
        for (i, (&b, &w)) in bytes.iter().zip(&weights).enumerate() {
            let share = b as f64 / (unit * f64::from(w));
            assert!(
                (0.9..=1.1).contains(&share),
                "weights {weights:?}: class {i} got {b} bytes, {share:.3} of its weighted share ({bytes:?})"
            );
        }
    }
}

#[test]
fn background_is_not_starved_by_a_saturating_foreground() {
    // With bgdepth 1 a round that finds the background's one command still on the child skips
    // it, so the background gets less than its weighted 1 %, but never nothing.
    let bytes = dispatched_bytes(&[100, 1], 1, 64 << 20);
    assert!(
        bytes[1] > 0 && bytes[0] / bytes[1] <= 200,
        "weight 100:1 with bgdepth 1 still gives the background at least half its 1 %: {bytes:?}"
    );
}

#[test]
fn handles_on_separate_threads_match_their_models() {
    let mem = MemDevice::new(BLOCKS * BS as u64, QueueOptions::default()).shuffled(3);
    let storage = mem.storage();
    let handles = Priority::classes(Box::new(mem), &[8, 1], opts(4, Some(16 << 10))).unwrap();
    let threads: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(class, mut h)| {
            std::thread::spawn(move || {
                let base = class as u64 * HALF;
                let mut model = vec![0u8; HALF as usize * BS];
                let mut rng = SmallRng::seed_from_u64(class as u64);
                for i in 0..400u32 {
                    let blocks = rng.gen_range(1..=if class == 0 { 1 } else { 32 });
                    let lba = rng.gen_range(0..=HALF - blocks);
                    let range = lba as usize * BS..(lba + blocks) as usize * BS;
                    if rng.gen_bool(0.5) {
                        let data: Vec<u8> = (0..range.len()).map(|_| rng.gen()).collect();
                        h.write_blocks(base + lba, &data).unwrap();
                        model[range].copy_from_slice(&data);
                    } else {
                        let mut out = vec![0u8; range.len()];
                        h.read_blocks(base + lba, &mut out).unwrap();
                        assert!(out == model[range], "class {class} op {i} read wrong data");
                    }
                    if i % 50 == 0 {
                        h.flush_all().unwrap();
                    }
                }
                model
            })
        })
        .collect();
    let models: Vec<Vec<u8>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(storage.lock().unwrap()[..] == models.concat()[..]);
}

#[test]
fn a_class_flush_makes_its_acknowledged_writes_durable() {
    let mem = MemDevice::new(BLOCKS * BS as u64, QueueOptions::default());
    let storage = mem.storage();
    let fault = FaultDevice::new(
        Box::new(mem),
        FaultPlan {
            keep_probability: 0.0,
            ..FaultPlan::default()
        },
    );
    let control = fault.control();
    let mut handles = Priority::classes(Box::new(fault), &[8, 1], opts(2, Some(8 << 10))).unwrap();
    let data: Vec<u8> = (0..8 * BS).map(|i| (i / BS) as u8 + 1).collect();
    handles[1].write_blocks(HALF, &data).unwrap();
    handles[1].flush_all().unwrap();
    handles[0].write_blocks(0, &data).unwrap();
    control.power_cut();
    drop(handles);
    let disk = storage.lock().unwrap();
    assert!(
        disk[HALF as usize * BS..][..8 * BS] == data[..],
        "flushed by class 1"
    );
    assert!(
        disk[..8 * BS].iter().all(|&b| b == 0),
        "class 0 never flushed, keep=0"
    );
}

#[test]
fn the_spec_opens_class_zero_and_bad_options_are_refused() {
    let dev = kura_vdrive::open("priority(mem:1M)?weights=8:1:2&bgdepth=3").unwrap();
    assert_eq!(
        dev.describe(),
        "priority(mem:1048576)?weights=8:1:2&bgdepth=3"
    );
    assert_eq!(dev.geometry().capacity_bytes(), 1 << 20);
    for (spec, says) in [
        ("priority(mem:1M)?weights=8", "2 to 16 class weights"),
        ("priority(mem:1M)?weights=0:1", "weight 0 is outside"),
        ("priority(mem:1M)?weights=8:x", "weight `x`"),
        ("priority(mem:1M)?weights=8:1001", "outside 1..=1000"),
        ("priority(mem:1M)?bgdepth=0", "bgdepth must be at least 1"),
        ("priority(mem:1M)?bgdepth=-1", "bgdepth"),
        ("priority(mem:1M,mem:1M)", "exactly 1 device"),
        ("priority(mem:1M)?weight=8:1", "no option `weight`"),
        (
            "priority(mem:1M)?bgchunk=5000",
            "bgchunk 5000 is not a non-zero multiple",
        ),
    ] {
        let err = kura_vdrive::open(spec)
            .err()
            .unwrap_or_else(|| panic!("{spec} opened"));
        assert!(err.to_string().contains(says), "{spec}: {err}");
    }
}
