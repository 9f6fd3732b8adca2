//! Building buckets the way Ceph's map builder does, so a map compiled from text (or rebuilt
//! after a weight change) has the same derived arrays as one `crushtool` built: list running
//! sums, tree node weights, straw lengths (both `straw_calc_version`s), bucket weights, and the
//! incremental "add one item" forms Ceph uses when it clones buckets into device-class shadow
//! trees. Overflowing weights give a [`CrushError`], as Ceph refuses them.

use crate::error::CrushError;
use crate::map::{Bucket, BucketKind, ALG_LIST, ALG_STRAW, ALG_STRAW2, ALG_TREE, ALG_UNIFORM};

/// Largest item count a tree bucket can hold: its node count is encoded in one byte, and 64
/// items already need 128 nodes.
pub const MAX_TREE_ITEMS: usize = 64;

fn add(a: u32, b: u32, bucket: i32) -> Result<u32, CrushError> {
    a.checked_add(b).ok_or_else(|| {
        CrushError::Invalid(format!(
            "bucket {bucket}: item weights overflow the 32-bit bucket weight"
        ))
    })
}

/// Depth of a tree holding `size` leaves (Ceph's `calc_depth`).
fn tree_depth(size: usize) -> u32 {
    if size == 0 {
        return 0;
    }
    let mut depth = 1;
    let mut t = size - 1;
    while t > 0 {
        t >>= 1;
        depth += 1;
    }
    depth
}

/// Node of leaf `i` in a tree bucket.
pub fn tree_node(i: usize) -> usize {
    ((i + 1) << 1) - 1
}

fn tree_parent(n: usize) -> usize {
    let h = n.trailing_zeros();
    if n & (1 << (h + 1)) != 0 {
        n - (1 << h)
    } else {
        n + (1 << h)
    }
}

/// Straw lengths for `weights` as Ceph's `crush_calc_straw` computes them (double precision,
/// items visited in ascending weight order, ties kept in item order).
pub fn calc_straws(weights: &[u32], straw_calc_version: u8) -> Vec<u32> {
    let size = weights.len();
    let mut straws = vec![0u32; size];
    // Stable insertion sort by weight, as Ceph's.
    let mut reverse: Vec<usize> = Vec::with_capacity(size);
    for i in 0..size {
        let at = reverse
            .iter()
            .position(|&r| weights[i] < weights[r])
            .unwrap_or(reverse.len());
        reverse.insert(at, i);
    }
    let mut numleft = size as i64;
    let mut straw = 1.0f64;
    let mut wbelow = 0.0f64;
    let mut lastw = 0.0f64;
    let mut i = 0;
    while i < size {
        let wi = weights[reverse[i]];
        if straw_calc_version == 0 {
            if wi == 0 {
                straws[reverse[i]] = 0;
                i += 1;
                continue;
            }
            straws[reverse[i]] = (straw * 65536.0) as u32;
            i += 1;
            if i == size {
                break;
            }
            if weights[reverse[i]] == weights[reverse[i - 1]] {
                continue;
            }
            wbelow += (weights[reverse[i - 1]] as f64 - lastw) * numleft as f64;
            for j in i..size {
                if weights[reverse[j]] == weights[reverse[i]] {
                    numleft -= 1;
                } else {
                    break;
                }
            }
        } else {
            if wi == 0 {
                straws[reverse[i]] = 0;
                i += 1;
                numleft -= 1;
                continue;
            }
            straws[reverse[i]] = (straw * 65536.0) as u32;
            i += 1;
            if i == size {
                break;
            }
            wbelow += (weights[reverse[i - 1]] as f64 - lastw) * numleft as f64;
            numleft -= 1;
        }
        // `numleft * (w[i] - w[i-1])` is unsigned 32-bit arithmetic in Ceph.
        let diff = weights[reverse[i]].wrapping_sub(weights[reverse[i - 1]]);
        let wnext = (numleft as u32).wrapping_mul(diff) as f64;
        let pbelow = wbelow / (wbelow + wnext);
        straw *= (1.0 / pbelow).powf(1.0 / numleft as f64);
        lastw = weights[reverse[i - 1]] as f64;
    }
    straws
}

/// A bucket of algorithm `alg` holding `items` with `weights` (16.16 fixed point), built as
/// Ceph's `crush_make_bucket` builds it. `id` only names the bucket in errors and is stored.
pub fn make_bucket(
    id: i32,
    alg: u8,
    hash: u8,
    bucket_type: u16,
    items: &[i32],
    weights: &[u32],
    straw_calc_version: u8,
) -> Result<Bucket, CrushError> {
    if items.len() != weights.len() {
        return Err(CrushError::Invalid(format!(
            "bucket {id}: {} items but {} weights",
            items.len(),
            weights.len()
        )));
    }
    let size = items.len();
    let mut total = 0u32;
    for &w in weights {
        total = add(total, w, id)?;
    }
    let (weight, kind) = match alg {
        ALG_UNIFORM => {
            let item_weight = weights.first().copied().unwrap_or(0);
            let weight = (size as u32)
                .checked_mul(item_weight)
                .filter(|_| size <= u32::MAX as usize)
                .ok_or_else(|| {
                    CrushError::Invalid(format!("bucket {id}: uniform bucket weight overflows"))
                })?;
            (weight, BucketKind::Uniform { item_weight })
        }
        ALG_LIST => {
            let mut sum = 0u32;
            let sum_weights = weights
                .iter()
                .map(|&w| {
                    sum = sum.wrapping_add(w);
                    sum
                })
                .collect();
            (
                total,
                BucketKind::List {
                    item_weights: weights.to_vec(),
                    sum_weights,
                },
            )
        }
        ALG_TREE => {
            if size > MAX_TREE_ITEMS {
                return Err(CrushError::Invalid(format!(
                    "bucket {id}: a tree bucket holds at most {MAX_TREE_ITEMS} items, not {size}"
                )));
            }
            if size == 0 {
                (
                    0,
                    BucketKind::Tree {
                        node_weights: Vec::new(),
                    },
                )
            } else {
                let depth = tree_depth(size);
                let mut nodes = vec![0u32; 1 << depth];
                for (i, &w) in weights.iter().enumerate() {
                    let mut node = tree_node(i);
                    nodes[node] = w;
                    for _ in 1..depth {
                        node = tree_parent(node);
                        nodes[node] = add(nodes[node], w, id)?;
                    }
                }
                (
                    total,
                    BucketKind::Tree {
                        node_weights: nodes,
                    },
                )
            }
        }
        ALG_STRAW => (
            total,
            BucketKind::Straw {
                item_weights: weights.to_vec(),
                straws: calc_straws(weights, straw_calc_version),
            },
        ),
        ALG_STRAW2 => (
            total,
            BucketKind::Straw2 {
                item_weights: weights.to_vec(),
            },
        ),
        other => {
            return Err(CrushError::UnknownAlgorithm {
                index: (-1i64 - id as i64).max(0) as usize,
                alg: other as u32,
            })
        }
    };
    Ok(Bucket {
        id,
        bucket_type,
        hash,
        weight,
        items: items.to_vec(),
        kind,
    })
}

/// Appends one item to a bucket as Ceph's `crush_bucket_add_item` does (used to build shadow
/// trees, whose buckets start empty). A uniform bucket only takes items of its item weight,
/// which an empty one has as 0, so Ceph cannot shadow uniform buckets and neither can this.
pub fn add_item(
    b: &mut Bucket,
    item: i32,
    weight: u32,
    straw_calc_version: u8,
) -> Result<(), CrushError> {
    let id = b.id;
    let new_weight = add(b.weight, weight, id)?;
    match &mut b.kind {
        BucketKind::Uniform { item_weight } => {
            if *item_weight != weight {
                return Err(CrushError::Invalid(format!(
                    "uniform bucket {id}: item {item} has weight {weight}, the bucket's items \
                     have {item_weight} (Ceph cannot build a device-class shadow of a uniform \
                     bucket)"
                )));
            }
        }
        BucketKind::List {
            item_weights,
            sum_weights,
        } => {
            let sum = match sum_weights.last() {
                Some(&s) => add(s, weight, id)?,
                None => weight,
            };
            item_weights.push(weight);
            sum_weights.push(sum);
        }
        BucketKind::Tree { node_weights } => {
            let newsize = b.items.len() + 1;
            if newsize > MAX_TREE_ITEMS {
                return Err(CrushError::Invalid(format!(
                    "bucket {id}: a tree bucket holds at most {MAX_TREE_ITEMS} items"
                )));
            }
            let depth = tree_depth(newsize);
            // Ceph grows the array with realloc and leaves the new nodes uninitialised; they
            // are zero here.
            node_weights.resize(1 << depth, 0);
            let mut node = tree_node(newsize - 1);
            node_weights[node] = weight;
            let root = node_weights.len() / 2;
            if depth >= 2 && node - 1 == root {
                node_weights[root] = node_weights[root / 2];
            }
            for _ in 1..depth {
                node = tree_parent(node);
                node_weights[node] = add(node_weights[node], weight, id)?;
            }
        }
        BucketKind::Straw {
            item_weights,
            straws,
        } => {
            item_weights.push(weight);
            *straws = calc_straws(item_weights, straw_calc_version);
        }
        BucketKind::Straw2 { item_weights } => item_weights.push(weight),
    }
    b.items.push(item);
    b.weight = new_weight;
    Ok(())
}

/// The weight of the item at position `pos` as the bucket holds it (Ceph's
/// `crush_get_bucket_item_weight`); 0 past the end.
pub fn item_weight(b: &Bucket, pos: usize) -> u32 {
    if pos >= b.items.len() {
        return 0;
    }
    match &b.kind {
        BucketKind::Uniform { item_weight } => *item_weight,
        BucketKind::List { item_weights, .. }
        | BucketKind::Straw { item_weights, .. }
        | BucketKind::Straw2 { item_weights } => item_weights.get(pos).copied().unwrap_or(0),
        BucketKind::Tree { node_weights } => node_weights.get(tree_node(pos)).copied().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_nodes_sum_to_the_root() {
        let w = [0x10000, 0x20000, 0x8000, 0x30000, 0x1000];
        let b = make_bucket(-1, ALG_TREE, 0, 1, &[0, 1, 2, 3, 4], &w, 1).expect("tree");
        let BucketKind::Tree { node_weights } = &b.kind else {
            panic!("not a tree")
        };
        assert_eq!(node_weights.len(), 16);
        assert_eq!(node_weights[8], w.iter().sum::<u32>());
        for (i, &wi) in w.iter().enumerate() {
            assert_eq!(item_weight(&b, i), wi);
        }
    }

    #[test]
    fn adding_items_one_by_one_builds_the_same_bucket() {
        let w = [0x10000u32, 0x20000, 0x8000, 0x30000, 0, 0x1000];
        for alg in [ALG_LIST, ALG_TREE, ALG_STRAW, ALG_STRAW2] {
            for scv in [0, 1] {
                let whole = make_bucket(-1, alg, 0, 1, &[0, 1, 2, 3, 4, 5], &w, scv).expect("make");
                let mut grown = make_bucket(-1, alg, 0, 1, &[], &[], scv).expect("empty");
                for (i, &wi) in w.iter().enumerate() {
                    add_item(&mut grown, i as i32, wi, scv).expect("add");
                }
                assert_eq!(grown, whole, "alg {alg} straw_calc_version {scv}");
            }
        }
    }

    #[test]
    fn overflowing_weights_are_refused() {
        let r = make_bucket(-1, ALG_STRAW2, 0, 1, &[0, 1], &[u32::MAX, 1], 1);
        assert!(matches!(r, Err(CrushError::Invalid(m)) if m.contains("overflow")));
        let mut u = make_bucket(-2, ALG_UNIFORM, 0, 1, &[], &[], 1).expect("empty uniform");
        assert!(add_item(&mut u, 0, 0x10000, 1).is_err());
    }

    #[test]
    fn equal_straw_weights_give_equal_straws() {
        let s = calc_straws(&[0x10000; 4], 1);
        assert!(s.iter().all(|&v| v == s[0]) && s[0] == 0x10000);
        let s0 = calc_straws(&[0, 0x10000, 0x20000], 0);
        assert_eq!(s0[0], 0);
        assert!(s0[2] > s0[1]);
    }
}
