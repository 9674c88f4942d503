//! ringlog-shard: the thread-per-core runtime arrives with issue 4.
