//! Benchmark jobs that drive ringlog itself.

pub mod append;
pub mod consume;
pub mod fetch;
pub mod partitions;
pub mod produce;
pub mod server;
pub mod transfer;
