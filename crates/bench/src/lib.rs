//! Benchmark harness (being written).
