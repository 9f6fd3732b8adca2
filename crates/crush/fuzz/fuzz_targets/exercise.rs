//! What both fuzz targets do with a map they got: map a few inputs through every rule for
//! each replica count in `sizes` without panicking or returning more than asked, then check
//! that the map's encoding decodes to the same map.

use kura_crush::{decode, encode, CrushMap, Mapper, Workspace};

pub fn exercise(map: &CrushMap, sizes: &[usize]) {
    let mapper = Mapper::for_test(map);
    let mut ws = Workspace::new();
    let mut out = Vec::new();
    let weights = map.default_weights();
    for rule in 0..map.rules.len() as u32 {
        if map.rule(rule).is_none() {
            continue;
        }
        for &n in sizes {
            for x in 0..4 {
                let _ = mapper.do_rule(&mut ws, rule, x, n, &weights, &mut out);
                assert!(out.len() <= n);
            }
        }
    }
    let again = decode(&encode(map)).expect("the map's encoding decodes");
    assert_eq!(&again, map);
}
