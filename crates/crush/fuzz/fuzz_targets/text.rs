//! Fuzzes the text compiler: any bytes give a line/column error or a map that maps a few
//! inputs through every rule without panicking, and whose encoding decodes to the same map.
#![no_main]

mod exercise;

use exercise::exercise;
use kura_crush::{load, CrushError};
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
    exercise(&map, &[3]);
});
