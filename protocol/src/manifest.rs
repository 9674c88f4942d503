//! The snapshot manifest: what a serving replica offers in state transfer.
//!
//! It names the serving partition's VSR commit, its frontier (next offset,
//! op and checksum of the last batch), its durable purge generation and the
//! artifacts a receiver must pull: for each, its kind, offset range, length,
//! the xxh3 of every fixed-size chunk, so each chunk is verified the moment
//! it arrives, and the artifact checksum (xxh3 over the chunk checksums).
//!
//! Layout (little-endian):
//! ```text
//! header (header_len bytes, 88 in version 2):
//!   0 magic u32 "RLGM"   4 version u16        6 header_len u16
//!   8 partition_id u32  12 view u32          16 commit u64
//!  24 next_offset u64   32 last_op u64       40 last_checksum u64
//!  48 purge_generation u64                   56 snapshot_id u64
//!  64 chunk_size_bytes u32                   68 artifact_count u32
//!  72 total_length_bytes u64                 80 reserved u64 (0)
//! artifact_count x artifact:
//!   0 entry_len u16 (64 in version 2)  2 kind u8  3 reserved [u8;5]
//!   8 base_offset u64  16 end_offset u64  24 length_bytes u64
//!  32 checksum u64     40 last_batch_checksum u64  48 max_timestamp_ms u64
//!  56 chunk_count u32  60 reserved u32
//!   then chunk_count x u64 chunk checksums
//! trailer: checksum u64 of every byte before it
//! ```
//! Version 1 had the same layout, but its artifact checksum was the xxh3 of
//! the artifact's bytes; version 2's is the xxh3 of its chunk checksums. A
//! decoder accepts exactly [`MANIFEST_VERSION`]: even a version that only
//! appends fields may change what a known one means, as version 2 did.
//! Later versions still only add fields at the end of the header or of an
//! artifact entry and raise `header_len` / `entry_len`, so a version-aware
//! decoder can skip what it does not need. Every count and size is checked
//! against [`ManifestLimits`] before anything is allocated.

use thiserror::Error;

use crate::checksum::checksum;
use crate::reader::Reader;

const MAGIC: u32 = u32::from_le_bytes(*b"RLGM");
pub const MANIFEST_VERSION: u16 = 2;
const HEADER_LEN: u16 = 88;
const ENTRY_LEN: u16 = 64;

/// What an artifact is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ArtifactKind {
    /// A sealed log segment (its bytes `[0, length_bytes)`).
    Segment = 1,
}

impl ArtifactKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(ArtifactKind::Segment),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    pub kind: ArtifactKind,
    pub base_offset: u64,
    /// One past the last offset.
    pub end_offset: u64,
    pub length_bytes: u64,
    pub checksum: u64,
    pub last_batch_checksum: u64,
    pub max_timestamp_ms: u64,
    /// xxh3 of each `chunk_size_bytes` slice; the last may be shorter.
    pub chunk_checksums: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub partition_id: u32,
    pub view: u32,
    pub commit: u64,
    pub next_offset: u64,
    pub last_op: u64,
    pub last_checksum: u64,
    pub purge_generation: u64,
    /// The server's handle for chunk requests.
    pub snapshot_id: u64,
    /// A multiple of 4096, so chunks land on disk with O_DIRECT as they are.
    pub chunk_size_bytes: u32,
    pub artifacts: Vec<Artifact>,
}

/// Hard caps a receiver enforces before allocating anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestLimits {
    pub artifacts_max: u32,
    pub artifact_length_bytes_max: u64,
    pub chunk_size_bytes_min: u32,
    pub chunk_size_bytes_max: u32,
    pub manifest_bytes_max: usize,
}

impl Default for ManifestLimits {
    fn default() -> Self {
        Self {
            artifacts_max: 1024,
            artifact_length_bytes_max: 4 << 30,
            chunk_size_bytes_min: 4096,
            chunk_size_bytes_max: 16 << 20,
            manifest_bytes_max: 16 << 20,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ManifestError {
    #[error("manifest truncated in {field}")]
    Truncated { field: &'static str },
    #[error("manifest of {len} bytes exceeds the cap {max}")]
    TooLarge { len: usize, max: usize },
    #[error("bad manifest magic {0:#x}")]
    BadMagic(u32),
    #[error("unsupported manifest version {0}")]
    UnsupportedVersion(u16),
    #[error("manifest {field} length {len} is below this version's {min}")]
    ShortSection {
        field: &'static str,
        len: u16,
        min: u16,
    },
    #[error("manifest checksum {actual:#x}, stored {expected:#x}")]
    Checksum { expected: u64, actual: u64 },
    #[error("manifest {field} = {value} outside [{min}, {max}]")]
    OutOfRange {
        field: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error("chunk size {0} is not a multiple of 4096")]
    UnalignedChunkSize(u32),
    #[error("artifact {index}: unknown kind {kind}")]
    UnknownKind { index: u32, kind: u8 },
    #[error("artifact {index}: {chunks} chunks do not cover {length_bytes} bytes in chunks of {chunk_size_bytes}")]
    ChunkCount {
        index: u32,
        chunks: u32,
        length_bytes: u64,
        chunk_size_bytes: u32,
    },
    #[error("artifact {index}: offsets [{base_offset}, {end_offset}) are empty or do not follow the previous artifact")]
    NotContiguous {
        index: u32,
        base_offset: u64,
        end_offset: u64,
    },
    #[error("artifacts end at {artifacts_end}, the frontier is {next_offset}")]
    FrontierMismatch {
        artifacts_end: u64,
        next_offset: u64,
    },
    #[error("total length {declared} differs from the artifacts' {actual}")]
    TotalLength { declared: u64, actual: u64 },
    #[error("manifest has {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("reserved manifest bytes are not zero")]
    NonZeroReserved,
}

fn truncated(field: &'static str) -> ManifestError {
    ManifestError::Truncated { field }
}

fn check_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ManifestError> {
    if value < min || value > max {
        return Err(ManifestError::OutOfRange {
            field,
            value,
            min,
            max,
        });
    }
    Ok(())
}

impl Manifest {
    /// Bytes of the artifacts together.
    pub fn total_length_bytes(&self) -> u64 {
        self.artifacts.iter().map(|a| a.length_bytes).sum()
    }

    /// The number of chunks covering `length_bytes`.
    pub fn chunk_count(length_bytes: u64, chunk_size_bytes: u32) -> u64 {
        length_bytes.div_ceil(u64::from(chunk_size_bytes))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        out.extend_from_slice(&HEADER_LEN.to_le_bytes());
        out.extend_from_slice(&self.partition_id.to_le_bytes());
        out.extend_from_slice(&self.view.to_le_bytes());
        for v in [
            self.commit,
            self.next_offset,
            self.last_op,
            self.last_checksum,
            self.purge_generation,
            self.snapshot_id,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.chunk_size_bytes.to_le_bytes());
        out.extend_from_slice(&(self.artifacts.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.total_length_bytes().to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        debug_assert_eq!(out.len(), usize::from(HEADER_LEN));
        for a in &self.artifacts {
            out.extend_from_slice(&ENTRY_LEN.to_le_bytes());
            out.push(a.kind as u8);
            out.extend_from_slice(&[0; 5]);
            for v in [
                a.base_offset,
                a.end_offset,
                a.length_bytes,
                a.checksum,
                a.last_batch_checksum,
                a.max_timestamp_ms,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&(a.chunk_checksums.len() as u32).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            for c in &a.chunk_checksums {
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes and validates a manifest: checksum, limits, chunk counts,
    /// contiguous non-empty offset ranges ending at the frontier.
    pub fn decode(bytes: &[u8], limits: &ManifestLimits) -> Result<Manifest, ManifestError> {
        if bytes.len() > limits.manifest_bytes_max {
            return Err(ManifestError::TooLarge {
                len: bytes.len(),
                max: limits.manifest_bytes_max,
            });
        }
        let body_len = bytes.len().checked_sub(8).ok_or(truncated("trailer"))?;
        let (body, trailer) = bytes.split_at(body_len);
        let mut r = Reader::new(body);
        let magic = r.u32().ok_or(truncated("magic"))?;
        if magic != MAGIC {
            return Err(ManifestError::BadMagic(magic));
        }
        let version = r.u16().ok_or(truncated("version"))?;
        if version != MANIFEST_VERSION {
            return Err(ManifestError::UnsupportedVersion(version));
        }
        let stored = u64::from_le_bytes(trailer.try_into().map_err(|_| truncated("trailer"))?);
        let actual = checksum(body);
        if stored != actual {
            return Err(ManifestError::Checksum {
                expected: stored,
                actual,
            });
        }
        let header_len = r.u16().ok_or(truncated("header_len"))?;
        if header_len < HEADER_LEN {
            return Err(ManifestError::ShortSection {
                field: "header",
                len: header_len,
                min: HEADER_LEN,
            });
        }
        let field = |r: &mut Reader, name| r.u64().ok_or(truncated(name));
        let partition_id = r.u32().ok_or(truncated("partition_id"))?;
        let view = r.u32().ok_or(truncated("view"))?;
        let commit = field(&mut r, "commit")?;
        let next_offset = field(&mut r, "next_offset")?;
        let last_op = field(&mut r, "last_op")?;
        let last_checksum = field(&mut r, "last_checksum")?;
        let purge_generation = field(&mut r, "purge_generation")?;
        let snapshot_id = field(&mut r, "snapshot_id")?;
        let chunk_size_bytes = r.u32().ok_or(truncated("chunk_size"))?;
        let artifact_count = r.u32().ok_or(truncated("artifact_count"))?;
        let total_length = field(&mut r, "total_length")?;
        if field(&mut r, "reserved")? != 0 {
            return Err(ManifestError::NonZeroReserved);
        }
        r.take(usize::from(header_len - HEADER_LEN))
            .ok_or(truncated("header extension"))?;
        check_range(
            "chunk_size_bytes",
            u64::from(chunk_size_bytes),
            u64::from(limits.chunk_size_bytes_min),
            u64::from(limits.chunk_size_bytes_max),
        )?;
        if chunk_size_bytes % 4096 != 0 {
            return Err(ManifestError::UnalignedChunkSize(chunk_size_bytes));
        }
        check_range(
            "artifact_count",
            u64::from(artifact_count),
            0,
            u64::from(limits.artifacts_max),
        )?;
        // Each entry takes at least ENTRY_LEN bytes: a count the bytes
        // cannot hold is refused before the Vec is sized by it.
        if u64::from(artifact_count) * u64::from(ENTRY_LEN) > r.remaining() as u64 {
            return Err(truncated("artifacts"));
        }
        let mut artifacts = Vec::with_capacity(artifact_count as usize);
        let mut expected_base: Option<u64> = None;
        for index in 0..artifact_count {
            let entry_len = r.u16().ok_or(truncated("entry_len"))?;
            if entry_len < ENTRY_LEN {
                return Err(ManifestError::ShortSection {
                    field: "artifact",
                    len: entry_len,
                    min: ENTRY_LEN,
                });
            }
            let kind_byte = r.u8().ok_or(truncated("kind"))?;
            let kind = ArtifactKind::from_u8(kind_byte).ok_or(ManifestError::UnknownKind {
                index,
                kind: kind_byte,
            })?;
            if r.take(5).ok_or(truncated("reserved"))? != [0; 5] {
                return Err(ManifestError::NonZeroReserved);
            }
            let base_offset = field(&mut r, "base_offset")?;
            let end_offset = field(&mut r, "end_offset")?;
            let length_bytes = field(&mut r, "length_bytes")?;
            let artifact_checksum = field(&mut r, "checksum")?;
            let last_batch_checksum = field(&mut r, "last_batch_checksum")?;
            let max_timestamp_ms = field(&mut r, "max_timestamp_ms")?;
            let chunks = r.u32().ok_or(truncated("chunk_count"))?;
            if r.u32().ok_or(truncated("reserved"))? != 0 {
                return Err(ManifestError::NonZeroReserved);
            }
            r.take(usize::from(entry_len - ENTRY_LEN))
                .ok_or(truncated("artifact extension"))?;
            check_range(
                "length_bytes",
                length_bytes,
                1,
                limits.artifact_length_bytes_max,
            )?;
            if u64::from(chunks) != Self::chunk_count(length_bytes, chunk_size_bytes) {
                return Err(ManifestError::ChunkCount {
                    index,
                    chunks,
                    length_bytes,
                    chunk_size_bytes,
                });
            }
            if end_offset <= base_offset || expected_base.is_some_and(|b| b != base_offset) {
                return Err(ManifestError::NotContiguous {
                    index,
                    base_offset,
                    end_offset,
                });
            }
            expected_base = Some(end_offset);
            let sums = r
                .take(chunks as usize * 8)
                .ok_or(truncated("chunk checksums"))?;
            let chunk_checksums = sums
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            artifacts.push(Artifact {
                kind,
                base_offset,
                end_offset,
                length_bytes,
                checksum: artifact_checksum,
                last_batch_checksum,
                max_timestamp_ms,
                chunk_checksums,
            });
        }
        if r.remaining() != 0 {
            return Err(ManifestError::TrailingBytes(r.remaining()));
        }
        if let Some(end) = expected_base {
            if end != next_offset {
                return Err(ManifestError::FrontierMismatch {
                    artifacts_end: end,
                    next_offset,
                });
            }
        }
        let manifest = Manifest {
            partition_id,
            view,
            commit,
            next_offset,
            last_op,
            last_checksum,
            purge_generation,
            snapshot_id,
            chunk_size_bytes,
            artifacts,
        };
        if manifest.total_length_bytes() != total_length {
            return Err(ManifestError::TotalLength {
                declared: total_length,
                actual: manifest.total_length_bytes(),
            });
        }
        Ok(manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            partition_id: 4,
            view: 2,
            commit: 90,
            next_offset: 300,
            last_op: 301,
            last_checksum: 0xdead,
            purge_generation: 3,
            snapshot_id: 17,
            chunk_size_bytes: 8192,
            artifacts: vec![
                Artifact {
                    kind: ArtifactKind::Segment,
                    base_offset: 100,
                    end_offset: 200,
                    length_bytes: 20_000,
                    checksum: 1,
                    last_batch_checksum: 2,
                    max_timestamp_ms: 3,
                    chunk_checksums: vec![11, 12, 13],
                },
                Artifact {
                    kind: ArtifactKind::Segment,
                    base_offset: 200,
                    end_offset: 300,
                    length_bytes: 8192,
                    checksum: 4,
                    last_batch_checksum: 0xdead,
                    max_timestamp_ms: 6,
                    chunk_checksums: vec![14],
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let decoded = Manifest::decode(&m.encode(), &ManifestLimits::default()).unwrap();
        assert_eq!(decoded, m);
        let empty = Manifest {
            artifacts: vec![],
            ..sample()
        };
        let decoded = Manifest::decode(&empty.encode(), &ManifestLimits::default()).unwrap();
        assert_eq!(decoded, empty);
    }

    #[test]
    fn every_flip_and_truncation_is_rejected() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x04;
            assert!(
                Manifest::decode(&bad, &ManifestLimits::default()).is_err(),
                "flip at {i}"
            );
        }
        for len in 0..bytes.len() {
            assert!(
                Manifest::decode(&bytes[..len], &ManifestLimits::default()).is_err(),
                "cut at {len}"
            );
        }
    }

    /// Re-encodes `m` with a valid checksum over whatever the fields say, so
    /// the semantic checks (not the checksum) must catch the problem.
    fn decode_fixed(m: &Manifest, limits: &ManifestLimits) -> Result<Manifest, ManifestError> {
        Manifest::decode(&m.encode(), limits)
    }

    #[test]
    fn semantic_refusals() {
        let limits = ManifestLimits::default();
        let mut m = sample();
        m.artifacts[1].base_offset = 210;
        assert!(matches!(
            decode_fixed(&m, &limits),
            Err(ManifestError::NotContiguous { index: 1, .. })
        ));
        let mut m = sample();
        m.artifacts[0].chunk_checksums.pop();
        assert!(matches!(
            decode_fixed(&m, &limits),
            Err(ManifestError::ChunkCount { index: 0, .. })
        ));
        let mut m = sample();
        m.next_offset = 301;
        assert!(matches!(
            decode_fixed(&m, &limits),
            Err(ManifestError::FrontierMismatch { .. })
        ));
        let mut m = sample();
        m.chunk_size_bytes = 5000;
        m.artifacts.clear();
        assert!(matches!(
            decode_fixed(&m, &limits),
            Err(ManifestError::UnalignedChunkSize(5000))
        ));
        let small = ManifestLimits {
            artifacts_max: 1,
            ..limits
        };
        assert!(matches!(
            decode_fixed(&sample(), &small),
            Err(ManifestError::OutOfRange {
                field: "artifact_count",
                ..
            })
        ));
        let small = ManifestLimits {
            artifact_length_bytes_max: 10_000,
            ..limits
        };
        assert!(matches!(
            decode_fixed(&sample(), &small),
            Err(ManifestError::OutOfRange {
                field: "length_bytes",
                ..
            })
        ));
        let small = ManifestLimits {
            manifest_bytes_max: 100,
            ..limits
        };
        assert!(matches!(
            decode_fixed(&sample(), &small),
            Err(ManifestError::TooLarge { .. })
        ));
    }

    #[test]
    fn other_versions_are_refused() {
        for version in [0, 1, MANIFEST_VERSION + 1, u16::MAX] {
            let mut bytes = sample().encode();
            bytes[4..6].copy_from_slice(&version.to_le_bytes());
            let n = bytes.len() - 8;
            let sum = checksum(&bytes[..n]);
            bytes[n..].copy_from_slice(&sum.to_le_bytes());
            assert_eq!(
                Manifest::decode(&bytes, &ManifestLimits::default()),
                Err(ManifestError::UnsupportedVersion(version)),
                "version {version}"
            );
        }
    }

    #[test]
    fn unknown_kind_is_refused() {
        let mut bytes = sample().encode();
        bytes[usize::from(HEADER_LEN) + 2] = 9;
        let n = bytes.len() - 8;
        let sum = checksum(&bytes[..n]);
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
        assert!(matches!(
            Manifest::decode(&bytes, &ManifestLimits::default()),
            Err(ManifestError::UnknownKind { index: 0, kind: 9 })
        ));
    }

    #[test]
    fn huge_count_is_refused_before_allocation() {
        let mut m = sample();
        m.artifacts.clear();
        m.next_offset = 0;
        let mut bytes = m.encode();
        // artifact_count at byte 68 claims far more entries than the bytes hold.
        bytes[68..72].copy_from_slice(&1000u32.to_le_bytes());
        let n = bytes.len() - 8;
        let sum = checksum(&bytes[..n]);
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
        assert!(matches!(
            Manifest::decode(&bytes, &ManifestLimits::default()),
            Err(ManifestError::Truncated { field: "artifacts" })
        ));
    }
}
