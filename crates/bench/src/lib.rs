//! kura's benchmark harness. Each benchmark measures kura and a peer (fio, ext4 through plain
//! system calls, ...) in the same run and reports ratios, because these machines are noisy.
//! Results go to a terminal table, a JSON file and a PNG plot.

pub mod all;
#[allow(unsafe_code)] // the SSE4.2 CRC32C kernel (target_feature)
pub mod crc;
pub mod crush;
pub mod drives;
pub mod fs;
pub mod fs_threads;
pub mod genome;
pub mod genome_matrix;
pub mod genome_peers;
pub mod genome_real;
pub mod ingest;
pub mod io;
pub mod kv;
pub mod nbdcopy;
pub mod output;
pub mod paper;
pub mod qos;
pub mod rbd;
pub mod stats;
pub mod vm;
