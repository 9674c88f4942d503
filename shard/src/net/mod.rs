//! The client port: one listening socket shared by the shards, connections,
//! and request dispatch to partition owners.

mod budget;
mod conn;
mod dispatch;
mod listen;

pub(crate) use conn::accept_loop;
pub use listen::bind_shared;
