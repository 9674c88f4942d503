//! ringlog-storage: the partition store (segments, index, superblock,
//! recovery) over an I/O backend trait with an io_uring and a sim backend.

pub mod io;
pub mod journal;
pub mod segment;
pub mod store;
pub mod superblock;
