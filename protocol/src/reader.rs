//! Panic-free little-endian cursor. `None` means "not enough bytes"; callers
//! attach context when turning that into a [`super::BatchError`].

#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    #[inline]
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    #[inline]
    pub(crate) fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.bytes.split_at_checked(len)?;
        self.bytes = rest;
        Some(head)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_first_chunk::<N>()?;
        self.bytes = rest;
        Some(*head)
    }

    #[inline]
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.array().map(|[b]: [u8; 1]| b)
    }

    /// A `u32` length prefix followed by that many bytes.
    #[inline]
    pub(crate) fn bytes_u32(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()?;
        self.take(usize_from(len))
    }

    /// A `u16` length prefix followed by that many bytes.
    #[inline]
    pub(crate) fn bytes_u16(&mut self) -> Option<&'a [u8]> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }
}

/// Lossless on every target we build for (usize >= 32 bits); `try_from`
/// would only add an unreachable error path on the hot path.
#[inline]
pub(crate) const fn usize_from(x: u32) -> usize {
    x as usize
}
