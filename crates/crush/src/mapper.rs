//! The CRUSH mapping algorithm, step for step as Ceph's `crush_do_rule` runs it: the five
//! bucket choose functions, the permutation fallback, the out-device test, `choose`/`chooseleaf`
//! in `firstn` (depth-first, retrying on collision or rejection) and `indep` (breadth-first,
//! positionally stable, holes as [`ITEM_NONE`]) modes, every tunable and `set_*` rule step,
//! and straw2 `choose_args` weight sets.
//!
//! A [`Mapper`] borrows a validated [`CrushMap`]; a [`Workspace`] holds the per-bucket
//! permutation state and scratch vectors, one per thread, reused across calls.

use crate::error::CrushError;
use crate::hash::{
    hash32_2, hash32_3_lanes, hash32_3_lanes_ab, typed_hash32_3, typed_hash32_4, LANES,
};
use crate::ln::crush_ln;
use crate::map::{
    op, Bucket, BucketKind, ChooseArg, CrushMap, ALG_UNIFORM, ITEM_NONE, ITEM_UNDEF, MAX_REP,
};

/// Per-bucket permutation state (`crush_work_bucket`).
#[derive(Debug, Clone, Default)]
struct Perm {
    x: u32,
    n: u32,
    perm: Vec<u32>,
}

/// Scratch state for mapping; one per thread.
#[derive(Debug, Clone, Default)]
pub struct Workspace {
    perms: Vec<Perm>,
    a: Vec<i32>,
    b: Vec<i32>,
    c: Vec<i32>,
    /// [`Mapper::do_rule_batch`]'s draws made ahead, boxed: most workspaces never batch.
    memos: Option<Box<Memos>>,
}

/// Inputs whose straw2 draws [`Mapper::do_rule_batch`] makes together, one SIMD lane each.
pub const XLANES: usize = 8;
/// Largest bucket drawn ahead (larger ones are left to the mapper).
const SPEC_MAX_ITEMS: usize = 64;
/// Deepest descent drawn ahead.
const SPEC_MAX_DEPTH: usize = 8;
/// Draws kept per input.
const MEMO_MAX: usize = 32;

/// One straw2 draw made ahead: bucket `bucket` gave `item` for replica number `r` (of the
/// lane's input).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Memo {
    bucket: i32,
    r: u32,
    item: i32,
}

/// The draws made ahead for up to [`XLANES`] inputs, and the hashes of the level being drawn
/// (`hs[j][lane]`: item `j` of the lane's bucket), kept here so no batch re-zeroes them.
#[derive(Debug, Clone)]
struct Memos {
    entries: [[Memo; MEMO_MAX]; XLANES],
    lens: [usize; XLANES],
    hs: [[u32; XLANES]; SPEC_MAX_ITEMS],
}

impl Default for Memos {
    fn default() -> Memos {
        Memos {
            entries: [[Memo::default(); MEMO_MAX]; XLANES],
            lens: [0; XLANES],
            hs: [[0; XLANES]; SPEC_MAX_ITEMS],
        }
    }
}

impl Workspace {
    /// An empty workspace; it sizes itself on first use.
    pub fn new() -> Workspace {
        Workspace::default()
    }
}

/// Exact `a / w` for `a < 2^50` and a 32-bit `w` through one multiplication (Granlund and
/// Montgomery's invariant-divisor method: `m = ceil(2^(49+l) / w)` with `2^(l-1) < w <= 2^l`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recip {
    m: u64,
    shift: u32,
}

impl Recip {
    fn new(w: u32) -> Recip {
        let l = if w <= 1 {
            0
        } else {
            32 - (w - 1).leading_zeros()
        };
        let shift = 49 + l;
        let m = (1u128 << shift).div_ceil(w.max(1) as u128);
        Recip { m: m as u64, shift }
    }

    #[inline(always)]
    fn div(self, a: u64) -> u64 {
        ((a as u128 * self.m as u128) >> self.shift) as u64
    }
}

/// A straw2 bucket prepared for the fast path: ids padded to whole SIMD lanes and one
/// reciprocal per weight (`None` for weight 0).
#[derive(Debug, Clone)]
struct Straw2Fast {
    ids: Vec<u32>,
    recips: Vec<Option<Recip>>,
    /// The weight every item has, where all are equal, non-zero and at most
    /// [`EQUAL_MAX_ITEMS`] (the draw is then decided without a logarithm per item).
    equal: Option<u64>,
}

/// Buckets up to this size hash item by item (independent scalar chains the CPU overlaps)
/// rather than in eight lanes.
const SCALAR_MAX_ITEMS: usize = 4;

/// Largest bucket [`straw2_equal`] takes (its hashes live in a stack array).
const EQUAL_MAX_ITEMS: usize = 64;

/// Maps inputs through one map's rules.
#[derive(Debug, Clone)]
pub struct Mapper<'a> {
    map: &'a CrushMap,
    choose_args: Option<&'a [ChooseArg]>,
    /// Per bucket index: the fast straw2 form, where the bucket is straw2, hashes with
    /// rjenkins1 and has no choose_args of its own.
    fast: Vec<Option<Straw2Fast>>,
    /// The CPU has AVX2: the fast straw2 path runs its eight lanes in one register.
    avx2: bool,
}

/// The one place this crate uses `unsafe`: calling the straw2 fast path compiled for AVX2,
/// which is only done after the CPU was seen to support it.
#[allow(unsafe_code)]
mod simd {
    use super::{straw2_fast, Mapper, Memos, Straw2Fast, XLANES};

    /// Whether the AVX2 build of the fast path may run on this CPU.
    pub(super) fn avx2_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn straw2_avx2(f: &Straw2Fast, x: u32, r: u32, items: &[i32]) -> i32 {
        straw2_fast(f, x, r, items)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn speculate_avx2(
        m: &Mapper<'_>,
        take: usize,
        xs: &[u32; XLANES],
        count: usize,
        reps: u32,
        memos: &mut Memos,
    ) {
        m.speculate(take, xs, count, reps, memos)
    }

    /// [`Mapper::speculate`] compiled with AVX2 enabled; callers check [`avx2_available`]
    /// first.
    #[inline]
    pub(super) fn speculate_with_avx2(
        m: &Mapper<'_>,
        take: usize,
        xs: &[u32; XLANES],
        count: usize,
        reps: u32,
        memos: &mut Memos,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            debug_assert!(avx2_available());
            // SAFETY: as for `straw2_fast_avx2`: reached only when the mapper's `avx2` flag,
            // set from `is_x86_feature_detected!("avx2")`, is true; the body is safe Rust.
            unsafe { speculate_avx2(m, take, xs, count, reps, memos) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            m.speculate(take, xs, count, reps, memos)
        }
    }

    /// [`straw2_fast`] compiled with AVX2 enabled; callers check [`avx2_available`] first.
    #[inline]
    pub(super) fn straw2_fast_avx2(f: &Straw2Fast, x: u32, r: u32, items: &[i32]) -> i32 {
        #[cfg(target_arch = "x86_64")]
        {
            debug_assert!(avx2_available());
            // SAFETY: the mapper sets its `avx2` flag (the only way here) from
            // `is_x86_feature_detected!("avx2")`, so the CPU executes AVX2 instructions; the
            // function itself is safe Rust with no other precondition.
            unsafe { straw2_avx2(f, x, r, items) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            straw2_fast(f, x, r, items)
        }
    }
}

struct Params<'w> {
    weights: &'w [u32],
    x: i32,
    /// Straw2 draws for this `x` made ahead by [`Mapper::do_rule_batch`] (empty otherwise).
    memo: &'w [Memo],
}

impl<'a> Mapper<'a> {
    fn build(map: &'a CrushMap, choose_args: Option<&'a [ChooseArg]>) -> Mapper<'a> {
        let fast = map
            .buckets
            .iter()
            .enumerate()
            .map(|(idx, b)| {
                let b = b.as_ref()?;
                let BucketKind::Straw2 { item_weights } = &b.kind else {
                    return None;
                };
                if b.hash != crate::hash::HASH_RJENKINS1 {
                    return None;
                }
                if let Some(arg) = choose_args.and_then(|a| a.get(idx)) {
                    if !arg.weight_set.is_empty() || !arg.ids.is_empty() {
                        return None;
                    }
                }
                let mut ids: Vec<u32> = b.items.iter().map(|&i| i as u32).collect();
                ids.resize(b.items.len().div_ceil(LANES) * LANES, 0);
                let recips = item_weights
                    .iter()
                    .map(|&w| (w != 0).then(|| Recip::new(w)))
                    .collect();
                let equal = (b.items.len() <= EQUAL_MAX_ITEMS
                    && item_weights.first().is_some_and(|&w| w != 0)
                    && item_weights.iter().all(|&w| w == item_weights[0]))
                .then(|| item_weights[0] as u64);
                Some(Straw2Fast { ids, recips, equal })
            })
            .collect();
        Mapper {
            map,
            choose_args,
            fast,
            avx2: simd::avx2_available(),
        }
    }

    /// The same mapper without the AVX2 path (for comparing the two; results are equal).
    pub fn without_avx2(mut self) -> Mapper<'a> {
        self.avx2 = false;
        self
    }

    /// A mapper with no `choose_args` (each straw2 bucket's own weights).
    pub fn new(map: &'a CrushMap) -> Mapper<'a> {
        Mapper::build(map, None)
    }

    /// A mapper with the `choose_args` that `crushtool --test` uses (set 0, else the default
    /// set), if the map has any.
    pub fn for_test(map: &'a CrushMap) -> Mapper<'a> {
        Mapper::build(map, map.test_choose_args())
    }

    /// A mapper with a given `choose_args` set (one entry per bucket index).
    pub fn with_choose_args(
        map: &'a CrushMap,
        args: &'a [ChooseArg],
    ) -> Result<Mapper<'a>, CrushError> {
        if args.len() != map.buckets.len() {
            return Err(CrushError::Invalid(format!(
                "choose_args has {} entries for {} buckets",
                args.len(),
                map.buckets.len()
            )));
        }
        Ok(Mapper::build(map, Some(args)))
    }

    /// The map.
    pub fn map(&self) -> &'a CrushMap {
        self.map
    }

    #[inline]
    fn bucket_at(&self, idx: usize) -> Option<&'a Bucket> {
        self.map.buckets.get(idx).and_then(|b| b.as_ref())
    }

    #[inline]
    fn bucket_of(&self, item: i32) -> Option<&'a Bucket> {
        if item >= 0 {
            return None;
        }
        self.bucket_at((-1i64 - item as i64) as usize)
    }

    /// Runs rule `rule` for input `x`, producing at most `result_max` items into `out`
    /// (cleared first), with per-device weights `weights` (16.16; index = device id; devices
    /// past its end are out). A rule that does not exist gives [`CrushError::NoSuchRule`].
    pub fn do_rule(
        &self,
        ws: &mut Workspace,
        rule: u32,
        x: i32,
        result_max: usize,
        weights: &[u32],
        out: &mut Vec<i32>,
    ) -> Result<(), CrushError> {
        self.run_rule(ws, rule, x, result_max, weights, &[], out)
    }

    /// [`Mapper::do_rule`] for every input of `xs`, calling `emit(i, mapping of xs[i])` in
    /// order; the same results. Where the rule starts by taking a straw2 bucket, the draws
    /// each replica number `r < numrep` of the first choose step would make on its way down
    /// from that bucket are made ahead for [`XLANES`] inputs at once, one input per SIMD lane
    /// (the hashing across inputs; the pick from the hashes per input), and the mapper takes
    /// them from there when it asks for the same bucket and `r`. A draw depends on the
    /// bucket, `x` and `r` alone, so whatever the mapper asks that was not made ahead (a retry
    /// past those `r`, tunables that vary `r` otherwise) it draws itself.
    #[allow(clippy::too_many_arguments)]
    pub fn do_rule_batch(
        &self,
        ws: &mut Workspace,
        rule: u32,
        xs: &[i32],
        result_max: usize,
        weights: &[u32],
        out: &mut Vec<i32>,
        mut emit: impl FnMut(usize, &[i32]),
    ) -> Result<(), CrushError> {
        let Some(plan) = self.map.rule(rule).and_then(|r| self.plan(r, result_max)) else {
            for (i, &x) in xs.iter().enumerate() {
                self.run_rule(ws, rule, x, result_max, weights, &[], out)?;
                emit(i, out);
            }
            return Ok(());
        };
        let mut memos = ws.memos.take().unwrap_or_default();
        let mut result = Ok(());
        'chunks: for (c, chunk) in xs.chunks(XLANES).enumerate() {
            let mut lanes = [0u32; XLANES];
            for (l, &x) in lanes.iter_mut().zip(chunk) {
                *l = x as u32;
            }
            let (take, reps) = plan;
            if self.avx2 {
                simd::speculate_with_avx2(self, take, &lanes, chunk.len(), reps, &mut memos);
            } else {
                self.speculate(take, &lanes, chunk.len(), reps, &mut memos);
            }
            for (l, &x) in chunk.iter().enumerate() {
                let memo = &memos.entries[l][..memos.lens[l]];
                if let Err(e) = self.run_rule(ws, rule, x, result_max, weights, memo, out) {
                    result = Err(e);
                    break 'chunks;
                }
                emit(c * XLANES + l, out);
            }
        }
        ws.memos = Some(memos);
        result
    }

    /// What [`Mapper::do_rule_batch`] draws ahead for `rule`: the bucket index its first step
    /// takes (a straw2 bucket on the fast path) and how many replica numbers its first choose
    /// step starts with.
    fn plan(&self, rule: &crate::map::Rule, result_max: usize) -> Option<(usize, u32)> {
        let take = rule.steps.first().filter(|s| s.op == op::TAKE)?.arg1;
        let idx = usize::try_from(-1i64 - take as i64).ok()?;
        self.fast.get(idx)?.as_ref()?;
        let choose = rule.steps.get(1).filter(|s| {
            matches!(
                s.op,
                op::CHOOSE_FIRSTN | op::CHOOSELEAF_FIRSTN | op::CHOOSE_INDEP | op::CHOOSELEAF_INDEP
            )
        })?;
        let mut numrep = choose.arg1;
        if numrep <= 0 {
            numrep = numrep.wrapping_add(result_max as i32);
        }
        let reps = u32::try_from(numrep).ok()?.min(MAX_REP as u32);
        (reps > 0).then_some((idx, reps))
    }

    /// Makes the straw2 draws of replica numbers `0..reps` for the first `count` inputs of
    /// `xs`, from bucket index `take` down while the buckets are on the fast path and at most
    /// [`SPEC_MAX_ITEMS`] large: one lane per input, each lane in its own bucket after the
    /// first level, item `j` of every lane's bucket hashed in one vector.
    #[inline(always)]
    fn speculate(
        &self,
        take: usize,
        xs: &[u32; XLANES],
        count: usize,
        reps: u32,
        memos: &mut Memos,
    ) {
        memos.lens = [0; XLANES];
        for r in 0..reps {
            let mut cur: [Option<usize>; XLANES] = [None; XLANES];
            for c in cur.iter_mut().take(count) {
                *c = Some(take);
            }
            for _ in 0..SPEC_MAX_DEPTH {
                let mut fs: [Option<(&Straw2Fast, &Bucket)>; XLANES] = [None; XLANES];
                let mut n_max = 0;
                for (f, c) in fs.iter_mut().zip(&cur) {
                    let Some(idx) = *c else { continue };
                    if let (Some(Some(fast)), Some(b)) = (self.fast.get(idx), self.bucket_at(idx)) {
                        let n = fast.recips.len();
                        if n > 0 && n <= SPEC_MAX_ITEMS {
                            *f = Some((fast, b));
                            n_max = n_max.max(n);
                        }
                    }
                }
                if n_max == 0 {
                    break;
                }
                for j in 0..n_max {
                    let mut ids = [0u32; XLANES];
                    for (id, f) in ids.iter_mut().zip(&fs) {
                        if let Some((fast, _)) = f {
                            *id = fast.ids.get(j).copied().unwrap_or(0);
                        }
                    }
                    memos.hs[j] = hash32_3_lanes_ab(xs, &ids, r);
                }
                for (l, (f, c)) in fs.iter().zip(cur.iter_mut()).enumerate() {
                    let Some((fast, b)) = *f else {
                        *c = None;
                        continue;
                    };
                    let n = fast.recips.len();
                    let hs = &memos.hs;
                    let pick = match fast.equal {
                        Some(w) => equal_pick(n, |j| hs[j][l] & 0xffff, w),
                        None => weighted_pick(&fast.recips, |j| hs[j][l]),
                    };
                    let item = b.items[pick];
                    let len = memos.lens[l];
                    if len < MEMO_MAX {
                        memos.entries[l][len] = Memo {
                            bucket: b.id,
                            r,
                            item,
                        };
                        memos.lens[l] = len + 1;
                    }
                    *c = if item < 0 {
                        usize::try_from(-1i64 - item as i64).ok()
                    } else {
                        None
                    };
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run_rule(
        &self,
        ws: &mut Workspace,
        rule: u32,
        x: i32,
        result_max: usize,
        weights: &[u32],
        memo: &[Memo],
        out: &mut Vec<i32>,
    ) -> Result<(), CrushError> {
        out.clear();
        if result_max > MAX_REP {
            return Err(CrushError::TooLarge {
                what: "result size",
                value: result_max as u64,
                max: MAX_REP as u64,
            });
        }
        let Some(rule) = self.map.rule(rule) else {
            return Err(CrushError::NoSuchRule(rule));
        };
        let map = self.map;
        let nb = map.buckets.len();
        if ws.perms.len() != nb {
            ws.perms = vec![Perm::default(); nb];
        }
        let scratch = result_max.max(1);
        for v in [&mut ws.a, &mut ws.b, &mut ws.c] {
            if v.len() < scratch {
                v.resize(scratch, 0);
            }
        }
        let t = &map.tunables;
        let mut choose_tries: u32 = t.choose_total_tries.wrapping_add(1);
        let mut choose_leaf_tries: u32 = 0;
        let mut local_retries: u32 = t.choose_local_tries;
        let mut local_fallback_retries: u32 = t.choose_local_fallback_tries;
        let mut vary_r: u32 = t.chooseleaf_vary_r as u32;
        let mut stable: u32 = t.chooseleaf_stable as u32;
        let p = Params { weights, x, memo };

        let Workspace { perms, a, b, c, .. } = ws;
        let (mut w, mut o): (&mut Vec<i32>, &mut Vec<i32>) = (a, b);
        let mut wsize = 0usize;

        for step in &rule.steps {
            match step.op {
                op::TAKE => {
                    let a1 = step.arg1;
                    if (a1 >= 0 && a1 < map.max_devices) || self.bucket_of(a1).is_some() {
                        w[0] = a1;
                        wsize = 1;
                    }
                }
                op::SET_CHOOSE_TRIES if step.arg1 > 0 => {
                    choose_tries = step.arg1 as u32;
                }
                op::SET_CHOOSELEAF_TRIES if step.arg1 > 0 => {
                    choose_leaf_tries = step.arg1 as u32;
                }
                op::SET_CHOOSE_LOCAL_TRIES if step.arg1 >= 0 => {
                    local_retries = step.arg1 as u32;
                }
                op::SET_CHOOSE_LOCAL_FALLBACK_TRIES if step.arg1 >= 0 => {
                    local_fallback_retries = step.arg1 as u32;
                }
                op::SET_CHOOSELEAF_VARY_R if step.arg1 >= 0 => {
                    vary_r = step.arg1 as u32;
                }
                op::SET_CHOOSELEAF_STABLE if step.arg1 >= 0 => {
                    stable = step.arg1 as u32;
                }
                op::CHOOSE_FIRSTN
                | op::CHOOSELEAF_FIRSTN
                | op::CHOOSE_INDEP
                | op::CHOOSELEAF_INDEP => {
                    if wsize == 0 {
                        continue;
                    }
                    let firstn = step.op == op::CHOOSE_FIRSTN || step.op == op::CHOOSELEAF_FIRSTN;
                    let recurse_to_leaf =
                        step.op == op::CHOOSELEAF_FIRSTN || step.op == op::CHOOSELEAF_INDEP;
                    let mut osize = 0usize;
                    for &wi in w.iter().take(wsize) {
                        let mut numrep = step.arg1;
                        if numrep <= 0 {
                            numrep = numrep.wrapping_add(result_max as i32);
                            if numrep <= 0 {
                                continue;
                            }
                        }
                        let Some(bucket) = self.bucket_of(wi) else {
                            continue;
                        };
                        let room = result_max - osize;
                        if firstn {
                            let recurse_tries = if choose_leaf_tries != 0 {
                                choose_leaf_tries
                            } else if t.chooseleaf_descend_once != 0 {
                                1
                            } else {
                                choose_tries
                            };
                            let got = self.choose_firstn(
                                perms,
                                &p,
                                bucket,
                                numrep,
                                step.arg2,
                                &mut o[osize..],
                                0,
                                room as i32,
                                choose_tries,
                                recurse_tries,
                                local_retries,
                                local_fallback_retries,
                                recurse_to_leaf,
                                vary_r,
                                stable,
                                Some(&mut c[osize..]),
                                0,
                            );
                            osize += got;
                        } else {
                            let out_size = (numrep as usize).min(room);
                            self.choose_indep(
                                perms,
                                &p,
                                bucket,
                                out_size as i32,
                                numrep,
                                step.arg2,
                                &mut o[osize..],
                                0,
                                choose_tries,
                                if choose_leaf_tries != 0 {
                                    choose_leaf_tries
                                } else {
                                    1
                                },
                                recurse_to_leaf,
                                Some(&mut c[osize..]),
                                0,
                            );
                            osize += out_size;
                        }
                    }
                    if recurse_to_leaf {
                        o[..osize].copy_from_slice(&c[..osize]);
                    }
                    std::mem::swap(&mut w, &mut o);
                    wsize = osize;
                }
                op::EMIT => {
                    for &item in w.iter().take(wsize) {
                        if out.len() >= result_max {
                            break;
                        }
                        out.push(item);
                    }
                    wsize = 0;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `bucket_perm_choose`: item `r mod size` of a permutation of the bucket drawn from `x`.
    fn perm_choose(&self, perms: &mut [Perm], b: &Bucket, x: i32, r: i32) -> i32 {
        let size = b.items.len() as u32;
        let idx = (-1i64 - b.id as i64) as usize;
        let st = &mut perms[idx];
        let pr = (r as u32) % size;
        let id = b.id as u32;
        if st.x != x as u32 || st.n == 0 {
            st.x = x as u32;
            if st.perm.len() != size as usize {
                st.perm = vec![0; size as usize];
            }
            if pr == 0 {
                let s = typed_hash32_3(b.hash, x as u32, id, 0) % size;
                st.perm[0] = s;
                st.n = 0xffff;
                return b.items[s as usize];
            }
            for (i, v) in st.perm.iter_mut().enumerate() {
                *v = i as u32;
            }
            st.n = 0;
        } else if st.n == 0xffff {
            for i in 1..size as usize {
                st.perm[i] = i as u32;
            }
            let first = st.perm[0] as usize;
            st.perm[first] = 0;
            st.n = 1;
        }
        while st.n <= pr {
            let p = st.n;
            if p < size - 1 {
                let i = typed_hash32_3(b.hash, x as u32, id, p) % (size - p);
                if i != 0 {
                    st.perm.swap((p + i) as usize, p as usize);
                }
            }
            st.n += 1;
        }
        b.items[st.perm[pr as usize] as usize]
    }

    /// `crush_bucket_choose`: one item of a non-empty bucket for `(x, r)`.
    #[inline]
    fn bucket_choose(
        &self,
        perms: &mut [Perm],
        b: &Bucket,
        x: i32,
        r: i32,
        position: usize,
        memo: &[Memo],
    ) -> i32 {
        let xu = x as u32;
        let ru = r as u32;
        match &b.kind {
            BucketKind::Uniform { .. } => self.perm_choose(perms, b, x, r),
            BucketKind::List {
                item_weights,
                sum_weights,
            } => {
                let id = b.id as u32;
                for i in (0..b.items.len()).rev() {
                    let h = typed_hash32_4(b.hash, xu, b.items[i] as u32, ru, id) as u64 & 0xffff;
                    let w = (h * sum_weights[i] as u64) >> 16;
                    if w < item_weights[i] as u64 {
                        return b.items[i];
                    }
                }
                b.items[0]
            }
            BucketKind::Tree { node_weights } => {
                let id = b.id as u32;
                let mut n = node_weights.len() >> 1;
                while n & 1 == 0 && n != 0 {
                    let h = n.trailing_zeros();
                    let w = node_weights[n] as u64;
                    let t = (typed_hash32_4(b.hash, xu, n as u32, ru, id) as u64 * w) >> 32;
                    let l = n - (1 << (h - 1));
                    if t < node_weights[l] as u64 {
                        n = l;
                    } else {
                        n += 1 << (h - 1);
                    }
                }
                // A well-formed tree only reaches leaves of real items. Ceph's shadow trees
                // (device classes over tree buckets) are encoded with uninitialised node
                // weights and can descend to a leaf past the last item; Ceph then reads past
                // its zero-filled (calloc) item array and gets 0, device 0. The same value is
                // returned here; further past the array Ceph's result is undefined.
                b.items.get(n >> 1).copied().unwrap_or(0)
            }
            BucketKind::Straw {
                item_weights: _,
                straws,
            } => {
                let mut high = 0usize;
                let mut high_draw = 0u64;
                for (i, (&item, &straw)) in b.items.iter().zip(straws).enumerate() {
                    let d = (typed_hash32_3(b.hash, xu, item as u32, ru) as u64 & 0xffff)
                        * straw as u64;
                    if i == 0 || d > high_draw {
                        high = i;
                        high_draw = d;
                    }
                }
                b.items[high]
            }
            BucketKind::Straw2 { item_weights } => {
                if let Some(Some(f)) = self.fast.get((-1i64 - b.id as i64) as usize) {
                    if let Some(m) = memo.iter().find(|m| m.bucket == b.id && m.r == ru) {
                        return m.item;
                    }
                    return if self.avx2 {
                        simd::straw2_fast_avx2(f, xu, ru, &b.items)
                    } else {
                        straw2_fast(f, xu, ru, &b.items)
                    };
                }
                let (weights, ids): (&[u32], &[i32]) = match self.choose_args {
                    Some(args) => {
                        let arg = &args[(-1i64 - b.id as i64) as usize];
                        let weights = if arg.weight_set.is_empty() {
                            item_weights.as_slice()
                        } else {
                            let pos = position.min(arg.weight_set.len() - 1);
                            arg.weight_set[pos].as_slice()
                        };
                        let ids = if arg.ids.is_empty() {
                            b.items.as_slice()
                        } else {
                            arg.ids.as_slice()
                        };
                        (weights, ids)
                    }
                    None => (item_weights.as_slice(), b.items.as_slice()),
                };
                straw2_choose(b.hash, xu, ru, weights, ids, &b.items)
            }
        }
    }

    #[inline]
    fn item_type(&self, item: i32) -> Option<i32> {
        if item >= 0 {
            Some(0)
        } else {
            self.bucket_of(item).map(|b| b.bucket_type as i32)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn choose_firstn(
        &self,
        perms: &mut [Perm],
        p: &Params<'_>,
        bucket: &'a Bucket,
        numrep: i32,
        ty: i32,
        out: &mut [i32],
        mut outpos: usize,
        out_size: i32,
        tries: u32,
        recurse_tries: u32,
        local_retries: u32,
        local_fallback_retries: u32,
        recurse_to_leaf: bool,
        vary_r: u32,
        stable: u32,
        mut out2: Option<&mut [i32]>,
        parent_r: i32,
    ) -> usize {
        let x = p.x;
        let mut count = out_size;
        let mut rep: i32 = if stable != 0 { 0 } else { outpos as i32 };
        while rep < numrep && count > 0 {
            let mut ftotal: u32 = 0;
            let mut skip_rep = false;
            let mut item: i32 = 0;
            loop {
                // descent
                let mut retry_descent = false;
                let mut inb: &'a Bucket = bucket;
                let mut flocal: u32 = 0;
                loop {
                    // bucket
                    let mut collide = false;
                    let mut retry_bucket = false;
                    let r = rep.wrapping_add(parent_r).wrapping_add(ftotal as i32);
                    let reject;
                    let size = inb.items.len() as u32;
                    if size == 0 {
                        reject = true;
                    } else {
                        item = if local_fallback_retries > 0
                            && flocal >= (size >> 1)
                            && flocal > local_fallback_retries
                        {
                            self.perm_choose(perms, inb, x, r)
                        } else {
                            self.bucket_choose(perms, inb, x, r, outpos, p.memo)
                        };
                        if item >= self.map.max_devices {
                            skip_rep = true;
                            break;
                        }
                        let Some(itemtype) = self.item_type(item) else {
                            skip_rep = true;
                            break;
                        };
                        if itemtype != ty {
                            match self.bucket_of(item) {
                                Some(nb) if item < 0 => {
                                    inb = nb;
                                    continue;
                                }
                                _ => {
                                    skip_rep = true;
                                    break;
                                }
                            }
                        }
                        collide = out[..outpos].contains(&item);
                        let mut rej = false;
                        if !collide && recurse_to_leaf {
                            if item < 0 {
                                let sub_r = if vary_r != 0 {
                                    r.wrapping_shr(vary_r - 1)
                                } else {
                                    0
                                };
                                let inner = self.bucket_of(item);
                                let got = match (inner, out2.as_deref_mut()) {
                                    (Some(inner), Some(o2)) => self.choose_firstn(
                                        perms,
                                        p,
                                        inner,
                                        if stable != 0 { 1 } else { outpos as i32 + 1 },
                                        0,
                                        o2,
                                        outpos,
                                        count,
                                        recurse_tries,
                                        0,
                                        local_retries,
                                        local_fallback_retries,
                                        false,
                                        vary_r,
                                        stable,
                                        None,
                                        sub_r,
                                    ),
                                    _ => 0,
                                };
                                if got <= outpos {
                                    rej = true;
                                }
                            } else if let Some(o2) = out2.as_deref_mut() {
                                o2[outpos] = item;
                            }
                        }
                        if !rej && itemtype == 0 {
                            rej = is_out(p.weights, item, x);
                        }
                        reject = rej;
                    }
                    if reject || collide {
                        ftotal = ftotal.wrapping_add(1);
                        flocal = flocal.wrapping_add(1);
                        // Retry in this bucket after a collision (a few times), or for an
                        // exhaustive local search; else descend again from the top; else give
                        // up on this position.
                        if (collide && flocal <= local_retries)
                            || (local_fallback_retries > 0
                                && flocal <= size.wrapping_add(local_fallback_retries))
                        {
                            retry_bucket = true;
                        } else if ftotal < tries {
                            retry_descent = true;
                        } else {
                            skip_rep = true;
                        }
                    }
                    if !retry_bucket {
                        break;
                    }
                }
                if !retry_descent {
                    break;
                }
            }
            if !skip_rep {
                out[outpos] = item;
                outpos += 1;
                count -= 1;
            }
            rep += 1;
        }
        outpos
    }

    #[allow(clippy::too_many_arguments)]
    fn choose_indep(
        &self,
        perms: &mut [Perm],
        p: &Params<'_>,
        bucket: &'a Bucket,
        mut left: i32,
        numrep: i32,
        ty: i32,
        out: &mut [i32],
        outpos: usize,
        tries: u32,
        recurse_tries: u32,
        recurse_to_leaf: bool,
        mut out2: Option<&mut [i32]>,
        parent_r: i32,
    ) {
        let x = p.x;
        let endpos = outpos + left.max(0) as usize;
        for rep in outpos..endpos {
            out[rep] = ITEM_UNDEF;
            if let Some(o2) = out2.as_deref_mut() {
                o2[rep] = ITEM_UNDEF;
            }
        }
        let mut ftotal: u32 = 0;
        while left > 0 && ftotal < tries {
            for rep in outpos..endpos {
                if out[rep] != ITEM_UNDEF {
                    continue;
                }
                let mut inb: &'a Bucket = bucket;
                loop {
                    let mut r = (rep as i32).wrapping_add(parent_r);
                    let size = inb.items.len() as u32;
                    if inb.kind.alg() == ALG_UNIFORM && size.checked_rem(numrep as u32) == Some(0) {
                        r = r.wrapping_add(
                            (numrep.wrapping_add(1) as u32).wrapping_mul(ftotal) as i32
                        );
                    } else {
                        r = r.wrapping_add((numrep as u32).wrapping_mul(ftotal) as i32);
                    }
                    if size == 0 {
                        break;
                    }
                    let item = self.bucket_choose(perms, inb, x, r, outpos, p.memo);
                    if item >= self.map.max_devices {
                        out[rep] = ITEM_NONE;
                        if let Some(o2) = out2.as_deref_mut() {
                            o2[rep] = ITEM_NONE;
                        }
                        left -= 1;
                        break;
                    }
                    let itemtype = self.item_type(item);
                    if itemtype != Some(ty) {
                        match self.bucket_of(item) {
                            Some(nb) if item < 0 => {
                                inb = nb;
                                continue;
                            }
                            _ => {
                                out[rep] = ITEM_NONE;
                                if let Some(o2) = out2.as_deref_mut() {
                                    o2[rep] = ITEM_NONE;
                                }
                                left -= 1;
                                break;
                            }
                        }
                    }
                    if out[outpos..endpos].contains(&item) {
                        break;
                    }
                    if recurse_to_leaf {
                        if let Some(o2) = out2.as_deref_mut() {
                            if item < 0 {
                                if let Some(inner) = self.bucket_of(item) {
                                    self.choose_indep(
                                        perms,
                                        p,
                                        inner,
                                        1,
                                        numrep,
                                        0,
                                        o2,
                                        rep,
                                        recurse_tries,
                                        0,
                                        false,
                                        None,
                                        r,
                                    );
                                }
                                if o2[rep] == ITEM_NONE {
                                    break;
                                }
                            } else {
                                o2[rep] = item;
                            }
                        }
                    }
                    if itemtype == Some(0) && is_out(p.weights, item, x) {
                        break;
                    }
                    out[rep] = item;
                    left -= 1;
                    break;
                }
            }
            ftotal = ftotal.wrapping_add(1);
        }
        for rep in outpos..endpos {
            if out[rep] == ITEM_UNDEF {
                out[rep] = ITEM_NONE;
            }
            if let Some(o2) = out2.as_deref_mut() {
                if o2[rep] == ITEM_UNDEF {
                    o2[rep] = ITEM_NONE;
                }
            }
        }
    }
}

/// straw2: the item with the largest `ln(u) / weight` draw; zero weights never win unless
/// every weight is zero (then the first item).
#[inline]
fn straw2_choose(hash: u8, x: u32, r: u32, weights: &[u32], ids: &[i32], items: &[i32]) -> i32 {
    let mut high = 0usize;
    let mut high_draw = 0i64;
    for (i, (&w, &id)) in weights.iter().zip(ids).enumerate() {
        let draw = if w != 0 {
            let u = typed_hash32_3(hash, x, id as u32, r) & 0xffff;
            let ln = crush_ln(u).wrapping_sub(0x1_0000_0000_0000) as i64;
            ln / w as i64
        } else {
            i64::MIN
        };
        if i == 0 || draw > high_draw {
            high = i;
            high_draw = draw;
        }
    }
    items[high]
}

/// straw2 on the prepared form: hashes eight items at a time, divides by reciprocal
/// multiplication; the same draws, the same winner as [`straw2_choose`].
#[inline(always)]
fn straw2_fast(f: &Straw2Fast, x: u32, r: u32, items: &[i32]) -> i32 {
    if let Some(w) = f.equal {
        return straw2_equal(f, w, x, r, items);
    }
    let mut high = 0usize;
    let mut high_draw = 0i64;
    for (c, chunk) in f.ids.chunks_exact(LANES).enumerate() {
        let mut lane = [0u32; LANES];
        lane.copy_from_slice(chunk);
        let h = hash32_3_lanes(x, &lane, r);
        let base = c * LANES;
        for (j, &hj) in h.iter().enumerate() {
            let i = base + j;
            let Some(recip) = f.recips.get(i) else {
                break;
            };
            let draw = weighted_draw(recip, hj);
            if i == 0 || draw > high_draw {
                high = i;
                high_draw = draw;
            }
        }
    }
    items[high]
}

/// One item's straw2 draw from its hash: `(crush_ln(u) - 2^48) / weight`, `i64::MIN` for
/// weight 0.
#[inline(always)]
fn weighted_draw(recip: &Option<Recip>, h: u32) -> i64 {
    match recip {
        Some(recip) => {
            let ln = crush_ln(h & 0xffff) as i64 - 0x1_0000_0000_0000;
            if ln < 0 {
                -(recip.div(ln.unsigned_abs()) as i64)
            } else {
                recip.div(ln as u64) as i64
            }
        }
        None => i64::MIN,
    }
}

/// The index [`straw2_fast`] picks, from item `i`'s hash `h(i)`.
#[inline(always)]
fn weighted_pick(recips: &[Option<Recip>], h: impl Fn(usize) -> u32) -> usize {
    let mut high = 0usize;
    let mut high_draw = 0i64;
    for (i, recip) in recips.iter().enumerate() {
        let draw = weighted_draw(recip, h(i));
        if i == 0 || draw > high_draw {
            high = i;
            high_draw = draw;
        }
    }
    high
}

/// `crush_ln(0xffff)`: the one input where Ceph's table logarithm steps down (it is below
/// `crush_ln(0xfffe)`); on `0..=0xfffe` it never decreases.
fn ln_top() -> u64 {
    static TOP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOP.get_or_init(|| crush_ln(0xffff))
}

/// `2^48 - crush_ln(u)`: the magnitude straw2 divides by the weight (never negative).
#[inline(always)]
fn ln_gap(u: u32) -> u64 {
    (1u64 << 48) - crush_ln(u)
}

/// straw2 over items of one weight `w`, without a logarithm and a division per item. The
/// draw is `-floor(gap(u) / w)` with `gap(u) = 2^48 - crush_ln(u)` and `u` the hash's low 16
/// bits, and the first item with the highest draw wins. `gap` never increases with `u` on
/// `0..=0xfffe` (checked for every value by a test), so the smallest gap is that of the largest
/// `u` (or of `0xffff`, taken on its own); the winning quotient `q` follows with one division,
/// and an item wins exactly when `gap(u) < (q + 1) w`, which holds for every `u` from a
/// threshold up, found by walking down from the largest `u` (a binary search past a few
/// steps). The winner is then the first item at or over the threshold: the same item
/// [`straw2_choose`] picks.
#[inline(always)]
fn straw2_equal(f: &Straw2Fast, w: u64, x: u32, r: u32, items: &[i32]) -> i32 {
    let n = f.recips.len();
    let mut u = [0u32; EQUAL_MAX_ITEMS];
    if n <= SCALAR_MAX_ITEMS {
        for (slot, &id) in u.iter_mut().zip(&f.ids[..n]) {
            *slot = crate::hash::hash32_3(x, id, r) & 0xffff;
        }
    } else {
        for (c, chunk) in f.ids.chunks_exact(LANES).enumerate() {
            let mut ids = [0u32; LANES];
            ids.copy_from_slice(chunk);
            let h = hash32_3_lanes(x, &ids, r);
            for (j, &hj) in h.iter().enumerate() {
                if let Some(slot) = u.get_mut(c * LANES + j) {
                    *slot = hj & 0xffff;
                }
            }
        }
    }
    items[equal_pick(n, |i| u[i], w)]
}

/// The index [`straw2_equal`] picks among `n` items of weight `w`, from item `i`'s low 16
/// hash bits `u(i)`.
#[inline(always)]
fn equal_pick(n: usize, u: impl Fn(usize) -> u32, w: u64) -> usize {
    let mut umax: Option<u32> = None;
    let mut has_top = false;
    for v in (0..n).map(&u) {
        if v == 0xffff {
            has_top = true;
        } else if umax.is_none_or(|m| v > m) {
            umax = Some(v);
        }
    }
    let gap_min = match (umax, has_top) {
        (Some(m), true) => ln_gap(m).min((1u64 << 48) - ln_top()),
        (Some(m), false) => ln_gap(m),
        (None, _) => (1u64 << 48) - ln_top(),
    };
    let limit = (gap_min / w + 1) * w;
    let top_wins = has_top && (1u64 << 48) - ln_top() < limit;
    // The smallest u in 0..=0xfffe whose gap is under the limit (0x10000: none).
    let mut thr = 0x1_0000u32;
    if let Some(m) = umax {
        if ln_gap(m) < limit {
            thr = m;
            let mut steps = 0;
            while thr > 0 && ln_gap(thr - 1) < limit {
                thr -= 1;
                steps += 1;
                if steps == 4 {
                    // Binary search for the first u in 0..thr with gap < limit.
                    let (mut lo, mut hi) = (0u32, thr);
                    while lo < hi {
                        let mid = lo + (hi - lo) / 2;
                        if ln_gap(mid) < limit {
                            hi = mid;
                        } else {
                            lo = mid + 1;
                        }
                    }
                    thr = lo;
                    break;
                }
            }
        }
    }
    (0..n)
        .map(u)
        .position(|v| if v == 0xffff { top_wins } else { v >= thr })
        .unwrap_or(0)
}

/// Whether device `item` is out for input `x`: weight 0 (or none) is out, 0x10000 and above is
/// in, anything between is in for that fraction of inputs.
#[inline]
fn is_out(weights: &[u32], item: i32, x: i32) -> bool {
    let Some(&w) = weights.get(item as usize) else {
        return true;
    };
    if w >= 0x10000 {
        return false;
    }
    if w == 0 {
        return true;
    }
    (hash32_2(x as u32, item as u32) & 0xffff) >= w
}

#[cfg(test)]
mod tests {
    use super::{straw2_choose, straw2_fast, Recip, Straw2Fast, LANES};
    use crate::ln::crush_ln;

    #[test]
    fn crush_ln_never_decreases_below_0xffff() {
        // straw2_equal relies on it; 0xffff is the one step down, handled on its own.
        for u in 1..=0xfffeu32 {
            assert!(crush_ln(u) >= crush_ln(u - 1), "crush_ln drops at {u}");
        }
        assert!(crush_ln(0xffff) < crush_ln(0xfffe));
    }

    /// A xorshift64 stream from `seed`: cheap, reproducible test inputs.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    #[test]
    fn equal_weight_straw2_picks_what_the_plain_draw_picks() {
        let mut next = xorshift(0x0bad_cafe_dead_beefu64);
        let weights = [1u32, 3, 0x8000, 0x10000, 0x3_0000, 0x64_0000, 0xffff_ffff];
        for round in 0..600 {
            let n = 1 + (next() % 64) as usize;
            let w = if round % 5 == 4 {
                (next() as u32) >> (next() % 32) | 1
            } else {
                weights[round % weights.len()]
            };
            let items: Vec<i32> = (0..n).map(|_| next() as i32).collect();
            let mut ids: Vec<u32> = items.iter().map(|&i| i as u32).collect();
            ids.resize(n.div_ceil(LANES) * LANES, 0);
            let f = Straw2Fast {
                ids,
                recips: vec![Some(Recip::new(w)); n],
                equal: Some(w as u64),
            };
            let ws = vec![w; n];
            for _ in 0..40 {
                let (x, r) = (next() as u32, (next() % 60) as u32);
                assert_eq!(
                    straw2_fast(&f, x, r, &items),
                    straw2_choose(0, x, r, &ws, &items, &items),
                    "n={n} w={w} x={x} r={r}"
                );
            }
        }
    }

    #[test]
    fn reciprocal_division_is_exact() {
        let mut next = xorshift(0x1234_5678_9abc_def0u64);
        let mut ws: Vec<u32> = vec![1, 2, 3, 7, 0x10000, 0xffff, 0x10001, u32::MAX, 0x8000_0000];
        ws.extend((0..200).map(|_| next() as u32 | 1));
        ws.extend(
            (0..200)
                .map(|_| (next() as u32) >> (next() % 32))
                .filter(|&w| w != 0),
        );
        for w in ws {
            let rc = Recip::new(w);
            let mut as_: Vec<u64> = vec![0, 1, w as u64 - 1, w as u64, 1 << 48, (1 << 49) - 1];
            as_.extend((0..300).map(|_| next() % (1 << 49)));
            for a in as_ {
                assert_eq!(rc.div(a), a / w as u64, "a={a} w={w}");
            }
        }
    }
}
