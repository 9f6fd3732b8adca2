//! Genome sequence matching on kura (issue 5): the paper's showcase application.
//!
//! | module | owns |
//! |---|---|
//! | [`source`] | streaming byte sources (any `Read`: host files, AccelFS files, gzip) with large reads |
//! | [`fasta`] | streaming FASTA parsing into contigs |
//! | [`fastq`] | streaming FASTQ parsing with file/line errors |
//! | [`simulate`] | seeded synthetic genomes and reads whose names carry their true origin |
//! | [`repeats`] | larger synthetic references with interspersed and tandem repeats |
//! | [`truth`] | parsing true origins from read names and scoring SAM output against them |
//! | [`pack`] | the 2-bit packed reference |
//! | [`index`] | the minimizer index and its versioned, checksummed on-disk format |
//! | [`align`] | banded alignment for seed extension (mismatches and small indels) |
//! | [`map`] | seeding, chaining, extension, MAPQ, single- and paired-end mapping |
//! | [`sam`] | SAM and PAF output |
//! | [`store`] | where files live: host files or a mounted AccelFS, streamed at device bandwidth |
//! | [`paths`] | the I/O paths compared (direct AccelFS, host files, redirect) and their workspace |
//! | [`pipeline`] | the whole application (the paper's Table 2), stage by stage, with accuracy |
//! | [`run`] | the pipeline on each I/O path (dataset, workspace, per-path reports, JSON) |

#![forbid(unsafe_code)]

pub mod align;
pub mod fasta;
pub mod fastq;
pub mod index;
pub mod map;
pub mod pack;
pub mod paths;
pub mod pipeline;
pub mod repeats;
pub mod run;
pub mod sam;
pub mod simulate;
pub mod source;
pub mod store;
pub mod truth;
