/// A validated idempotency key.
///
/// The IETF draft sends the key as a Structured Field string (`Idempotency-Key: "8e03…"`);
/// Stripe and most clients send the bare value (`Idempotency-Key: 8e03…`). Both are accepted:
/// [`IdempotencyKey::parse_header`] strips the quotes and escapes of the first form. The key
/// itself must be 1 to 255 printable ASCII characters (Stripe's limit), since it is stored and
/// echoed in error messages.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a key was refused (the IETF draft's 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No characters.
    #[error("the idempotency key is empty")]
    Empty,
    /// More than 255 characters.
    #[error("the idempotency key is longer than 255 characters")]
    TooLong,
    /// A control character or a non-ASCII byte.
    #[error("the idempotency key may only hold printable ASCII characters")]
    BadCharacter,
    /// A quoted form with a stray quote or backslash.
    #[error("the idempotency key is not a well-formed structured-field string")]
    BadQuoting,
}

/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

impl IdempotencyKey {
    /// A key given as a plain value (no quoting rules applied).
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        if !key.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(KeyError::BadCharacter);
        }
        Ok(IdempotencyKey(key))
    }

    /// A key from the raw bytes of an `Idempotency-Key` header: either a Structured Field
    /// string (`"abc"`, with `\"` and `\\` escapes) or a bare value; surrounding spaces are
    /// ignored.
    pub fn parse_header(raw: &[u8]) -> Result<Self, KeyError> {
        let raw = std::str::from_utf8(raw).map_err(|_| KeyError::BadCharacter)?;
        let raw = raw.trim_matches(' ');
        let Some(inner) = raw.strip_prefix('"') else {
            return Self::new(raw);
        };
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        loop {
            match chars.next() {
                None => return Err(KeyError::BadQuoting),
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some(c @ ('"' | '\\')) => out.push(c),
                    _ => return Err(KeyError::BadQuoting),
                },
                Some(c) => out.push(c),
            }
        }
        if chars.next().is_some() {
            return Err(KeyError::BadQuoting);
        }
        Self::new(out)
    }

    /// The key's characters.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_forms() {
        assert_eq!(
            IdempotencyKey::parse_header(b"abc-1").unwrap().as_str(),
            "abc-1"
        );
        assert_eq!(
            IdempotencyKey::parse_header(b" \"abc 1\" ")
                .unwrap()
                .as_str(),
            "abc 1"
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""a\"b\\c""#)
                .unwrap()
                .as_str(),
            r#"a"b\c"#
        );
        assert_eq!(
            IdempotencyKey::parse_header(b"\"abc").unwrap_err(),
            KeyError::BadQuoting
        );
        assert_eq!(
            IdempotencyKey::parse_header(b"\"a\"b").unwrap_err(),
            KeyError::BadQuoting
        );
        assert_eq!(
            IdempotencyKey::parse_header(br#""a\nb""#).unwrap_err(),
            KeyError::BadQuoting
        );
        assert_eq!(
            IdempotencyKey::parse_header(b"\"\"").unwrap_err(),
            KeyError::Empty
        );
    }

    #[test]
    fn limits() {
        assert_eq!(IdempotencyKey::new("").unwrap_err(), KeyError::Empty);
        assert!(IdempotencyKey::new("k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::new("k".repeat(256)).unwrap_err(),
            KeyError::TooLong
        );
        assert_eq!(
            IdempotencyKey::new("a\tb").unwrap_err(),
            KeyError::BadCharacter
        );
        assert_eq!(
            IdempotencyKey::new("ключ").unwrap_err(),
            KeyError::BadCharacter
        );
    }
}
