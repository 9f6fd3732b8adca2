//! CRUSH, Ceph's placement function, bit-identical to Ceph's own (`crushtool --test`).
//!
//! * [`decode`] reads the compiled map `crushtool -c`/`--build -o` writes, bounded and checked
//!   (typed [`CrushError`]s, never a panic), and [`encode`] writes it back; [`text`] compiles
//!   the text form `crushtool -d` writes (line/column errors), with [`builder`]'s bucket
//!   arithmetic, and [`text::load`] takes either form;
//! * [`map`] is the map itself: buckets of every algorithm (uniform, list, tree, straw,
//!   straw2), rules, tunables and their profiles, names, device classes and shadow buckets,
//!   `choose_args` weight sets;
//! * [`hash`] is rjenkins1 and [`ln`] straw2's fixed-point logarithm with tables generated from
//!   their definition;
//! * [`mapper`] runs rules (`take`, `choose`/`chooseleaf` `firstn`/`indep`, `emit`, `set_*`);
//! * [`batch`] maps ranges of inputs on several threads;
//! * [`tester`] prints what `crushtool --test` prints, [`diff`] what changes between two maps
//!   (`crushtool --compare`'s count, and data movement against its lower bounds);
//! * [`pg`] maps object names to placement groups and inputs, as Ceph's OSD map does.
// No unsafe code but one call: the AVX2 build of straw2's fast path, `mapper::simd`, behind
// a CPU feature check (the workspace denies unsafe code everywhere else).
#![deny(unsafe_code)]

pub mod batch;
pub mod builder;
pub mod decode;
pub mod diff;
pub mod encode;
pub mod error;
pub mod hash;
pub mod ln;
pub mod map;
pub mod mapper;
pub mod pg;
pub mod tester;
pub mod text;

pub use batch::{map_range, BatchResult};
pub use decode::decode;
pub use encode::encode;
pub use error::CrushError;
pub use map::{CrushMap, Tunables, ITEM_NONE};
pub use mapper::{Mapper, Workspace};
pub use text::{load, parse};
