//! Mapping many inputs at once: a contiguous range of `x` split into chunks over threads
//! (`std::thread::scope`), each with its own [`Workspace`], mapped through
//! [`Mapper::do_rule_batch`] (straw2 draws made for several inputs in SIMD lanes), results in
//! one flat array with a fixed stride so no per-input allocation happens.

use std::ops::RangeInclusive;

use crate::error::CrushError;
use crate::map::ITEM_NONE;
use crate::mapper::{Mapper, Workspace, XLANES};

/// Inputs handed to [`Mapper::do_rule_batch`] at a time.
const BATCH: usize = XLANES * 32;

/// Results for a range of inputs: input `x_first + i` mapped to
/// `items[i * stride .. i * stride + lens[i]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// First input.
    pub x_first: i32,
    /// Slots per input (the `result_max` asked for).
    pub stride: usize,
    /// Items per input.
    pub lens: Vec<u32>,
    /// Items, `stride` slots per input; unused slots hold [`ITEM_NONE`].
    pub items: Vec<i32>,
}

impl BatchResult {
    /// Number of inputs.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether no input was mapped.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// The mapping of the `i`-th input.
    pub fn get(&self, i: usize) -> &[i32] {
        let start = i * self.stride;
        &self.items[start..start + self.lens[i] as usize]
    }
}

/// Maps every `x` in `xs` through `rule`, on `threads` threads (0: as many as the machine has).
pub fn map_range(
    mapper: &Mapper<'_>,
    rule: u32,
    xs: RangeInclusive<i32>,
    result_max: usize,
    weights: &[u32],
    threads: usize,
) -> Result<BatchResult, CrushError> {
    if mapper.map().rule(rule).is_none() {
        return Err(CrushError::NoSuchRule(rule));
    }
    let (first, last) = (*xs.start(), *xs.end());
    let n = if last < first {
        0
    } else {
        (last as i64 - first as i64 + 1) as usize
    };
    let stride = result_max;
    let mut lens = vec![0u32; n];
    let mut items = vec![ITEM_NONE; n * stride];
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |v| v.get())
    } else {
        threads
    }
    .clamp(1, n.max(1));
    let per = n.div_ceil(threads).max(1);
    let run = |start: usize, lens: &mut [u32], items: &mut [i32]| -> Result<(), CrushError> {
        let mut ws = Workspace::new();
        let mut out = Vec::with_capacity(stride);
        let mut xs = [0i32; BATCH];
        for (b, lens) in lens.chunks_mut(BATCH).enumerate() {
            let base = start + b * BATCH;
            for (i, x) in xs.iter_mut().enumerate().take(lens.len()) {
                *x = first.wrapping_add((base + i) as i32);
            }
            let items = &mut items[b * BATCH * stride..];
            mapper.do_rule_batch(
                &mut ws,
                rule,
                &xs[..lens.len()],
                result_max,
                weights,
                &mut out,
                |i, got| {
                    lens[i] = got.len() as u32;
                    items[i * stride..i * stride + got.len()].copy_from_slice(got);
                },
            )?;
        }
        Ok(())
    };
    if threads == 1 || stride == 0 {
        run(0, &mut lens, &mut items)?;
    } else {
        std::thread::scope(|s| -> Result<(), CrushError> {
            let mut handles = Vec::new();
            for (k, (l, it)) in lens
                .chunks_mut(per)
                .zip(items.chunks_mut(per * stride))
                .enumerate()
            {
                let run = &run;
                handles.push(s.spawn(move || run(k * per, l, it)));
            }
            for h in handles {
                match h.join() {
                    Ok(r) => r?,
                    Err(p) => std::panic::resume_unwind(p),
                }
            }
            Ok(())
        })?;
    }
    Ok(BatchResult {
        x_first: first,
        stride,
        lens,
        items,
    })
}
