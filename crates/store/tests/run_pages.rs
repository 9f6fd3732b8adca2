//! Sorted runs built from random versions of random keys: every lookup at every LSN finds what a
//! model finds, the bloom filter keeps its false-positive rate, out-of-order input is refused,
//! and a damaged page makes the lookups that read it fail — never return other data.

use kura_store::format::page::{LeafEntry, LeafValue};
use kura_store::format::{FormatError, PAGE_SIZE};
use kura_store::run::{Run, RunBuilder};
use kura_store::StoreError;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

const SEG_SEQ: u64 = 77;
/// 1 MiB segments.
const SEGMENT_PAGES: u32 = 256;

/// Key -> its versions, newest first: (LSN, value; `None` = tombstone).
type Model = BTreeMap<Vec<u8>, Vec<(u64, Option<Vec<u8>>)>>;

fn model() -> impl Strategy<Value = Model> {
    btree_map(
        vec(any::<u8>(), 0..24),
        vec(
            (1u64..500, proptest::option::of(vec(any::<u8>(), 0..700))),
            1..4,
        ),
        1..300,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(k, mut versions)| {
                versions.sort_by_key(|v| Reverse(v.0));
                versions.dedup_by_key(|v| v.0);
                (k, versions)
            })
            .collect()
    })
}

fn build(model: &Model) -> (Vec<u8>, u32) {
    let mut b = RunBuilder::new(SEG_SEQ, SEGMENT_PAGES);
    for (key, versions) in model {
        for (lsn, value) in versions {
            let value = value
                .clone()
                .map_or(LeafValue::Tombstone, LeafValue::Inline);
            b.add(LeafEntry {
                key: key.clone(),
                lsn: *lsn,
                value,
            })
            .expect("sorted input");
        }
    }
    let (pages, footer) = b.finish(10).expect("finish");
    assert_eq!(pages.len(), footer.total_pages as usize * PAGE_SIZE);
    let total = footer.total_pages;
    (pages, total)
}

fn reader(pages: &[u8]) -> impl FnMut(u32) -> Result<Arc<[u8]>, StoreError> + '_ {
    move |p| Ok(pages[p as usize * PAGE_SIZE..(p as usize + 1) * PAGE_SIZE].into())
}

/// What the model says a lookup of `key` at `max_lsn` returns.
fn expected(model: &Model, key: &[u8], max_lsn: u64) -> Option<(u64, Option<Vec<u8>>)> {
    model
        .get(key)?
        .iter()
        .find(|(lsn, _)| *lsn <= max_lsn)
        .cloned()
}

fn as_model(e: Option<LeafEntry>) -> Option<(u64, Option<Vec<u8>>)> {
    e.map(|e| {
        let value = match e.value {
            LeafValue::Inline(v) => Some(v),
            LeafValue::Tombstone => None,
            LeafValue::Pointer(p) => panic!("no pointers were written: {p:?}"),
        };
        (e.lsn, value)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn every_lookup_matches_the_model(model in model(), probes in vec((any::<prop::sample::Index>(), 0u64..520), 50)) {
        let (pages, total) = build(&model);
        let mut read = reader(&pages);
        let run = Run::open(SEG_SEQ, total, &mut read).expect("open");
        prop_assert_eq!(run.footer().entries, model.values().map(Vec::len).sum::<usize>() as u64);
        let keys: Vec<&Vec<u8>> = model.keys().collect();
        for (index, max_lsn) in probes {
            let key = keys[index.index(keys.len())];
            let got = as_model(run.get(key, max_lsn, &mut read).expect("get"));
            prop_assert_eq!(got, expected(&model, key, max_lsn));
        }
        for key in &keys {
            let got = as_model(run.get(key, u64::MAX, &mut read).expect("get"));
            prop_assert_eq!(got, expected(&model, key, u64::MAX));
        }
        // Keys the run does not hold.
        for i in 0..50u32 {
            let absent = [b"zz-absent-".as_slice(), &i.to_le_bytes()].concat();
            if !model.contains_key(&absent) {
                prop_assert_eq!(run.get(&absent, u64::MAX, &mut read).expect("get"), None);
            }
        }
    }

    #[test]
    fn a_damaged_page_fails_the_lookups_that_read_it(model in model(), at in any::<prop::sample::Index>(), byte in 1u8..=255) {
        let (mut pages, total) = build(&model);
        let at = at.index(pages.len());
        pages[at] ^= byte;
        let mut read = reader(&pages);
        let run = match Run::open(SEG_SEQ, total, &mut read) {
            Ok(run) => run,
            Err(e) => {
                let corrupt = matches!(e, StoreError::Corrupt { .. });
                prop_assert!(corrupt, "{e:?}");
                return Ok(());
            }
        };
        for (key, versions) in &model {
            match run.get(key, u64::MAX, &mut read) {
                Ok(got) => {
                    // A damaged byte in padding or in another page's data leaves this lookup
                    // correct.
                    let want = versions.first().cloned();
                    prop_assert_eq!(as_model(got), want);
                }
                Err(e) => {
                    let corrupt = matches!(e, StoreError::Corrupt { .. });
                    prop_assert!(corrupt, "{e:?}");
                }
            }
        }
    }
}

#[test]
fn runs_span_many_pages_and_index_levels() {
    let model: Model = (0..20_000u32)
        .map(|i| {
            (
                format!("key-{i:08}-{}", "x".repeat(40)).into_bytes(),
                vec![(u64::from(i) + 1, Some(vec![i as u8; 8]))],
            )
        })
        .collect();
    let mut b = RunBuilder::new(SEG_SEQ, 4096);
    for (key, versions) in &model {
        let (lsn, value) = &versions[0];
        b.add(LeafEntry {
            key: key.clone(),
            lsn: *lsn,
            value: LeafValue::Inline(value.clone().expect("a value")),
        })
        .expect("add");
    }
    let (pages, footer) = b.finish(10).expect("finish");
    assert!(footer.index_levels >= 2, "{footer:?}");
    let mut read = reader(&pages);
    let run = Run::open(SEG_SEQ, footer.total_pages, &mut read).expect("open");
    for (key, versions) in model.iter().step_by(97) {
        assert_eq!(
            as_model(run.get(key, u64::MAX, &mut read).expect("get")),
            versions.first().cloned()
        );
    }
    // 10 bits per key: about 1 % false positives; allow 3 %.
    let mut positives = 0;
    for i in 0..2000u32 {
        let absent = format!("key-{i:08}-{}", "y".repeat(40)).into_bytes();
        let mut reads = 0;
        let mut counting = |p: u32| {
            reads += 1;
            Ok(pages[p as usize * PAGE_SIZE..(p as usize + 1) * PAGE_SIZE].into())
        };
        assert_eq!(
            run.get(&absent, u64::MAX, &mut counting).expect("get"),
            None
        );
        positives += usize::from(reads > 0);
    }
    assert!(
        positives < 60,
        "{positives} of 2000 absent keys passed the bloom filter"
    );
}

#[test]
fn out_of_order_entries_and_overfull_runs_are_refused() {
    let entry = |key: &[u8], lsn| LeafEntry {
        key: key.to_vec(),
        lsn,
        value: LeafValue::Tombstone,
    };
    let mut b = RunBuilder::new(1, 4);
    b.add(entry(b"b", 5)).expect("first");
    assert!(matches!(
        b.add(entry(b"a", 1)),
        Err(FormatError::BadField { .. })
    ));
    assert!(
        matches!(b.add(entry(b"b", 6)), Err(FormatError::BadField { .. })),
        "a newer version after an older one"
    );
    b.add(entry(b"b", 4))
        .expect("an older version after a newer one");
    assert!(
        matches!(
            RunBuilder::new(1, 4).finish(10),
            Err(FormatError::BadField { .. })
        ),
        "empty run"
    );
    let mut small = RunBuilder::new(1, 3);
    let mut refused = None;
    for i in 0..1000u32 {
        if let Err(e) = small.add(entry(format!("{i:06}").as_bytes(), 1)) {
            refused = Some(e);
            break;
        }
    }
    let refused = refused.map_or_else(|| small.finish(10).err(), Some);
    assert!(
        matches!(refused, Some(FormatError::TooLarge { .. })),
        "{refused:?}"
    );
}
