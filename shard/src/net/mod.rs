//! The client port: SO_REUSEPORT listeners (one per shard), connections,
//! and request dispatch to partition owners.

mod conn;
mod dispatch;
mod listen;

pub(crate) use conn::accept_loop;
pub use listen::bind_reuseport;
