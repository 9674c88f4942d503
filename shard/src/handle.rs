//! What the client port (`net`) and the controller may use of the shard
//! they run on: its identity, config, metrics, the topic catalog, and
//! calls into any shard. The shard implements it; `net` and `controller`
//! depend on this trait, never on `shard`, so the dependencies point one
//! way: shard -> net -> handle and shard -> controller -> handle (the
//! table of allowed edges is tests/layering.rs).

use std::future::Future;
use std::sync::Arc;

use ringlog_storage::io::BatchBuf;

use crate::catalog::{Catalog, TopicTable};
use crate::config::ServerConfig;
use crate::meta::Role;
use crate::meta_hosted::MetaGroup;
use crate::meta_io;
use crate::metrics::ShardMetrics;
use crate::oneshot::Notify;
use crate::ops::{Op, Outcome};
use crate::reply_pool::ReplyPool;

pub(crate) trait ShardHandle {
    /// This shard's index.
    fn id(&self) -> usize;
    fn config(&self) -> &ServerConfig;
    fn metrics(&self) -> &ShardMetrics;
    fn catalog(&self) -> &Catalog;
    /// The current topic table.
    fn table(&self) -> Arc<TopicTable>;
    fn shard_count(&self) -> usize;
    /// Shutdown started: take no new work.
    fn is_stopping(&self) -> bool;
    /// Notified when shutdown starts.
    fn stop(&self) -> &Notify;
    /// The thread doing the controller's file work (topics.json).
    fn meta_io(&self) -> &meta_io::Client;
    /// The server's fetch reply buffers (a sent reply's goes back here).
    fn reply_pool(&self) -> &ReplyPool;
    /// A buffer from this shard's store pool for a `batch_len`-byte produce
    /// batch to its partition `partition_id`, starting where the batch
    /// will start in its block on disk (the store then writes it without a
    /// copy); None for another shard's partition, a small batch, or at the
    /// pool's lending bound (the batch then goes in a heap buffer).
    fn lend_produce_buffer(&self, partition_id: u32, batch_len: usize) -> Option<BatchBuf>;
    /// The metadata group's state (shard 0 of a node in the group).
    fn meta_group(&self) -> Option<&std::cell::RefCell<MetaGroup>>;
    /// The role of this node's metadata replica (shard 0, once open).
    fn meta_role(&self) -> Option<Role>;
    /// Queues `payload` for partition `partition_id` to node `to` on the
    /// peer transport (bounded; a full queue drops and counts).
    fn send_peer(&self, to: u32, partition_id: u32, payload: Vec<u8>);
    /// Runs `op` on shard `owner` and waits for the outcome.
    fn call(&self, owner: usize, op: Op) -> impl Future<Output = Outcome>;
}
