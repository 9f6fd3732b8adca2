//! What CRUSH itself says about a placed drive's chunks, for the placed tests to hold the
//! drive to: computed straight with kura-crush's mapper, not through the drive.

use kura_crush::{CrushMap, Mapper, Workspace};

/// The legs CRUSH rule `rule` of `map` names for chunk `c` with `replicas` copies (every
/// device at full weight).
pub fn crush_legs(map: &CrushMap, rule: u32, replicas: usize, c: u64) -> Vec<usize> {
    let mapper = Mapper::for_test(map);
    let weights = vec![0x10000; map.max_devices as usize];
    let mut out = Vec::new();
    mapper
        .do_rule(
            &mut Workspace::new(),
            rule,
            c as i32,
            replicas,
            &weights,
            &mut out,
        )
        .expect("map");
    out.into_iter().map(|d| d as usize).collect()
}
