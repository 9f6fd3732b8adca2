//! Fuzzes the text compiler: any bytes give a line/column error or a map that maps a few
//! inputs through every rule without panicking, and whose encoding decodes to the same map.
#![no_main]

use kura_crush::{decode, encode, load, CrushError, Mapper, Workspace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Text only: a leading CRUSH magic would route to the binary decoder (its own target).
    if data.starts_with(&[0, 0, 1, 0]) {
        return;
    }
    let map = match load(data) {
        Ok(map) => map,
        Err(CrushError::Parse { line, column, .. }) => {
            assert!(line >= 1 && column >= 1);
            return;
        }
        Err(other) => panic!("text errors are Parse errors, got {other:?}"),
    };
    let mapper = Mapper::for_test(&map);
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    let weights = map.default_weights();
    for rule in 0..map.rules.len() as u32 {
        if map.rule(rule).is_none() {
            continue;
        }
        for x in 0..4 {
            let _ = mapper.do_rule(&mut ws, rule, x, 3, &weights, &mut out);
            assert!(out.len() <= 3);
        }
    }
    assert_eq!(decode(&encode(&map)).expect("compiled map decodes"), map);
});
