//! ringlog-shard: the thread-per-core server.
//!
//! * [`server`] boots a node: loads the topic catalog, starts one pinned
//!   thread per shard ([`shard`]), the control socket ([`control`]) and
//!   waits for shutdown.
//! * Each shard runs a monoio io_uring runtime with its own storage ring and
//!   owns its partitions ([`partition`]) outright; other shards reach them
//!   only through its bounded [`mailbox`], carrying the [`ops`]
//!   vocabulary and woken through an [`eventfd`]; tasks of one shard hand
//!   replies to each other through [`oneshot`].
//! * [`net`] speaks the client protocol (`ringlog_protocol::wire`);
//!   it and the controller reach their shard through `handle`'s trait,
//!   never `shard` itself (the layering is checked by tests/layering.rs);
//!   [`client`] is the matching blocking client library; fetch replies
//!   are sent from buffers of the server's [`reply_pool`].
//! * [`transfer`] is state transfer between replicas: a pure receiver
//!   session and serving side, and their storage executor.
//! * [`meta`] is the cluster metadata group's state machine: the table of
//!   topics, partitions and placement that committed ops of its own VSR
//!   group build, its snapshot, and the pure host driver a node runs
//!   beside the group's replica (not wired into the server yet).
//! * [`meta_io`] is the thread that writes topics.json for the controller,
//!   so shard 0 never waits for its fsyncs.
//! * [`peer_route`] carries replication messages between the peer
//!   transport (on shard 0) and the shards owning the partitions.
//! * [`trash`] holds dropped partitions' directories (renamed in on the
//!   ring) until its sweeper thread, owned by the server, removes them.
pub mod catalog;
pub mod client;
pub mod config;
pub mod control;
mod controller;
pub mod eventfd;
mod handle;
pub mod mailbox;
pub mod meta;
pub mod meta_hosted;
pub mod meta_io;
pub mod metrics;
pub mod net;
pub mod oneshot;
pub mod ops;
pub mod partition;
pub mod peer_buf;
pub mod peer_route;
pub mod placement;
pub mod replica_io;
pub mod reply_pool;
pub mod server;
pub mod shard;
pub mod sim;
pub mod transfer;
pub mod trash;
pub mod vsr;
