//! The client port: one listening socket shared by the shards, connections,
//! and request dispatch to partition owners; and the replication transport
//! between nodes ([`peer`]).

mod budget;
mod conn;
mod dispatch;
mod listen;
pub mod peer;

pub(crate) use conn::accept_loop;
pub use listen::bind_shared;
