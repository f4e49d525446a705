//! A Rust tokenizer just good enough to find paths: identifiers and punctuation with their
//! line numbers, with comments, string, char and byte literals dropped.
//!
//! The checks only need to know where an identifier is followed by `::` (a path) or sits in
//! a `use` tree, so this does not build a syntax tree. Dropping comments and literals is what
//! matters: a doc comment saying "`crate::wal` does X" or a log message naming a module must
//! not count as a use. Pulling in `syn` for this would cost CI a proc-macro-sized build for
//! every `cargo test --workspace`.

/// One token: an identifier (or keyword), `::`, or any other single punctuation character.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or keyword; a raw identifier `r#x` is `x`.
    Ident(String),
    /// `::`.
    PathSep,
    /// Any other punctuation character (`{`, `}`, `;`, `*`, `<`, `#`, `!`, …).
    Punct(char),
}

/// A token and the 1-based line it starts on (for reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// The token.
    pub tok: Tok,
    /// Its line, counting from 1.
    pub line: u32,
}

impl Token {
    /// The identifier, if this is one.
    pub fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this is the punctuation character `c`.
    pub fn is(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }
}

/// Splits `src` into tokens; numbers and literals are skipped (they never start a path).
pub fn tokenize(src: &str) -> Vec<Token> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1u32;
    let count = |s: &[char]| s.iter().filter(|&&c| c == '\n').count() as u32;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count(&b[start..i.min(b.len())]);
        } else if let Some(end) = raw_string_end(&b, i) {
            line += count(&b[start..end]);
            i = end;
        } else if c == '"' || (c == 'b' && b.get(i + 1) == Some(&'"')) {
            i += if c == 'b' { 2 } else { 1 };
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            line += count(&b[start..i.min(b.len())]);
        } else if c == '\'' || (c == 'b' && b.get(i + 1) == Some(&'\'')) {
            // A char literal ('x', '\n', '\u{1F600}', b'x') or a lifetime ('a, 'static).
            let q = if c == 'b' { i + 1 } else { i };
            if b.get(q + 1) == Some(&'\\') {
                let mut j = q + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if b.get(q + 2) == Some(&'\'') {
                i = q + 3;
            } else {
                // A lifetime or label: skip the quote; the name that follows is harmless.
                i = q + 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let mut j = i;
            while j < b.len() && (b[j].is_alphanumeric() || b[j] == '_') {
                j += 1;
            }
            let mut word: String = b[i..j].iter().collect();
            if word == "r" && b.get(j) == Some(&'#') {
                let mut k = j + 1;
                while k < b.len() && (b[k].is_alphanumeric() || b[k] == '_') {
                    k += 1;
                }
                word = b[j + 1..k].iter().collect();
                j = k;
            }
            out.push(Token {
                tok: Tok::Ident(word),
                line,
            });
            i = j;
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(Token {
                tok: Tok::PathSep,
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// If a raw string literal (`r"…"`, `r#"…"#`, `br#"…"#`) starts at `i`, the index after it.
fn raw_string_end(b: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if b.get(j) == Some(&'b') {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    // `r` must start a token, not end an identifier such as `bar"`.
    if i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if b.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < b.len() {
        if b[j] == '"' && (1..=hashes).all(|h| b.get(j + h) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        tokenize(src)
            .into_iter()
            .filter_map(|t| t.ident().map(str::to_owned))
            .collect()
    }

    #[test]
    fn comments_and_literals_are_not_tokens() {
        let src = r###"
            // crate::a
            /* crate::b /* nested */ crate::c */
            let s = "crate::d \" crate::e";
            let r = r#"crate::f "quoted""#;
            let c = '"'; let l: &'static str = x; let e = '\'';
            real::path
        "###;
        assert_eq!(
            idents(src),
            [
                "let", "s", "let", "r", "let", "c", "let", "l", "static", "str", "x", "let", "e",
                "real", "path"
            ]
        );
    }

    #[test]
    fn lines_are_counted_through_multi_line_literals() {
        let toks = tokenize("a\n\"x\ny\"\n/* \n */ b");
        assert_eq!(toks.last().map(|t| t.line), Some(5));
    }
}
