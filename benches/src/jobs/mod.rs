//! Benchmark jobs that drive ringlog itself.

pub mod append;
pub mod transfer;
