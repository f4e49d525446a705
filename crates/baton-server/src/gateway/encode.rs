//! What the gateway writes, byte for byte as etcd's does: a response message as its
//! `jsonpb` marshaler writes it (the `.proto` field names, 64-bit integers as strings,
//! `bytes` in standard base64, enums by name, zero values left out), the error body
//! `{"error","message","code"}` and the stream chunks `{"result":…}` / `{"error":{…}}`.
//!
//! prost-reflect's serde support writes the message (its `SerializeOptions` are the
//! marshaler's settings) and serde_json writes the text; [`GoFormatter`] makes serde_json
//! escape strings as Go's `encoding/json` does (`<`, `>`, `&`, U+2028 and U+2029 as `\u`
//! escapes, `\b` and `\f` as `\u0008` and `\u000c`). Fields come out in field-number order,
//! which for every etcd message is its declaration order, the order Go writes (a test in
//! `routes.rs` checks it for every message the gateway can answer).

use std::io;

use prost_reflect::{DynamicMessage, SerializeOptions};
use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};
use tonic::{Code, Status};

/// serde_json's compact output with Go's string escaping.
#[derive(Debug, Clone, Copy, Default)]
pub struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escaped = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(escaped.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn write_char_escape<W>(&mut self, writer: &mut W, char_escape: CharEscape) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        match char_escape {
            CharEscape::Backspace => writer.write_all(b"\\u0008"),
            CharEscape::FormFeed => writer.write_all(b"\\u000c"),
            other => CompactFormatter.write_char_escape(writer, other),
        }
    }
}

fn to_json(value: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value
        .serialize(&mut ser)
        .expect("writing JSON to memory cannot fail");
    out
}

/// The marshaler etcd's gateway uses: grpc-gateway v1's default `JSONPb{OrigName: true}`.
fn options() -> SerializeOptions {
    SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(true)
        .stringify_64_bit_integers(true)
        .use_enum_numbers(false)
}

/// A response message.
pub fn message(msg: &DynamicMessage) -> Vec<u8> {
    struct WithOptions<'a>(&'a DynamicMessage, SerializeOptions);
    impl Serialize for WithOptions<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            self.0.serialize_with_options(s, &self.1)
        }
    }
    to_json(&WithOptions(msg, options()))
}

/// One message of a stream: `{"result":MESSAGE}`.
pub fn result_chunk(msg: &DynamicMessage) -> Vec<u8> {
    let mut out = b"{\"result\":".to_vec();
    out.extend_from_slice(&message(msg));
    out.push(b'}');
    out
}

/// grpc-gateway v1's `HTTPStatusFromCode`: the HTTP status of an RPC's outcome.
pub fn http_status(code: Code) -> http::StatusCode {
    use http::StatusCode as S;
    match code {
        Code::Ok => S::OK,
        Code::Cancelled => S::REQUEST_TIMEOUT,
        Code::Unknown => S::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => S::BAD_REQUEST,
        Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
        Code::NotFound => S::NOT_FOUND,
        Code::AlreadyExists => S::CONFLICT,
        Code::PermissionDenied => S::FORBIDDEN,
        Code::Unauthenticated => S::UNAUTHORIZED,
        Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => S::PRECONDITION_FAILED,
        Code::Aborted => S::CONFLICT,
        Code::OutOfRange => S::BAD_REQUEST,
        Code::Unimplemented => S::NOT_IMPLEMENTED,
        Code::Internal => S::INTERNAL_SERVER_ERROR,
        Code::Unavailable => S::SERVICE_UNAVAILABLE,
        Code::DataLoss => S::INTERNAL_SERVER_ERROR,
    }
}

/// The body of a failed call: `{"error":M,"message":M,"code":N}`. grpc-gateway marshals it
/// with the same zero-omitting marshaler as messages, so an empty message leaves out both
/// texts.
pub fn error_body(status: &Status) -> Vec<u8> {
    #[derive(Serialize)]
    struct ErrorBody<'a> {
        #[serde(skip_serializing_if = "str::is_empty")]
        error: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        message: &'a str,
        #[serde(skip_serializing_if = "is_zero")]
        code: i32,
    }
    to_json(&ErrorBody {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    })
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// A stream that failed after it started:
/// `{"error":{"grpc_code":N,"http_code":H,"message":M,"http_status":T}}` (no delimiter
/// follows it: it is the stream's last word).
pub fn error_chunk(status: &Status) -> Vec<u8> {
    #[derive(Serialize)]
    struct StreamError<'a> {
        #[serde(skip_serializing_if = "is_zero")]
        grpc_code: i32,
        #[serde(skip_serializing_if = "is_zero")]
        http_code: i32,
        #[serde(skip_serializing_if = "str::is_empty")]
        message: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        http_status: &'a str,
    }
    #[derive(Serialize)]
    struct Chunk<'a> {
        error: StreamError<'a>,
    }
    let http = http_status(status.code());
    to_json(&Chunk {
        error: StreamError {
            grpc_code: status.code() as i32,
            http_code: i32::from(http.as_u16()),
            message: status.message(),
            http_status: http.canonical_reason().unwrap_or(""),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_as_go_escapes_them() {
        // go1.19 json.Marshal of "<a & b>\u2028\b\f\x01/é\"\\\n"
        let got = to_json(&"<a & b>\u{2028}\u{8}\u{c}\u{1}/é\"\\\n");
        assert_eq!(
            String::from_utf8(got).unwrap(),
            r#""\u003ca \u0026 b\u003e\u2028\u0008\u000c\u0001/é\"\\\n""#
        );
    }

    #[test]
    fn error_bodies_are_grpc_gateway_s() {
        let st = Status::invalid_argument("invalid character '\"' after object key:value pair");
        assert_eq!(
            String::from_utf8(error_body(&st)).unwrap(),
            r#"{"error":"invalid character '\"' after object key:value pair","message":"invalid character '\"' after object key:value pair","code":3}"#
        );
        assert_eq!(
            String::from_utf8(error_body(&Status::unknown(""))).unwrap(),
            r#"{"code":2}"#
        );
        assert_eq!(
            String::from_utf8(error_chunk(&Status::unavailable("etcdserver: no leader"))).unwrap(),
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#
        );
        assert_eq!(http_status(Code::ResourceExhausted).as_u16(), 429);
        assert_eq!(http_status(Code::FailedPrecondition).as_u16(), 412);
    }
}
