//! Gateway calls go through the same tonic stack as gRPC calls — the metrics, learner and
//! receive-limit layers around the same services — in process: a tonic client whose
//! "channel" is that stack. So a JSON request is checked, counted, authorized and answered
//! exactly as the same request over gRPC (etcd's gateway gets the same by dialing its own
//! port), with the caller's token in the metadata and the caller's connection (its client
//! certificate, for CN authentication) in the request's extensions.

use std::convert::Infallible;
use std::time::Duration;

use prost::bytes::Buf;
use prost_reflect::{DynamicMessage, MessageDescriptor};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder, Streaming};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::{Request, Response, Status};
use tower::util::BoxCloneSyncService;

use crate::conn::ClientConnectInfo;

/// The gRPC stack, boxed (the gateway is not the hot path; gRPC calls never see the box).
pub type GrpcService = BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    Infallible,
>;

/// Encodes and decodes messages by their descriptors.
struct DynamicCodec {
    output: MessageDescriptor,
}

struct DynamicEncoder;

impl Encoder for DynamicEncoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn encode(&mut self, item: DynamicMessage, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::Message::encode(&item, buf)
            .map_err(|e| Status::internal(format!("encoding a request: {e}")))
    }
}

struct DynamicDecoder {
    output: MessageDescriptor,
}

impl Decoder for DynamicDecoder {
    type Item = DynamicMessage;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<DynamicMessage>, Status> {
        let msg = DynamicMessage::decode(self.output.clone(), buf.copy_to_bytes(buf.remaining()))
            .map_err(|e| Status::internal(format!("decoding a response: {e}")))?;
        Ok(Some(msg))
    }
}

impl Codec for DynamicCodec {
    type Encode = DynamicMessage;
    type Decode = DynamicMessage;
    type Encoder = DynamicEncoder;
    type Decoder = DynamicDecoder;

    fn encoder(&mut self) -> DynamicEncoder {
        DynamicEncoder
    }

    fn decoder(&mut self) -> DynamicDecoder {
        DynamicDecoder {
            output: self.output.clone(),
        }
    }
}

/// Who calls and how: what grpc-gateway v1 carries from an HTTP request into the gRPC call.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    pub metadata: MetadataMap,
    pub connection: Option<ClientConnectInfo>,
    /// From a `Grpc-Timeout` header.
    pub timeout: Option<Duration>,
}

impl CallContext {
    /// The metadata grpc-gateway v1 makes of `headers`: `Authorization` as `authorization`
    /// (etcd's server reads the token there as well as under `token`), and every
    /// `Grpc-Metadata-NAME` as `name`. A `Grpc-Timeout` the gateway cannot read is etcd's
    /// `InvalidArgument` "invalid grpc-timeout: …".
    pub fn from_headers(
        headers: &http::HeaderMap,
        connection: Option<ClientConnectInfo>,
    ) -> Result<CallContext, Status> {
        let mut metadata = MetadataMap::new();
        for (name, value) in headers {
            let key = if name == http::header::AUTHORIZATION {
                "authorization"
            } else if let Some(rest) = name.as_str().strip_prefix("grpc-metadata-") {
                rest
            } else {
                continue;
            };
            // Binary (`-bin`) metadata and values that are not visible ASCII carry nothing
            // Baton's server reads; they are left out rather than guessed at.
            let (Ok(key), Ok(value)) = (
                key.parse::<AsciiMetadataKey>(),
                AsciiMetadataValue::try_from(value.as_bytes()),
            ) else {
                continue;
            };
            metadata.append(key, value);
        }
        let timeout = match headers.get("grpc-timeout") {
            None => None,
            Some(v) => Some(parse_timeout(v.as_bytes()).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "invalid grpc-timeout: {}",
                    String::from_utf8_lossy(v.as_bytes())
                ))
            })?),
        };
        Ok(CallContext {
            metadata,
            connection,
            timeout,
        })
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        *request.metadata_mut() = self.metadata.clone();
        if let Some(conn) = &self.connection {
            request.extensions_mut().insert(conn.clone());
        }
        request
    }
}

/// gRPC's timeout syntax (grpc-gateway's `timeoutDecode`): digits and a unit, H M S m u n.
fn parse_timeout(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n.checked_mul(3600)?),
        b'M' => Duration::from_secs(n.checked_mul(60)?),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// What a call past its `Grpc-Timeout` ends with (Go's context error through grpc-go).
fn deadline_exceeded() -> Status {
    Status::deadline_exceeded("context deadline exceeded")
}

async fn with_timeout<T>(
    timeout: Option<Duration>,
    call: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match timeout {
        None => call.await,
        Some(t) => tokio::time::timeout(t, call)
            .await
            .unwrap_or_else(|_| Err(deadline_exceeded())),
    }
}

fn client(grpc: &GrpcService) -> tonic::client::Grpc<GrpcService> {
    tonic::client::Grpc::new(grpc.clone())
        // etcd's gateway dials with MaxCallRecvMsgSize(math.MaxInt32); the server bounds
        // what it accepts.
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

fn path(grpc_path: &str) -> http::uri::PathAndQuery {
    grpc_path
        .parse()
        .expect("gRPC paths come from descriptors: /package.Service/Method")
}

/// A unary call.
pub async fn unary(
    grpc: &GrpcService,
    ctx: &CallContext,
    grpc_path: &str,
    output: &MessageDescriptor,
    request: DynamicMessage,
) -> Result<Response<DynamicMessage>, Status> {
    let mut client = client(grpc);
    let codec = DynamicCodec {
        output: output.clone(),
    };
    with_timeout(ctx.timeout, async {
        client
            .ready()
            .await
            .map_err(|e: Infallible| -> Status { match e {} })?;
        client
            .unary(ctx.request(request), path(grpc_path), codec)
            .await
    })
    .await
}

/// A call answered with a stream, given its request stream (one message for a
/// server-streaming RPC). An error before the stream starts (a trailers-only answer) is
/// `Err`; one after, the stream's.
pub async fn streaming(
    grpc: &GrpcService,
    ctx: &CallContext,
    grpc_path: &str,
    output: &MessageDescriptor,
    requests: impl futures::Stream<Item = DynamicMessage> + Send + 'static,
) -> Result<Response<Streaming<DynamicMessage>>, Status> {
    let mut client = client(grpc);
    let codec = DynamicCodec {
        output: output.clone(),
    };
    with_timeout(ctx.timeout, async {
        client
            .ready()
            .await
            .map_err(|e: Infallible| -> Status { match e {} })?;
        client
            .streaming(ctx.request(requests), path(grpc_path), codec)
            .await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_grpc_gateway_s() {
        let mut h = http::HeaderMap::new();
        h.insert("authorization", "abc.12".parse().unwrap());
        h.insert("grpc-metadata-token", "def.13".parse().unwrap());
        h.insert("grpc-metadata-hasleader", "true".parse().unwrap());
        h.insert("token", "ignored".parse().unwrap());
        h.insert("grpc-timeout", "1500m".parse().unwrap());
        let ctx = CallContext::from_headers(&h, None).unwrap();
        assert_eq!(ctx.metadata.get("authorization").unwrap(), "abc.12");
        assert_eq!(ctx.metadata.get("token").unwrap(), "def.13");
        assert_eq!(ctx.metadata.get("hasleader").unwrap(), "true");
        assert_eq!(ctx.metadata.len(), 3);
        assert_eq!(ctx.timeout, Some(Duration::from_millis(1500)));
        h.insert("grpc-timeout", "soon".parse().unwrap());
        let e = CallContext::from_headers(&h, None).unwrap_err();
        assert_eq!(e.message(), "invalid grpc-timeout: soon");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
