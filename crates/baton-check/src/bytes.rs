//! Byte strings for keys and values, printed so that a human can read a failure report.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An etcd key or value: arbitrary bytes.
///
/// A newtype rather than a bare `Vec<u8>` so that reports print `"lock/a"` instead of
/// `[108, 111, ...]`: printable UTF-8 is shown quoted, anything else as hex. Ordering is
/// bytewise, as in etcd, so per-key reports come out in key order.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    /// The raw bytes, for comparisons against data taken from a client library.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// Whether these bytes start with `prefix`; watch ranges and lock names are prefixes.
    pub fn starts_with(&self, prefix: &[u8]) -> bool {
        self.0.starts_with(prefix)
    }
}

impl From<&str> for Bytes {
    fn from(s: &str) -> Self {
        Bytes(s.as_bytes().to_vec())
    }
}

impl From<String> for Bytes {
    fn from(s: String) -> Self {
        Bytes(s.into_bytes())
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(v)
    }
}

impl From<&[u8]> for Bytes {
    fn from(v: &[u8]) -> Self {
        Bytes(v.to_vec())
    }
}

impl<const N: usize> From<&[u8; N]> for Bytes {
    fn from(v: &[u8; N]) -> Self {
        Bytes(v.to_vec())
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(s) if !s.chars().any(char::is_control) => write!(f, "{s:?}"),
            _ => {
                f.write_str("0x")?;
                for b in &self.0 {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::Bytes;

    #[test]
    fn prints_text_quoted_and_binary_as_hex() {
        assert_eq!(Bytes::from("a/b").to_string(), "\"a/b\"");
        assert_eq!(Bytes::from(&[0u8, 255]).to_string(), "0x00ff");
        assert_eq!(Bytes::default().to_string(), "\"\"");
    }
}
