//! A batch whose bytes were verified, owning them: the proof that lets the
//! one full check (body checksum, records) be the only one on a path that
//! hands the batch on (the server's replica to its store).

use super::{restamp, BatchError, BatchHeader, BatchView, Stamp};

/// A batch that passed [`BatchView::parse`], holding its buffer `B`. Only
/// [`VerifiedBatch::parse`] makes one, and its bytes change only through
/// [`VerifiedBatch::restamp`] (which rewrites the header and keeps the
/// verified body), so holding one proves the bytes are well-formed.
#[derive(Debug, Clone)]
pub struct VerifiedBatch<B> {
    bytes: B,
    header: BatchHeader,
}

impl<B: AsRef<[u8]>> VerifiedBatch<B> {
    /// Verifies the batch at the start of `bytes` as [`BatchView::parse`]
    /// does (bytes past it are ignored); gives `bytes` back on failure.
    pub fn parse(bytes: B) -> Result<Self, (BatchError, B)> {
        let header = match BatchView::parse(bytes.as_ref()) {
            Ok(view) => *view.header(),
            Err(e) => return Err((e, bytes)),
        };
        debug_assert!(header.total_len() <= bytes.as_ref().len());
        Ok(Self { bytes, header })
    }

    #[inline]
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Exactly `header().total_len()` bytes: header and body.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        let all = self.bytes.as_ref();
        all.get(..self.header.total_len()).unwrap_or(all)
    }

    /// The same proof over borrowed bytes.
    pub fn borrowed(&self) -> VerifiedBatch<&[u8]> {
        VerifiedBatch {
            bytes: self.as_bytes(),
            header: self.header,
        }
    }

    /// The buffer, giving up the proof.
    pub fn into_inner(self) -> B {
        self.bytes
    }

    /// Keeps the proof while the same bytes change owner type (a buffer
    /// moved out of an enum): `f` moves the buffer, or hands it back
    /// unchanged. Panics if the bytes `f` returns are not the very ones
    /// verified (same address and length): `f` may not copy or rewrite.
    pub fn try_map<C: AsRef<[u8]>>(
        self,
        f: impl FnOnce(B) -> Result<C, B>,
    ) -> Result<VerifiedBatch<C>, Self> {
        let (at, len) = (self.as_bytes().as_ptr(), self.header.total_len());
        let header = self.header;
        let same = |bytes: &[u8]| bytes.as_ptr() == at && bytes.len() >= len;
        match f(self.bytes) {
            Ok(bytes) => {
                assert!(same(bytes.as_ref()), "try_map moved the verified bytes");
                Ok(VerifiedBatch { bytes, header })
            }
            Err(bytes) => {
                assert!(same(bytes.as_ref()), "try_map moved the verified bytes");
                Err(VerifiedBatch { bytes, header })
            }
        }
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> VerifiedBatch<B> {
    /// [`restamp`]s the header in place: the body, verified, is untouched.
    /// On failure nothing changed.
    pub fn restamp(&mut self, stamp: &Stamp) -> Result<BatchHeader, BatchError> {
        let header = restamp(self.bytes.as_mut(), stamp)?;
        debug_assert_eq!(header.body_checksum, self.header.body_checksum);
        debug_assert_eq!(header.total_len(), self.header.total_len());
        self.header = header;
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchBuilder, Record};

    /// Another owner type for the same buffer.
    struct Owner(Vec<u8>);

    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    fn batch() -> Vec<u8> {
        let mut b = BatchBuilder::new(4);
        b.push(&Record {
            key: b"k",
            headers: &[],
            value: b"value",
            timestamp_ms: 3,
        })
        .unwrap();
        b.finish(&Stamp::default()).unwrap()
    }

    #[test]
    fn only_valid_batches_are_verified_and_restamping_keeps_them_valid() {
        let good = batch();
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let (e, back) = VerifiedBatch::parse(bad.clone()).unwrap_err();
        assert!(matches!(e, BatchError::BodyChecksum { .. }), "{e:?}");
        assert_eq!(back, bad, "the bytes come back on failure");

        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 10]);
        let mut v = VerifiedBatch::parse(padded).unwrap();
        assert_eq!(v.as_bytes(), &good[..]);
        let stamp = Stamp {
            base_offset: 10,
            vsr_op: 2,
            vsr_view: 1,
            prev_checksum: 99,
        };
        let h = v.restamp(&stamp).unwrap();
        assert_eq!((h.base_offset, h.prev_checksum), (10, 99));
        assert_eq!(v.header(), &h);
        // What the proof says holds of the bytes it guards.
        let borrowed = v.borrowed();
        let view = BatchView::parse(borrowed.as_bytes()).unwrap();
        assert_eq!(view.header(), &h);
        assert_eq!(v.borrowed().header(), &h);
        // A refused restamp (offsets past u64) changes nothing.
        let before = v.as_bytes().to_vec();
        let far = Stamp {
            base_offset: u64::MAX,
            ..stamp
        };
        assert!(v.restamp(&far).is_err());
        assert_eq!(v.as_bytes(), &before[..]);
        assert_eq!(v.header(), &h);
        // The proof follows the bytes to another owner, and comes back.
        let moved = v.try_map(|b| Ok::<_, Vec<u8>>(Owner(b))).unwrap();
        assert_eq!(moved.as_bytes(), &before[..]);
        let back = moved.try_map(Err::<Vec<u8>, _>).unwrap_err();
        assert_eq!(back.header(), &h);
    }

    #[test]
    #[should_panic(expected = "moved the verified bytes")]
    fn a_map_that_copies_the_bytes_is_refused() {
        let v = VerifiedBatch::parse(batch()).unwrap();
        let _ = v.try_map(|b| Ok::<_, Vec<u8>>(b.clone()));
    }
}
