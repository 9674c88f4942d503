//! TEMPORARY dev stub of the store API (not for commit).
#![allow(dead_code)]
use std::io;
use std::path::Path;
use ringlog_storage::io::uring::UringBackend;
#[derive(Clone, Debug, Default)]
pub struct StoreConfig { pub segment_size_bytes: u64, pub write_buffer_bytes: usize }
impl StoreConfig {
    pub fn batch_bytes_max(&self) -> usize { self.write_buffer_bytes - 4096 }
    pub fn validate(&self) -> Result<(), StoreError> { Ok(()) }
}
#[derive(Debug, thiserror::Error)]
#[error("stub")]
pub struct StoreError(#[from] io::Error);
pub struct PartitionStore { f: std::fs::File, next: u64, last: u64, pending: Vec<u8> }
impl PartitionStore {
    pub fn create(_io: &mut UringBackend, dir: &Path, _p: u32, _c: StoreConfig) -> Result<Self, StoreError> {
        std::fs::create_dir(dir)?;
        Ok(Self { f: std::fs::File::create(dir.join("log"))?, next: 0, last: 0, pending: vec![] })
    }
    pub fn next_offset(&self) -> u64 { self.next }
    pub fn last_checksum(&self) -> u64 { self.last }
    pub fn append(&mut self, _io: &mut UringBackend, b: &[u8]) -> Result<(), StoreError> {
        let h = ringlog_protocol::BatchHeader::decode(b).unwrap();
        self.next += u64::from(h.record_count); self.last = h.header_checksum; self.pending.extend_from_slice(b); Ok(())
    }
    pub fn close(self, _io: &mut UringBackend) -> Result<(), StoreError> { Ok(()) }
}
pub fn flush_all(_io: &mut UringBackend, stores: &mut [&mut PartitionStore]) -> Result<(), StoreError> {
    use std::io::Write;
    for s in stores.iter_mut() { s.f.write_all(&s.pending)?; s.pending.clear(); s.f.sync_data()?; }
    Ok(())
}
