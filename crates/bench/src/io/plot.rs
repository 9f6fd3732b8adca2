//! The PNG plot of `kura bench io`, drawn by `scripts/plot_bench.py` (matplotlib, the field's
//! plotting tool) from the JSON report through [`crate::output`].

/// The plotting script of `kura bench io` (takes `JSON PNG` arguments).
pub const SCRIPT: &str = include_str!("../../../../scripts/plot_bench.py");
