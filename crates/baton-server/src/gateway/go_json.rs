//! JSON as etcd's gateway reads it: Go's `encoding/json` (go1.19, which etcd 3.4.23 is built
//! with), down to the words of its errors.
//!
//! **Why not serde_json for reading.** A client of the gateway sees Go's error texts
//! (`invalid character 'x' after object key:value pair`, `unexpected EOF`) in the body of a
//! 400, and etcd's e2e tests and client libraries compare them; serde_json's errors carry a
//! different classification and a line/column, from which Go's wording (which names the
//! scanner's state) cannot be recovered. Go also accepts what serde_json refuses (lone
//! surrogate escapes become U+FFFD, values nest 10,000 deep, a stream of values needs no
//! separator) and stops where serde_json would not (a body is one value; what follows is
//! never looked at). So this module is Go's scanner — its states and their error words —
//! over bytes, plus the few reads the decoder needs from a value it accepted (members of an
//! object, elements of an array, a string's text). It decides syntax only; what a value
//! means for a field is `decode.rs`'s, and writing JSON stays serde_json's (`encode.rs`).
//!
//! Every accepted body is scanned once, iteratively (no recursion however deep it nests), and
//! indexed once ([`Doc`]), so reading it costs time and memory linear in its size.

use std::fmt::Write as _;

/// Go's `maxNestingDepth`: deeper values are refused with "exceeded max depth".
pub const MAX_DEPTH: usize = 10_000;

/// What a JSON value is, from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl Kind {
    /// The kind of the value starting at `first` (a byte the scanner accepted there).
    pub fn of(first: u8) -> Kind {
        match first {
            b'{' => Kind::Object,
            b'[' => Kind::Array,
            b'"' => Kind::String,
            b't' | b'f' => Kind::Bool,
            b'n' => Kind::Null,
            _ => Kind::Number,
        }
    }

    /// Go's word for the kind in "json: cannot unmarshal WORD into Go value of type T".
    pub fn go_word(self) -> &'static str {
        match self {
            Kind::Object => "object",
            Kind::Array => "array",
            Kind::String => "string",
            Kind::Number => "number",
            Kind::Bool => "bool",
            Kind::Null => "null",
        }
    }
}

/// Go's `UnmarshalTypeError` text for a value of `kind` that cannot go into Go type `go_type`.
/// `literal`: the number's text, which Go names only for integer targets.
pub fn type_error(kind: Kind, literal: Option<&[u8]>, go_type: &str) -> String {
    match literal {
        Some(l) => format!(
            "json: cannot unmarshal number {} into Go value of type {go_type}",
            String::from_utf8_lossy(l)
        ),
        None => format!(
            "json: cannot unmarshal {} into Go value of type {go_type}",
            kind.go_word()
        ),
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// A container the scanner is inside (Go's `parseState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parse {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

/// The scanner's state (Go's `step` functions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    BeginValue,
    BeginValueOrEmpty,
    BeginStringOrEmpty,
    BeginString,
    EndValue,
    EndTop,
    InString,
    InStringEsc,
    /// Inside `\u`: how many hex digits were read.
    InStringEscU(u8),
    Neg,
    One,
    Zero,
    Dot,
    Dot0,
    E,
    ESign,
    E0,
    /// Inside `true`, `false` or `null`: the word and how many of its bytes were read.
    Literal(&'static [u8], u8),
    Error,
}

/// What a byte did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Continue,
    /// The byte closed an object or array.
    Closed,
    /// The top-level value ended before this byte (Go's `scanEnd`).
    End,
    Error,
}

/// Go's JSON scanner, one byte at a time.
#[derive(Debug, Clone)]
struct Scanner {
    state: State,
    stack: Vec<Parse>,
    end_top: bool,
    err: Option<String>,
}

impl Scanner {
    fn new() -> Scanner {
        Scanner {
            state: State::BeginValue,
            stack: Vec::new(),
            end_top: false,
            err: None,
        }
    }

    fn error(&mut self, c: u8, context: &str) -> Op {
        self.state = State::Error;
        self.err = Some(format!("invalid character {} {context}", quote_char(c)));
        Op::Error
    }

    fn push(&mut self, c: u8, parse: Parse, next: State) -> Op {
        self.stack.push(parse);
        if self.stack.len() > MAX_DEPTH {
            return self.error(c, "exceeded max depth");
        }
        self.state = next;
        Op::Continue
    }

    fn pop(&mut self) {
        self.stack.pop();
        if self.stack.is_empty() {
            self.state = State::EndTop;
            self.end_top = true;
        } else {
            self.state = State::EndValue;
        }
    }

    fn step(&mut self, c: u8) -> Op {
        match self.state {
            State::BeginValueOrEmpty => {
                if is_space(c) {
                    Op::Continue
                } else if c == b']' {
                    self.end_value(c)
                } else {
                    self.begin_value(c)
                }
            }
            State::BeginValue => self.begin_value(c),
            State::BeginStringOrEmpty => {
                if is_space(c) {
                    Op::Continue
                } else if c == b'}' {
                    let top = self.stack.len() - 1;
                    self.stack[top] = Parse::ObjectValue;
                    self.end_value(c)
                } else {
                    self.begin_string(c)
                }
            }
            State::BeginString => self.begin_string(c),
            State::EndValue => self.end_value(c),
            State::EndTop => {
                if !is_space(c) {
                    // Go complains on the next call but ends the value here.
                    self.error(c, "after top-level value");
                }
                Op::End
            }
            State::InString => {
                match c {
                    b'"' => self.state = State::EndValue,
                    b'\\' => self.state = State::InStringEsc,
                    c if c < 0x20 => return self.error(c, "in string literal"),
                    _ => {}
                }
                Op::Continue
            }
            State::InStringEsc => match c {
                b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {
                    self.state = State::InString;
                    Op::Continue
                }
                b'u' => {
                    self.state = State::InStringEscU(0);
                    Op::Continue
                }
                _ => self.error(c, "in string escape code"),
            },
            State::InStringEscU(n) => {
                if !c.is_ascii_hexdigit() {
                    return self.error(c, "in \\u hexadecimal character escape");
                }
                self.state = if n == 3 {
                    State::InString
                } else {
                    State::InStringEscU(n + 1)
                };
                Op::Continue
            }
            State::Neg => match c {
                b'0' => {
                    self.state = State::Zero;
                    Op::Continue
                }
                b'1'..=b'9' => {
                    self.state = State::One;
                    Op::Continue
                }
                _ => self.error(c, "in numeric literal"),
            },
            State::One => {
                if c.is_ascii_digit() {
                    Op::Continue
                } else {
                    self.zero(c)
                }
            }
            State::Zero => self.zero(c),
            State::Dot => {
                if c.is_ascii_digit() {
                    self.state = State::Dot0;
                    Op::Continue
                } else {
                    self.error(c, "after decimal point in numeric literal")
                }
            }
            State::Dot0 => {
                if c.is_ascii_digit() {
                    Op::Continue
                } else if c == b'e' || c == b'E' {
                    self.state = State::E;
                    Op::Continue
                } else {
                    self.end_value(c)
                }
            }
            State::E => {
                if c == b'+' || c == b'-' {
                    self.state = State::ESign;
                    Op::Continue
                } else {
                    self.e_sign(c)
                }
            }
            State::ESign => self.e_sign(c),
            State::E0 => {
                if c.is_ascii_digit() {
                    Op::Continue
                } else {
                    self.end_value(c)
                }
            }
            State::Literal(word, read) => {
                let expected = word[read as usize];
                if c != expected {
                    let name = std::str::from_utf8(word).expect("ASCII word");
                    let context = format!("in literal {name} (expecting {})", quote_char(expected));
                    return self.error(c, &context);
                }
                let read = read + 1;
                self.state = if read as usize == word.len() {
                    State::EndValue
                } else {
                    State::Literal(word, read)
                };
                Op::Continue
            }
            State::Error => Op::Error,
        }
    }

    fn begin_value(&mut self, c: u8) -> Op {
        if is_space(c) {
            return Op::Continue;
        }
        let next = match c {
            b'{' => return self.push(c, Parse::ObjectKey, State::BeginStringOrEmpty),
            b'[' => return self.push(c, Parse::ArrayValue, State::BeginValueOrEmpty),
            b'"' => State::InString,
            b'-' => State::Neg,
            b'0' => State::Zero,
            b'1'..=b'9' => State::One,
            b't' => State::Literal(b"true", 1),
            b'f' => State::Literal(b"false", 1),
            b'n' => State::Literal(b"null", 1),
            _ => return self.error(c, "looking for beginning of value"),
        };
        self.state = next;
        Op::Continue
    }

    fn begin_string(&mut self, c: u8) -> Op {
        if is_space(c) {
            return Op::Continue;
        }
        if c == b'"' {
            self.state = State::InString;
            return Op::Continue;
        }
        self.error(c, "looking for beginning of object key string")
    }

    fn zero(&mut self, c: u8) -> Op {
        match c {
            b'.' => {
                self.state = State::Dot;
                Op::Continue
            }
            b'e' | b'E' => {
                self.state = State::E;
                Op::Continue
            }
            _ => self.end_value(c),
        }
    }

    fn e_sign(&mut self, c: u8) -> Op {
        if c.is_ascii_digit() {
            self.state = State::E0;
            Op::Continue
        } else {
            self.error(c, "in exponent of numeric literal")
        }
    }

    fn end_value(&mut self, c: u8) -> Op {
        let Some(&top) = self.stack.last() else {
            self.state = State::EndTop;
            self.end_top = true;
            return self.step(c);
        };
        if is_space(c) {
            self.state = State::EndValue;
            return Op::Continue;
        }
        let last = self.stack.len() - 1;
        match top {
            Parse::ObjectKey => {
                if c == b':' {
                    self.stack[last] = Parse::ObjectValue;
                    self.state = State::BeginValue;
                    return Op::Continue;
                }
                self.error(c, "after object key")
            }
            Parse::ObjectValue => match c {
                b',' => {
                    self.stack[last] = Parse::ObjectKey;
                    self.state = State::BeginString;
                    Op::Continue
                }
                b'}' => {
                    self.pop();
                    Op::Closed
                }
                _ => self.error(c, "after object key:value pair"),
            },
            Parse::ArrayValue => match c {
                b',' => {
                    self.state = State::BeginValue;
                    Op::Continue
                }
                b']' => {
                    self.pop();
                    Op::Closed
                }
                _ => self.error(c, "after array element"),
            },
        }
    }

    /// Go's `scanner.eof`: whether the input may end here (a number or literal at the top
    /// level ends with the input).
    fn eof(&mut self) -> Result<(), String> {
        if let Some(e) = &self.err {
            return Err(e.clone());
        }
        if self.end_top {
            return Ok(());
        }
        self.step(b' ');
        if self.end_top && self.err.is_none() {
            return Ok(());
        }
        Err(self
            .err
            .clone()
            .unwrap_or_else(|| "unexpected end of JSON input".to_string()))
    }
}

/// Go's `quoteChar`: how its errors show an offending byte.
pub fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_string(),
        b'"' => "'\"'".to_string(),
        _ => {
            // strconv.Quote of the byte taken as a rune (so 0x80..=0xFF are Latin-1).
            let mut s = String::from("'");
            quote_rune(&mut s, char::from(c));
            s.push('\'');
            s
        }
    }
}

/// One rune as Go's `strconv.Quote` writes it (inside the quotes).
fn quote_rune(out: &mut String, r: char) {
    match r {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\u{7}' => out.push_str("\\a"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{b}' => out.push_str("\\v"),
        r if (r as u32) < 0x20 || r == '\u{7f}' => {
            let _ = write!(out, "\\x{:02x}", r as u32);
        }
        r if is_go_printable(r) => out.push(r),
        r if (r as u32) < 0x10000 => {
            let _ = write!(out, "\\u{:04x}", r as u32);
        }
        r => {
            let _ = write!(out, "\\U{:08x}", r as u32);
        }
    }
}

/// Go's `strconv.IsPrint` for what can reach an error message: ASCII graphic and space,
/// Latin-1 graphic (not U+00A0, not the soft hyphen U+00AD), and beyond Latin-1 everything
/// that is neither a control nor a space character (Go's tables are finer there; such runes
/// reach a message only inside an unknown enum name).
fn is_go_printable(r: char) -> bool {
    match r as u32 {
        0x20..=0x7e => true,
        0..=0xa0 | 0xad => false,
        0xa1..=0xff => true,
        _ => !r.is_control() && !r.is_whitespace(),
    }
}

/// Go's `%q` of a byte string (its `strconv.Quote`): the enum name in "unknown value %q".
pub fn go_quote(bytes: &[u8]) -> String {
    let mut out = String::from("\"");
    let mut i = 0;
    while i < bytes.len() {
        match decode_rune(&bytes[i..]) {
            (Some(r), n) => {
                quote_rune(&mut out, r);
                i += n;
            }
            (None, _) => {
                let _ = write!(out, "\\x{:02x}", bytes[i]);
                i += 1;
            }
        }
    }
    out.push('"');
    out
}

/// The first UTF-8 rune of `bytes` and its length, or `None` (length 1) where Go's
/// `utf8.DecodeRune` sees an invalid byte.
fn decode_rune(bytes: &[u8]) -> (Option<char>, usize) {
    let len = match bytes[0] {
        0x00..=0x7f => 1,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return (None, 1),
    };
    match bytes.get(..len).and_then(|b| std::str::from_utf8(b).ok()) {
        Some(s) => (s.chars().next(), len),
        None => (None, 1),
    }
}

/// What the next value of a stream is (Go's `Decoder.Decode` into a `json.RawMessage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A value at `start..end` of the buffer (leading whitespace skipped).
    Value(std::ops::Range<usize>),
    /// Only whitespace left and the input has ended (Go's `io.EOF`).
    End,
    /// The value is not complete yet: more input is needed.
    NeedMore,
    /// Go's error for the input.
    Error(String),
}

/// Reads successive JSON values from input that arrives in pieces, as Go's `json.Decoder`
/// does: values need no separator, whitespace between them is skipped, and a value is
/// scanned once however many pieces it arrives in.
#[derive(Debug)]
pub struct StreamScanner {
    scanner: Scanner,
    /// Where the value being scanned starts (after whitespace), if one has started.
    start: Option<usize>,
    /// How far the buffer has been scanned.
    scanned: usize,
}

impl Default for StreamScanner {
    fn default() -> Self {
        StreamScanner {
            scanner: Scanner::new(),
            start: None,
            scanned: 0,
        }
    }
}

impl StreamScanner {
    /// The next value in `buf` (the bytes not yet consumed; after a [`Next::Value`] the
    /// caller drops `..end` from its buffer and the scanner restarts at 0). `at_eof`: the
    /// input ends with `buf`.
    pub fn next(&mut self, buf: &[u8], at_eof: bool) -> Next {
        while self.scanned < buf.len() {
            let i = self.scanned;
            let c = buf[i];
            self.scanned += 1;
            if self.start.is_none() {
                if is_space(c) {
                    continue;
                }
                self.start = Some(i);
            }
            match self.scanner.step(c) {
                Op::Continue => {}
                Op::Closed if self.scanner.stack.is_empty() => return self.take(i + 1),
                Op::Closed => {}
                Op::End => return self.take(i),
                Op::Error => {
                    return Next::Error(self.scanner.err.clone().unwrap_or_default());
                }
            }
        }
        if !at_eof {
            return Next::NeedMore;
        }
        let Some(_) = self.start else {
            return Next::End;
        };
        if self.scanner.step(b' ') == Op::End {
            return self.take(buf.len());
        }
        Next::Error("unexpected EOF".into())
    }

    fn take(&mut self, end: usize) -> Next {
        let start = self.start.take().expect("a value started");
        *self = StreamScanner::default();
        Next::Value(start..end)
    }
}

/// Go's `json.Unmarshal` syntax check (`checkValid`): `input` must be exactly one value with
/// only whitespace around it.
pub fn check_valid(input: &[u8]) -> Result<(), String> {
    let mut s = Scanner::new();
    for &c in input {
        if s.step(c) == Op::Error {
            return Err(s.err.unwrap_or_default());
        }
    }
    s.eof()
}

/// A value the scanner accepted, indexed so that its members and elements can be read
/// without scanning anything twice: the end of every object and array, by start.
#[derive(Debug)]
pub struct Doc<'a> {
    src: &'a [u8],
    /// (start, end) of each object and array, in order of start (as they open).
    containers: Vec<(u32, u32)>,
}

/// Where a value lies in its [`Doc`]'s source.
pub type Span = std::ops::Range<usize>;

impl<'a> Doc<'a> {
    /// Indexes `src`, one JSON value that [`check_valid`] or [`StreamScanner`] accepted
    /// (without surrounding whitespace).
    pub fn new(src: &'a [u8]) -> Doc<'a> {
        assert!(
            src.len() < u32::MAX as usize,
            "request bodies are bounded far below 4 GiB"
        );
        let mut containers = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < src.len() {
            match src[i] {
                b'"' => i = string_end(src, i) - 1,
                b'{' | b'[' => {
                    open.push(containers.len());
                    containers.push((i as u32, 0));
                }
                b'}' | b']' => {
                    let at = open.pop().expect("balanced: the scanner accepted it");
                    containers[at].1 = i as u32 + 1;
                }
                _ => {}
            }
            i += 1;
        }
        Doc { src, containers }
    }

    /// The whole value.
    pub fn root(&self) -> Span {
        0..self.src.len()
    }

    pub fn bytes(&self, span: &Span) -> &'a [u8] {
        &self.src[span.clone()]
    }

    pub fn kind(&self, span: &Span) -> Kind {
        Kind::of(self.src[span.start])
    }

    /// Where the value starting at `start` ends.
    fn value_end(&self, start: usize) -> usize {
        match self.src[start] {
            b'{' | b'[' => {
                let at = self
                    .containers
                    .binary_search_by_key(&(start as u32), |c| c.0)
                    .expect("every container is indexed");
                self.containers[at].1 as usize
            }
            b'"' => string_end(self.src, start),
            _ => {
                let mut end = start;
                while end < self.src.len()
                    && !matches!(self.src[end], b',' | b'}' | b']')
                    && !is_space(self.src[end])
                {
                    end += 1;
                }
                end
            }
        }
    }

    fn skip_space(&self, mut i: usize) -> usize {
        while i < self.src.len() && is_space(self.src[i]) {
            i += 1;
        }
        i
    }

    /// The members of the object at `span`, in order: (key span, value span).
    pub fn members(&self, span: &Span) -> Vec<(Span, Span)> {
        debug_assert_eq!(self.kind(span), Kind::Object);
        let mut out = Vec::new();
        let mut i = self.skip_space(span.start + 1);
        while self.src[i] != b'}' {
            let key = i..string_end(self.src, i);
            i = self.skip_space(key.end);
            debug_assert_eq!(self.src[i], b':');
            i = self.skip_space(i + 1);
            let value = i..self.value_end(i);
            i = self.skip_space(value.end);
            out.push((key, value));
            if self.src[i] == b',' {
                i = self.skip_space(i + 1);
            }
        }
        out
    }

    /// The elements of the array at `span`, in order.
    pub fn elements(&self, span: &Span) -> Vec<Span> {
        debug_assert_eq!(self.kind(span), Kind::Array);
        let mut out = Vec::new();
        let mut i = self.skip_space(span.start + 1);
        while self.src[i] != b']' {
            let value = i..self.value_end(i);
            i = self.skip_space(value.end);
            out.push(value);
            if self.src[i] == b',' {
                i = self.skip_space(i + 1);
            }
        }
        out
    }

    /// The text of the string at `span`, as Go decodes it.
    pub fn string(&self, span: &Span) -> Vec<u8> {
        unquote(self.bytes(span))
    }
}

/// Where the string starting with the quote at `start` ends (after its closing quote).
fn string_end(src: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    loop {
        match src[i] {
            b'"' => return i + 1,
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// A JSON string literal's text (quotes included in `quoted`), as Go's `unquoteBytes` makes
/// it: escapes resolved, a `\u` surrogate pair joined, a lone surrogate and every byte that
/// is not UTF-8 replaced by U+FFFD.
pub fn unquote(quoted: &[u8]) -> Vec<u8> {
    let s = &quoted[1..quoted.len() - 1];
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    let mut buf = [0u8; 4];
    while i < s.len() {
        match s[i] {
            b'\\' => {
                let esc = s[i + 1];
                i += 2;
                let c = match esc {
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    b'n' => '\n',
                    b'r' => '\r',
                    b't' => '\t',
                    b'u' => {
                        let hi = hex4(&s[i..i + 4]);
                        i += 4;
                        if (0xd800..0xdc00).contains(&hi)
                            && s.get(i..i + 2) == Some(b"\\u".as_slice())
                        {
                            let lo = hex4(&s[i + 2..i + 6]);
                            if (0xdc00..0xe000).contains(&lo) {
                                i += 6;
                                let joined = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
                                char::from_u32(joined).expect("a valid surrogate pair")
                            } else {
                                '\u{fffd}'
                            }
                        } else {
                            char::from_u32(hi).unwrap_or('\u{fffd}')
                        }
                    }
                    other => char::from(other),
                };
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
            _ => match decode_rune(&s[i..]) {
                (Some(r), n) => {
                    out.extend_from_slice(r.encode_utf8(&mut buf).as_bytes());
                    i += n;
                }
                (None, _) => {
                    out.extend_from_slice("\u{fffd}".as_bytes());
                    i += 1;
                }
            },
        }
    }
    out
}

fn hex4(digits: &[u8]) -> u32 {
    digits.iter().fold(0, |acc, &d| {
        acc * 16
            + char::from(d)
                .to_digit(16)
                .expect("the scanner checked the hex digits")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `json.Decoder` over `input`: every value, then the error or EOF (go1.19's
    /// answers, measured: see the table).
    fn decode_all(input: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = input;
        loop {
            match StreamScanner::default().next(rest, true) {
                Next::Value(r) => {
                    out.push(format!("VAL:{}", String::from_utf8_lossy(&rest[r.clone()])));
                    rest = &rest[r.end..];
                }
                Next::End => {
                    out.push("ERR:EOF".into());
                    return out;
                }
                Next::Error(e) => {
                    out.push(format!("ERR:{e}"));
                    return out;
                }
                Next::NeedMore => unreachable!(),
            }
        }
    }

    #[test]
    fn decoder_errors_are_go_s() {
        // (input, what go1.19's json.Decoder returns, value by value)
        let table: &[(&[u8], &[&str])] = &[
            (b"", &["ERR:EOF"]),
            (b" ", &["ERR:EOF"]),
            (b"{", &["ERR:unexpected EOF"]),
            (b"{\"a\"", &["ERR:unexpected EOF"]),
            (b"{\"a\":1,", &["ERR:unexpected EOF"]),
            (
                b"{\"a\" 1}",
                &["ERR:invalid character '1' after object key"],
            ),
            (
                b"{\"a\":1 \"b\":2}",
                &["ERR:invalid character '\"' after object key:value pair"],
            ),
            (
                b"{1:2}",
                &["ERR:invalid character '1' looking for beginning of object key string"],
            ),
            (
                b"{\"a\":1,}",
                &["ERR:invalid character '}' looking for beginning of object key string"],
            ),
            (
                b"[1,]",
                &["ERR:invalid character ']' looking for beginning of value"],
            ),
            (b"[1 2]", &["ERR:invalid character '2' after array element"]),
            (
                b"nonsense",
                &["ERR:invalid character 'o' in literal null (expecting 'u')"],
            ),
            (b"tru", &["ERR:unexpected EOF"]),
            (
                b"trux",
                &["ERR:invalid character 'x' in literal true (expecting 'e')"],
            ),
            (b"-", &["ERR:unexpected EOF"]),
            (b"-x", &["ERR:invalid character 'x' in numeric literal"]),
            (
                b"1.x",
                &["ERR:invalid character 'x' after decimal point in numeric literal"],
            ),
            (
                b"1e+x",
                &["ERR:invalid character 'x' in exponent of numeric literal"],
            ),
            (b"01", &["VAL:0", "VAL:1", "ERR:EOF"]),
            (
                b"123abc",
                &[
                    "VAL:123",
                    "ERR:invalid character 'a' looking for beginning of value",
                ],
            ),
            (b"\"abc", &["ERR:unexpected EOF"]),
            (
                b"\"a\x01b\"",
                &["ERR:invalid character '\\x01' in string literal"],
            ),
            (
                b"\"\\q\"",
                &["ERR:invalid character 'q' in string escape code"],
            ),
            (
                b"\"\\u12\"",
                &["ERR:invalid character '\"' in \\u hexadecimal character escape"],
            ),
            (
                b"{\"a\":1}{\"b\":2}",
                &["VAL:{\"a\":1}", "VAL:{\"b\":2}", "ERR:EOF"],
            ),
            (
                b"{\"a\":1},{\"b\":2}",
                &[
                    "VAL:{\"a\":1}",
                    "ERR:invalid character ',' looking for beginning of value",
                ],
            ),
            (
                b"  {\"a\":[1,2,{\"b\":null}]}  ",
                &["VAL:{\"a\":[1,2,{\"b\":null}]}", "ERR:EOF"],
            ),
            (
                b"'",
                &["ERR:invalid character '\\'' looking for beginning of value"],
            ),
            (
                "é".as_bytes(),
                &["ERR:invalid character 'Ã' looking for beginning of value"],
            ),
            (
                b"\x80",
                &["ERR:invalid character '\\u0080' looking for beginning of value"],
            ),
            (
                b"\x7f",
                &["ERR:invalid character '\\x7f' looking for beginning of value"],
            ),
            (
                b"{\"a\":1]",
                &["ERR:invalid character ']' after object key:value pair"],
            ),
            (b"[1}", &["ERR:invalid character '}' after array element"]),
        ];
        for (input, want) in table {
            assert_eq!(
                decode_all(input),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn values_split_across_pieces_are_scanned_once_and_found_whole() {
        let input = b" {\"a\":[1,2]}\n{\"b\":\"x\\\"y\"} 17 ";
        for piece in 1..input.len() {
            let mut buf: Vec<u8> = Vec::new();
            let mut values = Vec::new();
            let mut scanner = StreamScanner::default();
            let mut fed = 0;
            loop {
                let at_eof = fed == input.len();
                match scanner.next(&buf, at_eof) {
                    Next::Value(r) => {
                        values.push(String::from_utf8(buf[r.clone()].to_vec()).unwrap());
                        buf.drain(..r.end);
                    }
                    Next::NeedMore => {
                        let n = piece.min(input.len() - fed);
                        buf.extend_from_slice(&input[fed..fed + n]);
                        fed += n;
                    }
                    Next::End => break,
                    Next::Error(e) => panic!("{e}"),
                }
            }
            assert_eq!(
                values,
                ["{\"a\":[1,2]}", "{\"b\":\"x\\\"y\"}", "17"],
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn unmarshal_syntax_errors_are_go_s() {
        let table: &[(&[u8], Result<(), &str>)] = &[
            (b"", Err("unexpected end of JSON input")),
            (b" ", Err("unexpected end of JSON input")),
            (
                b"abc",
                Err("invalid character 'a' looking for beginning of value"),
            ),
            (b"-", Err("invalid character ' ' in numeric literal")),
            (
                b"tru",
                Err("invalid character ' ' in literal true (expecting 'e')"),
            ),
            (
                b"1.",
                Err("invalid character ' ' after decimal point in numeric literal"),
            ),
            (b"1 2", Err("invalid character '2' after top-level value")),
            (b" 10 ", Ok(())),
            (
                b"\\\"5\\\"",
                Err("invalid character '\\\\' looking for beginning of value"),
            ),
            (b"\"x", Err("unexpected end of JSON input")),
            (b"null", Ok(())),
        ];
        for (input, want) in table {
            assert_eq!(
                check_valid(input),
                want.map_err(String::from),
                "input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn depth_beyond_go_s_limit_is_refused() {
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert_eq!(check_valid(ok.as_bytes()), Ok(()));
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(
            check_valid(deep.as_bytes()),
            Err("invalid character '[' exceeded max depth".into())
        );
    }

    #[test]
    fn doc_reads_members_elements_and_strings() {
        let src = br#"{"a" : [1, {"x":"y"} ,"s\"t"], "b":true,"c":{} ,"d":-1.5e3}"#;
        check_valid(src).unwrap();
        let doc = Doc::new(src);
        let members = doc.members(&doc.root());
        let keys: Vec<Vec<u8>> = members.iter().map(|(k, _)| doc.string(k)).collect();
        assert_eq!(
            keys,
            [b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
        );
        let a = doc.elements(&members[0].1);
        assert_eq!(doc.bytes(&a[0]), b"1");
        assert_eq!(doc.bytes(&a[1]), br#"{"x":"y"}"#);
        assert_eq!(doc.string(&a[2]), b"s\"t");
        assert_eq!(doc.bytes(&members[1].1), b"true");
        assert!(doc.members(&members[2].1).is_empty());
        assert_eq!(doc.bytes(&members[3].1), b"-1.5e3");
    }

    #[test]
    fn strings_unquote_as_go_does() {
        // go1.19: json.Unmarshal into a string.
        assert_eq!(unquote(br#""a\ud800b""#), "a\u{fffd}b".as_bytes());
        assert_eq!(unquote(br#""\ud83d\ude00""#), "😀".as_bytes());
        assert_eq!(unquote(br#""\udc00""#), "\u{fffd}".as_bytes());
        assert_eq!(unquote(b"\"\xff\""), "\u{fffd}".as_bytes());
        assert_eq!(unquote(br#""\u0041\/""#), b"A/");
    }

    #[test]
    fn quoting_is_go_s() {
        assert_eq!(go_quote(b"BOGUS"), "\"BOGUS\"");
        assert_eq!(
            go_quote(b"a\"b\\c\n\x01\xff"),
            "\"a\\\"b\\\\c\\n\\x01\\xff\""
        );
        assert_eq!(quote_char(0xa0), "'\\u00a0'");
        assert_eq!(quote_char(0xad), "'\\u00ad'");
        assert_eq!(quote_char(0xff), "'ÿ'");
        assert_eq!(quote_char(0), "'\\x00'");
    }
}
