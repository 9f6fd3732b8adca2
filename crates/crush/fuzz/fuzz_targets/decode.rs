//! Fuzzes the CRUSH map decoder: any bytes give a typed error or a map that maps a few inputs
//! through every rule without panicking.
#![no_main]

mod exercise;

use exercise::exercise;
use kura_crush::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(map) = decode(data) else {
        return;
    };
    exercise(&map, &[1, 3, 6]);
});
