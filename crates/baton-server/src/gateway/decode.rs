//! A request's JSON into its protobuf message, by the rules of the `jsonpb` that etcd's
//! gateway (grpc-gateway v1, golang/protobuf 1.3) decodes with, and with its error words:
//!
//! - an object's members are matched to fields by the `.proto` name or the JSON (lower
//!   camel case) name, the latter winning when both are given; other members are ignored;
//!   `null` leaves a field unset;
//! - an integer field takes a number or a string holding one (`"5"`, `" 5 "`), and Go's
//!   `json.Unmarshal` judges what is inside the quotes, so `"abc"` is refused with a syntax
//!   error and `1.5` or `1e3` as not an integer;
//! - an enum takes its value's name or a number (any `int32`, known or not);
//! - `bytes` are standard base64 with padding ([`go_base64`](super::go_base64));
//! - the first problem in field declaration order is the one reported (regular fields
//!   before oneof members), as the message's Go struct is walked in that order.
//!
//! The message is built as a [`DynamicMessage`] of the request's descriptor, so nothing here
//! knows etcd's messages: the route table names the descriptor.

use prost::bytes::Bytes;
use prost_reflect::{DynamicMessage, EnumDescriptor, FieldDescriptor, Kind as FieldKind};
use prost_reflect::{MessageDescriptor, Value};

use super::go_base64;
use super::go_json::{self, Doc, Kind, Span};

/// Why a request body cannot become its message: the text Go gives (the gateway answers it
/// with `InvalidArgument`, or `Unknown` for the first message of a stream, as etcd does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl From<String> for DecodeError {
    fn from(s: String) -> Self {
        DecodeError(s)
    }
}

/// The message nesting a request may reach: only a txn nests (a txn in an op of a txn),
/// and the server refuses txns deeper than [`baton_proto::codec::MAX_TXN_LEVELS`] with
/// "too many operations in txn request", so deeper JSON is refused with the same words
/// rather than walked (this walk recurses once per message level).
const MAX_MESSAGE_DEPTH: usize = 2 * baton_proto::codec::MAX_TXN_LEVELS + 2;

/// `json`, one value the scanner accepted (a request body's first value, or one of a
/// stream's), as a `desc` message.
pub fn decode(desc: &MessageDescriptor, json: &[u8]) -> Result<DynamicMessage, DecodeError> {
    let doc = Doc::new(json);
    message(&doc, &doc.root(), desc, 0)
}

fn message(
    doc: &Doc<'_>,
    span: &Span,
    desc: &MessageDescriptor,
    depth: usize,
) -> Result<DynamicMessage, DecodeError> {
    if depth > MAX_MESSAGE_DEPTH {
        return Err(DecodeError(baton_proto::codec::TOO_MANY_OPS.into()));
    }
    let mut msg = DynamicMessage::new(desc.clone());
    match doc.kind(span) {
        Kind::Null => return Ok(msg),
        Kind::Object => {}
        other => {
            return Err(DecodeError(go_json::type_error(
                other,
                None,
                "map[string]json.RawMessage",
            )))
        }
    }
    // Go reads the object into a map: a repeated member's last value wins.
    let mut members: std::collections::HashMap<Vec<u8>, Span> = Default::default();
    for (key, value) in doc.members(span) {
        members.insert(doc.string(&key), value);
    }
    let in_declaration_order: Vec<FieldDescriptor> = desc
        .descriptor_proto()
        .field
        .iter()
        .filter_map(|f| desc.get_field(f.number() as u32))
        .collect();
    let (plain, oneof_members): (Vec<_>, Vec<_>) = in_declaration_order
        .into_iter()
        .partition(|f| f.containing_oneof().is_none());
    for field in plain.iter().chain(oneof_members.iter()) {
        let raw = members
            .get(field.json_name().as_bytes())
            .or_else(|| members.get(field.name().as_bytes()));
        let Some(raw) = raw else { continue };
        if let Some(value) = field_value(doc, raw, field, depth)? {
            msg.set_field(field, value);
        }
    }
    Ok(msg)
}

fn field_value(
    doc: &Doc<'_>,
    span: &Span,
    field: &FieldDescriptor,
    depth: usize,
) -> Result<Option<Value>, DecodeError> {
    let kind = field.kind();
    if field.is_map() {
        // etcd's API has no map fields; refuse rather than guess Go's map-key rules.
        return Err(DecodeError(format!(
            "map field {} is not supported by the gateway",
            field.full_name()
        )));
    }
    if !field.is_list() {
        return single(doc, span, &kind, depth);
    }
    match doc.kind(span) {
        Kind::Null => Ok(None),
        Kind::Array => {
            let mut values = Vec::new();
            for element in doc.elements(span) {
                // A null element is the zero value (Go leaves a nil element, which encodes
                // as an empty message or zero).
                let value = single(doc, &element, &kind, depth)?
                    .unwrap_or_else(|| Value::default_value(&kind));
                values.push(value);
            }
            Ok(Some(Value::List(values)))
        }
        other => Err(DecodeError(go_json::type_error(
            other,
            None,
            "[]json.RawMessage",
        ))),
    }
}

/// One value of a field (an element, for a repeated one): `None` for `null`.
fn single(
    doc: &Doc<'_>,
    span: &Span,
    kind: &FieldKind,
    depth: usize,
) -> Result<Option<Value>, DecodeError> {
    let json = doc.kind(span);
    if json == Kind::Null && !matches!(kind, FieldKind::Enum(_)) {
        return Ok(None);
    }
    let value = match kind {
        FieldKind::Message(desc) => Value::Message(message(doc, span, desc, depth + 1)?),
        FieldKind::Enum(desc) => return enum_value(doc, span, desc),
        FieldKind::Bool => match json {
            Kind::Bool => Value::Bool(doc.bytes(span) == b"true"),
            other => return Err(DecodeError(go_json::type_error(other, None, "bool"))),
        },
        FieldKind::String => match json {
            Kind::String => Value::String(
                String::from_utf8(doc.string(span)).expect("Go's unquote yields UTF-8"),
            ),
            other => return Err(DecodeError(go_json::type_error(other, None, "string"))),
        },
        FieldKind::Bytes => match json {
            Kind::String => Value::Bytes(Bytes::from(
                go_base64::decode(&doc.string(span)).map_err(go_base64::error_text)?,
            )),
            other => return Err(DecodeError(go_json::type_error(other, None, "[]uint8"))),
        },
        FieldKind::Int32 | FieldKind::Sint32 | FieldKind::Sfixed32 => {
            return integer(doc.bytes(span), "int32")
                .map(|n| n.map(|n| Value::I32(i32::try_from(n).expect("range checked"))))
        }
        FieldKind::Int64 | FieldKind::Sint64 | FieldKind::Sfixed64 => {
            return integer(doc.bytes(span), "int64").map(|n| n.map(|n| Value::I64(n as i64)))
        }
        FieldKind::Uint32 | FieldKind::Fixed32 => {
            return integer(doc.bytes(span), "uint32")
                .map(|n| n.map(|n| Value::U32(u32::try_from(n).expect("range checked"))))
        }
        FieldKind::Uint64 | FieldKind::Fixed64 => {
            return integer(doc.bytes(span), "uint64").map(|n| n.map(|n| Value::U64(n as u64)))
        }
        FieldKind::Float => {
            return float(doc.bytes(span), "float32").map(|f| f.map(|f| Value::F32(f as f32)))
        }
        FieldKind::Double => return float(doc.bytes(span), "float64").map(|f| f.map(Value::F64)),
    };
    Ok(Some(value))
}

/// Go's name for an enum's type in its errors: the package, then the nested names joined
/// by `_` (`etcdserverpb.RangeRequest_SortOrder`).
fn go_enum_name(desc: &EnumDescriptor) -> String {
    let package = desc.package_name();
    let nested = desc
        .full_name()
        .strip_prefix(package)
        .map(|rest| rest.trim_start_matches('.'))
        .unwrap_or(desc.full_name());
    if package.is_empty() {
        nested.replace('.', "_")
    } else {
        format!("{package}.{}", nested.replace('.', "_"))
    }
}

fn enum_value(
    doc: &Doc<'_>,
    span: &Span,
    desc: &EnumDescriptor,
) -> Result<Option<Value>, DecodeError> {
    let raw = doc.bytes(span);
    if doc.kind(span) == Kind::String {
        // The name between the quotes, escapes and all (Go does not unquote it).
        let name = &raw[1..raw.len() - 1];
        let found = std::str::from_utf8(name)
            .ok()
            .and_then(|n| desc.get_value_by_name(n));
        return match found {
            Some(v) => Ok(Some(Value::EnumNumber(v.number()))),
            None => Err(DecodeError(format!(
                "unknown value {} for enum {}",
                go_json::go_quote(name),
                go_enum_name(desc)
            ))),
        };
    }
    let go_type = go_enum_name(desc);
    integer(raw, &go_type)
        .map(|n| n.map(|n| Value::EnumNumber(i32::try_from(n).expect("range checked"))))
}

/// What a Go integer type of this name holds.
fn integer_range(go_type: &str) -> (i128, i128) {
    match go_type {
        "int64" => (i64::MIN.into(), i64::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" => (0, u64::MAX.into()),
        // int32 and every enum (an int32 in Go)
        _ => (i32::MIN.into(), i32::MAX.into()),
    }
}

/// The text a number field's value is judged on: inside the quotes for a string (Go strips
/// them without unquoting), else the value itself.
fn number_text(raw: &[u8]) -> &[u8] {
    if raw.first() == Some(&b'"') {
        &raw[1..raw.len() - 1]
    } else {
        raw
    }
}

/// An integer as Go's `json.Unmarshal` into a `go_type` reads `raw` (quotes stripped first):
/// `None` for `null`.
fn integer(raw: &[u8], go_type: &str) -> Result<Option<i128>, DecodeError> {
    let text = number_text(raw);
    go_json::check_valid(text)?;
    let text = text.trim_ascii();
    match Kind::of(text[0]) {
        Kind::Null => Ok(None),
        Kind::Number => {
            let (lo, hi) = integer_range(go_type);
            std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<i128>().ok())
                // Go parses signed types with ParseInt, unsigned ones with ParseUint ("-0"
                // is not a uint64).
                .filter(|n| (lo..=hi).contains(n) && !(lo == 0 && text[0] == b'-'))
                .map(Some)
                .ok_or_else(|| DecodeError(go_json::type_error(Kind::Number, Some(text), go_type)))
        }
        other => Err(DecodeError(go_json::type_error(other, None, go_type))),
    }
}

/// A float as Go reads it (`"NaN"`, `"Infinity"` and `"-Infinity"` as strings).
fn float(raw: &[u8], go_type: &str) -> Result<Option<f64>, DecodeError> {
    match raw {
        b"\"NaN\"" => return Ok(Some(f64::NAN)),
        b"\"Infinity\"" => return Ok(Some(f64::INFINITY)),
        b"\"-Infinity\"" => return Ok(Some(f64::NEG_INFINITY)),
        _ => {}
    }
    let text = number_text(raw);
    go_json::check_valid(text)?;
    let text = text.trim_ascii();
    match Kind::of(text[0]) {
        Kind::Null => Ok(None),
        Kind::Number => {
            let max = if go_type == "float32" {
                f64::from(f32::MAX)
            } else {
                f64::MAX
            };
            std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
                .filter(|f| f.abs() <= max)
                .map(Some)
                .ok_or_else(|| DecodeError(go_json::type_error(Kind::Number, Some(text), go_type)))
        }
        other => Err(DecodeError(go_json::type_error(other, None, go_type))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::routes::descriptors;

    fn msg(name: &str) -> MessageDescriptor {
        descriptors().get_message_by_name(name).unwrap()
    }

    fn err(name: &str, json: &str) -> String {
        decode(&msg(name), json.as_bytes()).unwrap_err().0
    }

    fn ok(name: &str, json: &str) -> DynamicMessage {
        decode(&msg(name), json.as_bytes()).unwrap()
    }

    #[test]
    fn wrong_types_get_go_s_words() {
        // Each measured on etcd 3.4.23's gateway (POST /v3/kv/put or /v3/kv/range).
        let put = "etcdserverpb.PutRequest";
        let range = "etcdserverpb.RangeRequest";
        let txn = "etcdserverpb.TxnRequest";
        let table = [
            (
                put,
                "[]",
                "json: cannot unmarshal array into Go value of type map[string]json.RawMessage",
            ),
            (
                put,
                "\"x\"",
                "json: cannot unmarshal string into Go value of type map[string]json.RawMessage",
            ),
            (
                put,
                r#"{"key":5}"#,
                "json: cannot unmarshal number into Go value of type []uint8",
            ),
            (
                put,
                r#"{"key":"Zm9v","lease":"abc"}"#,
                "invalid character 'a' looking for beginning of value",
            ),
            (
                put,
                r#"{"key":"Zm9v","lease":1.5}"#,
                "json: cannot unmarshal number 1.5 into Go value of type int64",
            ),
            (
                put,
                r#"{"key":"Zm9v","lease":true}"#,
                "json: cannot unmarshal bool into Go value of type int64",
            ),
            (
                put,
                r#"{"key":"Zm9v","prev_kv":"yes"}"#,
                "json: cannot unmarshal string into Go value of type bool",
            ),
            (
                put,
                r#"{"key":"!!!"}"#,
                "illegal base64 data at input byte 0",
            ),
            (
                put,
                r#"{"key":"Zm9"}"#,
                "illegal base64 data at input byte 0",
            ),
            (
                range,
                r#"{"key":"Zm9v","sort_order":"BOGUS"}"#,
                "unknown value \"BOGUS\" for enum etcdserverpb.RangeRequest_SortOrder",
            ),
            (
                range,
                r#"{"key":"Zm9v","limit":"1e3"}"#,
                "json: cannot unmarshal number 1e3 into Go value of type int64",
            ),
            (
                range,
                r#"{"key":"Zm9v","limit":99999999999999999999}"#,
                "json: cannot unmarshal number 99999999999999999999 into Go value of type int64",
            ),
            (
                range,
                r#"{"key":"Zm9v","sortOrder":"DESCEND","keysOnly":"x"}"#,
                "json: cannot unmarshal string into Go value of type bool",
            ),
            // The first bad field in declaration order is reported, not the first in the text.
            (
                range,
                r#"{"limit":"z","key":5}"#,
                "json: cannot unmarshal number into Go value of type []uint8",
            ),
            (
                range,
                r#"{"key":"Zm9vYg="}"#,
                "illegal base64 data at input byte 7",
            ),
            (
                txn,
                r#"{"compare":{"key":"Zm9v"}}"#,
                "json: cannot unmarshal object into Go value of type []json.RawMessage",
            ),
            (
                txn,
                r#"{"compare":[5]}"#,
                "json: cannot unmarshal number into Go value of type map[string]json.RawMessage",
            ),
            (
                txn,
                r#"{"compare":[{"key":"Zm9v","create_revision":"x"}]}"#,
                "invalid character 'x' looking for beginning of value",
            ),
        ];
        for (name, json, want) in table {
            assert_eq!(err(name, json), want, "{name} {json}");
        }
    }

    #[test]
    fn accepted_forms_mean_what_go_reads() {
        let m = ok(
            "etcdserverpb.RangeRequest",
            r#"{"key":"Zm\n9v","limit":" 10 ","sortOrder":"DESCEND","keys_only":true,"bogus":{"x":[1]},"count_only":null}"#,
        );
        let f = |n: &str| m.get_field_by_name(n).unwrap().into_owned();
        assert_eq!(f("key"), Value::Bytes(Bytes::from_static(b"foo")));
        assert_eq!(f("limit"), Value::I64(10));
        assert_eq!(f("sort_order"), Value::EnumNumber(2));
        assert_eq!(f("keys_only"), Value::Bool(true));
        assert_eq!(f("count_only"), Value::Bool(false));
        // An unknown enum number is kept, as Go keeps it.
        let m = ok("etcdserverpb.RangeRequest", r#"{"sort_order":7}"#);
        assert_eq!(
            m.get_field_by_name("sort_order").unwrap().into_owned(),
            Value::EnumNumber(7)
        );
        // ID / TTL are the .proto names; ttl is neither name.
        let m = ok(
            "etcdserverpb.LeaseGrantRequest",
            r#"{"TTL":"30","ttl":5,"ID":"7"}"#,
        );
        assert_eq!(
            m.get_field_by_name("TTL").unwrap().into_owned(),
            Value::I64(30)
        );
        assert_eq!(
            m.get_field_by_name("ID").unwrap().into_owned(),
            Value::I64(7)
        );
        // Top-level null and an empty object are the empty request.
        assert_eq!(
            ok("etcdserverpb.PutRequest", "null"),
            DynamicMessage::new(msg("etcdserverpb.PutRequest"))
        );
    }

    #[test]
    fn oneofs_and_nested_messages() {
        let m = ok(
            "etcdserverpb.TxnRequest",
            r#"{"compare":[{"key":"Zm9v","target":"CREATE","create_revision":0}],"success":[{"request_put":{"key":"Zm9v","value":"YmFy"}}, null]}"#,
        );
        let encoded = prost::Message::encode_to_vec(&m);
        let typed: baton_proto::etcdserverpb::TxnRequest =
            prost::Message::decode(encoded.as_slice()).unwrap();
        use baton_proto::etcdserverpb::{compare, request_op};
        assert_eq!(typed.compare.len(), 1);
        assert_eq!(typed.compare[0].target, 1);
        assert_eq!(
            typed.compare[0].target_union,
            Some(compare::TargetUnion::CreateRevision(0))
        );
        assert_eq!(typed.success.len(), 2);
        assert!(
            matches!(typed.success[0].request, Some(request_op::Request::RequestPut(ref p)) if p.key == b"foo" && p.value == b"bar")
        );
        assert_eq!(typed.success[1].request, None);
    }

    #[test]
    fn txns_deeper_than_the_server_takes_are_refused_with_its_words() {
        let mut json = String::from(r#"{"compare":[]}"#);
        for _ in 0..baton_proto::codec::MAX_TXN_LEVELS + 2 {
            json = format!(r#"{{"success":[{{"request_txn":{json}}}]}}"#);
        }
        assert_eq!(
            err("etcdserverpb.TxnRequest", &json),
            baton_proto::codec::TOO_MANY_OPS
        );
    }
}
