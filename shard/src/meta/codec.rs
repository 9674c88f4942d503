//! The little-endian cursor the command and snapshot decoders share: every
//! read is bounds-checked and says what it was reading, so a short input
//! is a typed error naming the field, never a panic.

/// Ran out of bytes reading `field`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short {
    pub field: &'static str,
    pub needed: usize,
    pub available: usize,
}

pub struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    pub fn take(&mut self, field: &'static str, len: usize) -> Result<&'a [u8], Short> {
        let short = Short {
            field,
            needed: len,
            available: self.bytes.len(),
        };
        let (head, rest) = self.bytes.split_at_checked(len).ok_or(short)?;
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], Short> {
        let head = self.take(field, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(head);
        Ok(out)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, Short> {
        self.array::<1>(field).map(|[b]| b)
    }

    pub fn u16(&mut self, field: &'static str) -> Result<u16, Short> {
        self.array(field).map(u16::from_le_bytes)
    }

    pub fn u32(&mut self, field: &'static str) -> Result<u32, Short> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, field: &'static str) -> Result<u64, Short> {
        self.array(field).map(u64::from_le_bytes)
    }
}

/// Appends `name` with its u16 length. Callers bound the name first
/// (names are at most `TOPIC_NAME_BYTES_MAX`), so the length fits.
pub fn put_name(out: &mut Vec<u8>, name: &str) {
    debug_assert!(name.len() <= usize::from(u16::MAX));
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// Reads a u16-length name, its length checked against `bytes_max` before
/// the bytes are taken, as UTF-8.
pub fn get_name<'a>(c: &mut Cursor<'a>, bytes_max: usize) -> Result<&'a str, NameError> {
    let len = usize::from(c.u16("name length").map_err(NameError::Short)?);
    if len > bytes_max {
        return Err(NameError::TooLong { len, bytes_max });
    }
    let bytes = c.take("name", len).map_err(NameError::Short)?;
    std::str::from_utf8(bytes).map_err(|_| NameError::Utf8)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameError {
    Short(Short),
    TooLong { len: usize, bytes_max: usize },
    Utf8,
}
