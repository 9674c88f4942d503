//! What the client port (`net`) and the controller may use of the shard
//! they run on: its identity, config, metrics, the topic catalog, and
//! calls into any shard. The shard implements it; `net` and `controller`
//! depend on this trait, never on `shard`, so the dependencies point one
//! way: shard -> net -> handle and shard -> controller -> handle (the
//! table of allowed edges is tests/layering.rs).

use std::future::Future;
use std::sync::Arc;

use crate::catalog::{Catalog, TopicTable};
use crate::config::ServerConfig;
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
    /// Runs `op` on shard `owner` and waits for the outcome.
    fn call(&self, owner: usize, op: Op) -> impl Future<Output = Outcome>;
}
