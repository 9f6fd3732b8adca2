//! Request distributions: which record an operation touches. Each draws from a caller-supplied
//! [`Rng`], so a workload seeded the same way picks the same records.
//!
//! - [`Uniform`]: every record in `[lo, hi]` equally likely (YCSB `requestdistribution=uniform`).
//! - [`Zipfian`]: rank `i` (0-based, offset by the base) drawn with probability proportional to
//!   `1 / (i + 1)^θ`, θ = [`ZIPFIAN_CONSTANT`] (0.99) by default, by the rejection-free method of
//!   Gray et al., "Quickly generating billion-record synthetic databases" (SIGMOD 1994), as YCSB's
//!   `ZipfianGenerator` uses it: ζ(n) is computed once, then each draw costs one `powf`. The item
//!   count may grow ([`Zipfian::sample_with_items`]); ζ is then extended incrementally rather
//!   than recomputed, which keeps "latest" cheap while records are inserted. Ranks 0 and 1 are
//!   drawn with their exact probabilities; higher ranks follow Gray's closed-form approximation.
//! - [`ScrambledZipfian`]: YCSB's `requestdistribution=zipfian`. A zipfian rank over 10^10 items
//!   (with YCSB's precomputed ζ for θ = 0.99) is hashed with [`fnv64`] and reduced modulo the
//!   item count, so popular records are scattered over the key space instead of clustered at
//!   the low numbers.
//! - [`SkewedLatest`]: YCSB's `requestdistribution=latest`: a zipfian distance back from the
//!   most recently inserted record, so the newest records are the most popular.

use crate::keys::fnv64;
use crate::rng::Rng;
use crate::Error;

/// YCSB's zipfian constant θ.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// The item count the scrambled zipfian draws ranks from before hashing (YCSB's `ITEM_COUNT`).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;

/// ζ(10^10) for θ = 0.99, precomputed as in YCSB's `ScrambledZipfianGenerator` (`ZETAN`).
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// The partial zeta sum `initial + Σ_{i=from}^{to-1} 1 / (i + 1)^θ`; `zeta(0, n, θ, 0.0)` is
/// ζ(n) = Σ_{i=1}^{n} i^-θ.
pub fn zeta(from: u64, to: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in from..to {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// Uniform over `[lo, hi]`, both inclusive.
#[derive(Debug, Clone)]
pub struct Uniform {
    lo: u64,
    hi: u64,
}

impl Uniform {
    /// Uniform over `[lo, hi]`; an error when `hi < lo`.
    pub fn new(lo: u64, hi: u64) -> Result<Self, Error> {
        if hi < lo {
            return Err(Error::InvalidParameter {
                name: "uniform range",
                reason: format!("upper bound {hi} is below lower bound {lo}"),
            });
        }
        Ok(Uniform { lo, hi })
    }

    /// One draw.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        rng.range_inclusive(self.lo, self.hi)
    }
}

/// Zipfian over `[base, base + items)`, item `base` the most popular (Gray et al.).
#[derive(Debug, Clone)]
pub struct Zipfian {
    base: u64,
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
    second_cut: f64,
}

impl Zipfian {
    /// Zipfian over `[min, max]` with θ = [`ZIPFIAN_CONSTANT`]; computing ζ costs one `powf`
    /// per item.
    pub fn new(min: u64, max: u64) -> Result<Self, Error> {
        Self::with_constant(min, max, ZIPFIAN_CONSTANT)
    }

    /// Zipfian over `[min, max]` with constant `theta`, which must lie in `(0, 1)`.
    pub fn with_constant(min: u64, max: u64, theta: f64) -> Result<Self, Error> {
        let items = Self::check(min, max, theta)?;
        Ok(Self::build(min, items, theta, zeta(0, items, theta, 0.0)))
    }

    /// Zipfian over `[min, max]` with a precomputed `zetan` = ζ(max - min + 1) for `theta`.
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Result<Self, Error> {
        let items = Self::check(min, max, theta)?;
        if !(zetan.is_finite() && zetan >= 1.0) {
            return Err(Error::InvalidParameter {
                name: "zetan",
                reason: format!("{zetan} is not a zeta sum (finite, at least 1)"),
            });
        }
        Ok(Self::build(min, items, theta, zetan))
    }

    fn check(min: u64, max: u64, theta: f64) -> Result<u64, Error> {
        if max < min || max - min == u64::MAX {
            return Err(Error::InvalidParameter {
                name: "zipfian range",
                reason: format!("[{min}, {max}] is empty or too large"),
            });
        }
        if !(theta > 0.0 && theta < 1.0) {
            return Err(Error::InvalidParameter {
                name: "zipfian constant",
                reason: format!("{theta} is outside (0, 1)"),
            });
        }
        Ok(max - min + 1)
    }

    fn build(base: u64, items: u64, theta: f64, zetan: f64) -> Self {
        let zeta2 = zeta(0, 2, theta, 0.0);
        let mut z = Zipfian {
            base,
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2,
            zetan,
            eta: 0.0,
            second_cut: 1.0 + 0.5f64.powf(theta),
        };
        z.eta = z.eta_for(items);
        z
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// The number of items drawn from.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// ζ(items) for the current item count.
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The constant θ.
    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// Changes the item count to `items` (at least 1). Growing extends ζ incrementally (one
    /// `powf` per new item); shrinking recomputes it from scratch.
    pub fn set_items(&mut self, items: u64) {
        let items = items.max(1);
        if items == self.items {
            return;
        }
        self.zetan = if items > self.items {
            zeta(self.items, items, self.theta, self.zetan)
        } else {
            zeta(0, items, self.theta, 0.0)
        };
        self.items = items;
        self.eta = self.eta_for(items);
    }

    /// One draw from `[base, base + items)`.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < self.second_cut {
            return self.base + 1.min(self.items - 1);
        }
        let rank = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + rank.min(self.items - 1)
    }

    /// Sets the item count to `items` (see [`Zipfian::set_items`]), then draws.
    #[inline]
    pub fn sample_with_items(&mut self, rng: &mut Rng, items: u64) -> u64 {
        self.set_items(items);
        self.sample(rng)
    }
}

/// YCSB's scrambled zipfian over `[min, max]`: zipfian popularity, popular items scattered.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    min: u64,
    item_count: u64,
    ranks: Zipfian,
}

impl ScrambledZipfian {
    /// Scrambled zipfian over `[min, max]` with θ = 0.99: ranks are drawn over
    /// [`SCRAMBLED_ITEM_COUNT`] items with the precomputed [`SCRAMBLED_ZETAN`], so construction
    /// is O(1) whatever the range.
    pub fn new(min: u64, max: u64) -> Result<Self, Error> {
        let ranks = Zipfian::with_zetan(
            0,
            SCRAMBLED_ITEM_COUNT - 1,
            ZIPFIAN_CONSTANT,
            SCRAMBLED_ZETAN,
        )?;
        Self::over(min, max, ranks)
    }

    /// Scrambled zipfian with another constant. Unlike YCSB (which would sum ζ over 10^10
    /// items), ranks are drawn over the range itself, so construction costs one `powf` per item.
    pub fn with_constant(min: u64, max: u64, theta: f64) -> Result<Self, Error> {
        if theta == ZIPFIAN_CONSTANT {
            return Self::new(min, max);
        }
        let span = max
            .checked_sub(min)
            .ok_or_else(|| Error::InvalidParameter {
                name: "scrambled zipfian range",
                reason: format!("[{min}, {max}] is empty"),
            })?;
        let ranks = Zipfian::with_constant(0, span, theta)?;
        Self::over(min, max, ranks)
    }

    fn over(min: u64, max: u64, ranks: Zipfian) -> Result<Self, Error> {
        if max < min || max - min == u64::MAX {
            return Err(Error::InvalidParameter {
                name: "scrambled zipfian range",
                reason: format!("[{min}, {max}] is empty or too large"),
            });
        }
        Ok(ScrambledZipfian {
            min,
            item_count: max - min + 1,
            ranks,
        })
    }

    /// The number of items in the range.
    pub fn items(&self) -> u64 {
        self.item_count
    }

    /// One draw from `[min, max]`.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        self.min + fnv64(self.ranks.sample(rng)) % self.item_count
    }
}

/// YCSB's "latest": record `last - z` where `z` is zipfian over `[0, last]`, so the record
/// inserted last is the most popular and popularity falls off with age.
#[derive(Debug, Clone)]
pub struct SkewedLatest {
    distance: Zipfian,
}

impl SkewedLatest {
    /// Latest over records `0..=last` initially (θ = 0.99); computing ζ costs one `powf` per
    /// record, and each later growth one per new record.
    pub fn new(last: u64) -> Result<Self, Error> {
        Ok(SkewedLatest {
            distance: Zipfian::new(0, last)?,
        })
    }

    /// One draw from `[0, last]`, where `last` is the most recently inserted record number.
    #[inline]
    pub fn sample(&mut self, rng: &mut Rng, last: u64) -> u64 {
        let z = self.distance.sample_with_items(rng, last.saturating_add(1));
        last - z.min(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: usize = 200_000;

    fn histogram(n: usize, mut draw: impl FnMut() -> u64) -> Vec<u32> {
        let mut h = vec![0u32; n];
        for _ in 0..SAMPLES {
            h[draw() as usize] += 1;
        }
        h
    }

    fn freq(count: u32) -> f64 {
        f64::from(count) / SAMPLES as f64
    }

    #[test]
    fn uniform_passes_chi_square() {
        let u = Uniform::new(0, 99).expect("range");
        let mut rng = Rng::new(11);
        let h = histogram(100, || u.sample(&mut rng));
        let expect = SAMPLES as f64 / 100.0;
        let chi2: f64 = h
            .iter()
            .map(|&c| (f64::from(c) - expect).powi(2) / expect)
            .sum();
        // 99 degrees of freedom: mean 99, standard deviation 14; 170 is five deviations out.
        assert!(chi2 < 170.0, "chi-square {chi2}");
        assert!(Uniform::new(5, 4).is_err());
    }

    #[test]
    fn zipfian_matches_theory() {
        let n = 1000u64;
        let z = Zipfian::new(0, n - 1).expect("zipfian");
        let zetan = zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        assert!((z.zetan() - zetan).abs() < 1e-12);
        let mut rng = Rng::new(21);
        let h = histogram(n as usize, || z.sample(&mut rng));
        let theory = |rank: u64| 1.0 / ((rank + 1) as f64).powf(ZIPFIAN_CONSTANT) / zetan;
        // Ranks 0 and 1 are exact in Gray's method: within 3 % (about 5 standard deviations).
        for rank in [0u64, 1] {
            let (got, want) = (freq(h[rank as usize]), theory(rank));
            assert!(
                (got / want - 1.0).abs() < 0.03,
                "rank {rank}: {got} vs {want}"
            );
        }
        // Popularity falls with rank, and the heaviest tenth of the items carries the mass
        // theory gives it (Gray's approximation: within 2 points).
        assert!(h[0] > h[1] && h[1] > h[5] && h[5] > h[50] && h[50] > h[500]);
        let top: f64 = h[..100].iter().map(|&c| freq(c)).sum();
        let top_theory: f64 = (0..100).map(theory).sum();
        assert!((top - top_theory).abs() < 0.02, "{top} vs {top_theory}");
        // The most popular item holds about 1/ζ(n) of the draws: for n = 1000, θ = 0.99, 12.9 %.
        assert!((0.12..0.135).contains(&freq(h[0])), "{}", freq(h[0]));
    }

    #[test]
    fn zipfian_incremental_zeta_equals_fresh() {
        let mut grown = Zipfian::new(0, 999).expect("zipfian");
        let mut rng = Rng::new(5);
        for items in [1500u64, 2000, 2001, 4096] {
            let v = grown.sample_with_items(&mut rng, items);
            assert!(v < items);
            let fresh = Zipfian::new(0, items - 1).expect("zipfian");
            assert!((grown.zetan() - fresh.zetan()).abs() < 1e-9);
        }
        // Shrinking recomputes.
        grown.set_items(10);
        assert!((grown.zetan() - zeta(0, 10, ZIPFIAN_CONSTANT, 0.0)).abs() < 1e-12);
        assert!(Zipfian::with_constant(0, 9, 1.0).is_err());
        assert!(Zipfian::new(3, 2).is_err());
    }

    #[test]
    fn zipfian_with_one_item_always_draws_it() {
        let z = Zipfian::new(7, 7).expect("zipfian");
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| z.sample(&mut rng) == 7));
    }

    #[test]
    fn scrambled_zetan_constant_is_zeta_of_ten_billion() {
        // ζ(10^10) = exact sum to N, plus the Euler-Maclaurin tail from N to M = 10^10:
        // ∫ x^-θ dx + (f(M) - f(N)) / 2 + (f'(M) - f'(N)) / 12.
        let theta = ZIPFIAN_CONSTANT;
        let n = 100_000u64;
        let (nf, mf) = (n as f64, SCRAMBLED_ITEM_COUNT as f64);
        let f = |x: f64| x.powf(-theta);
        let df = |x: f64| -theta * x.powf(-theta - 1.0);
        let tail = (mf.powf(1.0 - theta) - nf.powf(1.0 - theta)) / (1.0 - theta)
            + (f(mf) - f(nf)) / 2.0
            + (df(mf) - df(nf)) / 12.0;
        let total = zeta(0, n, theta, 0.0) + tail;
        assert!((total - SCRAMBLED_ZETAN).abs() < 1e-6, "{total}");
    }

    #[test]
    fn scrambled_zipfian_scatters_the_popular_items() {
        let n = 1000u64;
        let s = ScrambledZipfian::new(0, n - 1).expect("scrambled");
        let mut rng = Rng::new(31);
        let h = histogram(n as usize, || s.sample(&mut rng));
        // The hottest item is rank 0's hash, the next rank 1's: about 1/ζ(10^10) = 3.8 % and
        // 1.9 % plus a 1/n share of the long tail.
        let mut order: Vec<usize> = (0..n as usize).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(h[i]));
        assert_eq!(order[0] as u64, fnv64(0) % n);
        assert_eq!(order[1] as u64, fnv64(1) % n);
        let p0 = 1.0 / SCRAMBLED_ZETAN;
        assert!(
            (freq(h[order[0]]) - p0).abs() < 0.006,
            "{}",
            freq(h[order[0]])
        );
        // Skewed: the hottest 10 % of the items take well over 10 % of the draws...
        let top: f64 = order[..100].iter().map(|&i| freq(h[i])).sum();
        assert!(top > 0.25, "{top}");
        // ...and they are spread over the range, not packed at the low end.
        let low_half = order[..100].iter().filter(|&&i| (i as u64) < n / 2).count();
        assert!((30..=70).contains(&low_half), "{low_half}");
        assert!(h.iter().filter(|&&c| c > 0).count() > 950);
    }

    #[test]
    fn scrambled_zipfian_other_constant_stays_in_range() {
        let s = ScrambledZipfian::with_constant(100, 199, 0.5).expect("scrambled");
        let mut rng = Rng::new(2);
        for _ in 0..10_000 {
            assert!((100..200).contains(&s.sample(&mut rng)));
        }
        assert_eq!(s.items(), 100);
    }

    #[test]
    fn latest_favours_recent_records() {
        let n = 10_000u64;
        let mut l = SkewedLatest::new(n - 1).expect("latest");
        let mut rng = Rng::new(41);
        let h = histogram(n as usize, || l.sample(&mut rng, n - 1));
        let zetan = zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        // The newest record is the most popular, at about 1/ζ(n) (9.8 % for n = 10^4).
        let newest = freq(h[(n - 1) as usize]);
        assert!((newest * zetan - 1.0).abs() < 0.03, "{newest}");
        assert!(h.iter().all(|&c| c <= h[(n - 1) as usize]));
        // The newest 1 % of the records take about Σ_{i≤100} i^-θ / ζ(n) of the draws (51.8 %).
        let recent: f64 = h[(n - 100) as usize..].iter().map(|&c| freq(c)).sum();
        let recent_theory = zeta(0, 100, ZIPFIAN_CONSTANT, 0.0) / zetan;
        assert!(
            (recent - recent_theory).abs() < 0.02,
            "{recent} vs {recent_theory}"
        );
        // The oldest half gets little.
        let old: f64 = h[..(n / 2) as usize].iter().map(|&c| freq(c)).sum();
        assert!(old < 0.1, "{old}");
    }

    #[test]
    fn latest_follows_inserts() {
        let mut l = SkewedLatest::new(99).expect("latest");
        let mut rng = Rng::new(3);
        let mut last = 99u64;
        for _ in 0..2000 {
            last += 1;
            for _ in 0..10 {
                assert!(l.sample(&mut rng, last) <= last);
            }
        }
        // After growth, the newest record still dominates.
        let h = (0..20_000)
            .filter(|_| l.sample(&mut rng, last) == last)
            .count();
        assert!(h > 1500, "{h}");
    }
}
