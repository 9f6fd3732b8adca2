//! Fuzzes the CRUSH map decoder: any bytes give a typed error or a map that maps a few inputs
//! through every rule without panicking.
#![no_main]

use kura_crush::{decode, Mapper, Workspace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(map) = decode(data) else {
        return;
    };
    let mapper = Mapper::for_test(&map);
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    let weights = map.default_weights();
    for rule in 0..map.rules.len() as u32 {
        if map.rule(rule).is_none() {
            continue;
        }
        for n in [1, 3, 6] {
            for x in 0..4 {
                let _ = mapper.do_rule(&mut ws, rule, x, n, &weights, &mut out);
                assert!(out.len() <= n);
            }
        }
    }
    // What decodes must re-encode to something that decodes to the same map.
    let again = decode(&kura_crush::encode(&map)).expect("re-encoded map decodes");
    assert_eq!(again, map);
});
