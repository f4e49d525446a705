//! A minimal unary gRPC client straight on the `h2` crate: the hot path of the key-value
//! workloads (put, txn-put, range).
//!
//! Why not tonic: on this 2-core machine the client shares the CPU with the server under
//! test, so every microsecond the client spends per request is taken from the server.
//! tonic's `Channel` (a tower buffer with its own worker task, hyper's client dispatch,
//! per-request timeout and body-encoding layers) costs about 26 µs of client CPU per put at
//! 100 clients over 10 connections; this costs far less (numbers in bench/README.md).
//!
//! What it does: one HTTP/2 connection per [`H2Conn`], a POST per request with the message
//! in one length-prefixed gRPC frame (uncompressed), the response read whole, `grpc-status`
//! checked in the trailers (or in the headers of a trailers-only response). Nothing else:
//! no compression, no retries, no deadlines on the wire (the caller times out).

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, TE};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use prost::Message;

/// A gRPC path, e.g. `/etcdserverpb.KV/Put`.
pub type Path = &'static str;

pub const KV_PUT: Path = "/etcdserverpb.KV/Put";
pub const KV_RANGE: Path = "/etcdserverpb.KV/Range";
pub const KV_TXN: Path = "/etcdserverpb.KV/Txn";

/// What keeps a connection's HTTP/2 state moving (reads responses, writes requests): a
/// future that ends when the connection closes. [`H2Conn::connect`] spawns it on its own
/// task; [`H2Conn::connect_driven`] hands it to the caller, to poll in the task that also
/// runs the connection's requests (see [`crate::kv`]).
pub type Driver = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// etcd's metadata key for the auth token.
const TOKEN: HeaderName = HeaderName::from_static("token");

/// One HTTP/2 connection. Clones share it (many requests in flight on it at once).
#[derive(Clone)]
pub struct H2Conn {
    send: h2::client::SendRequest<Bytes>,
    authority: http::uri::Authority,
    scheme: &'static str,
    /// The `token` metadata of every request (`--auth`: `security::token` at connect).
    token: Option<http::HeaderValue>,
}

impl H2Conn {
    /// Connects to `endpoint` (`host:port`, `http://host:port`, or `https://host:port` with
    /// this process's client TLS, `security`).
    pub async fn connect(endpoint: &str) -> Result<H2Conn> {
        let (conn, driver) = H2Conn::connect_driven(endpoint).await?;
        // Ends when the connection closes; requests then fail with the reason.
        tokio::spawn(driver);
        Ok(conn)
    }

    /// [`H2Conn::connect`] without spawning the connection's [`Driver`]: the caller polls
    /// it, or no request on the connection ever completes.
    pub async fn connect_driven(endpoint: &str) -> Result<(H2Conn, Driver)> {
        let tls = endpoint.starts_with("https://");
        let authority: http::uri::Authority = endpoint
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("endpoint {endpoint}"))?;
        let tcp = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(authority.as_str()),
        )
        .await
        .map_err(|_| anyhow!("connecting to {endpoint}: timed out"))?
        .with_context(|| format!("connecting to {endpoint}"))?;
        tcp.set_nodelay(true)?;
        let mut builder = h2::client::Builder::new();
        builder
            .initial_window_size(1 << 20)
            .initial_connection_window_size(8 << 20);
        let (send, driver) = if tls {
            let name = rustls_pki_types::ServerName::try_from(authority.host().to_string())
                .with_context(|| format!("TLS server name of {endpoint}"))?;
            let stream = tokio_rustls::TlsConnector::from(crate::security::rustls_config()?)
                .connect(name, tcp)
                .await
                .with_context(|| format!("TLS handshake with {endpoint}"))?;
            let (send, connection) = builder
                .handshake::<_, Bytes>(stream)
                .await
                .with_context(|| format!("HTTP/2 handshake with {endpoint}"))?;
            let driver: Driver = Box::pin(async move {
                let _ = connection.await;
            });
            (send, driver)
        } else {
            let (send, connection) = builder
                .handshake::<_, Bytes>(tcp)
                .await
                .with_context(|| format!("HTTP/2 handshake with {endpoint}"))?;
            let driver: Driver = Box::pin(async move {
                let _ = connection.await;
            });
            (send, driver)
        };
        let token = crate::security::token_for(endpoint)
            .map(|t| http::HeaderValue::from_str(&t))
            .transpose()
            .context("the auth token is not a header value")?;
        let conn = H2Conn {
            send,
            authority,
            scheme: if tls { "https" } else { "http" },
            token,
        };
        Ok((conn, driver))
    }

    /// One unary call: `req` to `path`, the decoded response back. The request is encoded
    /// at once, so the future borrows nothing.
    pub fn unary<Req: Message, Resp: Message + Default>(
        &self,
        path: Path,
        req: &Req,
    ) -> impl std::future::Future<Output = Result<Resp>> + Send + 'static {
        let body = frame(req);
        let this = self.clone();
        async move { this.call(path, body).await.and_then(unframe) }
    }

    async fn call(self, path: Path, body: Bytes) -> Result<Bytes> {
        let uri = Uri::builder()
            .scheme(self.scheme)
            .authority(self.authority)
            .path_and_query(PathAndQuery::from_static(path))
            .build()
            .context("request URI")?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .body(())
            .context("request")?;
        // Names and values made once, not parsed from strings on every request.
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        if let Some(token) = &self.token {
            headers.insert(TOKEN, token.clone());
        }
        let mut send = self.send.ready().await.context("HTTP/2 connection")?;
        let (response, mut stream) = send
            .send_request(request, false)
            .context("sending the request")?;
        stream
            .send_data(body, true)
            .context("sending the request body")?;
        let response = response.await.context("awaiting the response")?;
        let (parts, mut body) = response.into_parts();
        if parts.status != http::StatusCode::OK {
            bail!("HTTP status {}", parts.status);
        }
        // A trailers-only response (an error) carries grpc-status in the headers.
        check_status(&parts.headers)?;
        let mut data = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.context("reading the response")?;
            let _ = body.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
        }
        match body.trailers().await.context("reading the trailers")? {
            Some(trailers) => check_status(&trailers)?,
            None if parts.headers.contains_key("grpc-status") => {}
            None => bail!("response without grpc-status"),
        }
        Ok(data.freeze())
    }
}

/// `msg` as one uncompressed gRPC frame: flag 0, 4-byte big-endian length, the message.
pub fn frame<M: Message>(msg: &M) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    msg.encode(&mut buf).expect("capacity reserved");
    buf.freeze()
}

/// Decodes the single message of a unary response body.
pub fn unframe<M: Message + Default>(mut body: Bytes) -> Result<M> {
    if body.len() < 5 {
        bail!("response body of {} bytes, no gRPC frame", body.len());
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        bail!("compressed response (not negotiated)");
    }
    if body.len() != len {
        bail!(
            "gRPC frame says {len} bytes, body has {} (one message expected)",
            body.len()
        );
    }
    M::decode(body).context("decoding the response")
}

/// `Ok` if `grpc-status` is absent or 0; the status and message otherwise.
fn check_status(headers: &HeaderMap) -> Result<()> {
    let Some(status) = headers.get("grpc-status") else {
        return Ok(());
    };
    let code = status.to_str().unwrap_or("?");
    if code == "0" {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("");
    let code = code
        .parse::<i32>()
        .map(tonic::Code::from)
        .map_or_else(|_| code.to_string(), |c| format!("{c:?}"));
    bail!("gRPC status {code}: {}", percent_decode(message))
}

/// grpc-message is percent-encoded.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_proto::etcdserverpb::{PutRequest, RangeResponse};

    #[test]
    fn frames_round_trip() {
        let req = PutRequest {
            key: b"k".to_vec(),
            value: vec![7; 300],
            ..Default::default()
        };
        let framed = frame(&req);
        assert_eq!(framed[0], 0);
        assert_eq!(
            u32::from_be_bytes(framed[1..5].try_into().unwrap()) as usize,
            framed.len() - 5
        );
        let back: PutRequest = unframe(framed).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn bad_frames_are_errors() {
        assert!(unframe::<RangeResponse>(Bytes::from_static(b"\0\0\0")).is_err());
        assert!(unframe::<RangeResponse>(Bytes::from_static(b"\x01\0\0\0\0")).is_err());
        assert!(unframe::<RangeResponse>(Bytes::from_static(b"\0\0\0\0\x05ab")).is_err());
        // An empty message is a valid (default) response.
        assert!(unframe::<RangeResponse>(Bytes::from_static(b"\0\0\0\0\0")).is_ok());
    }

    #[test]
    fn grpc_status() {
        let mut h = HeaderMap::new();
        assert!(check_status(&h).is_ok());
        h.insert("grpc-status", "0".parse().unwrap());
        assert!(check_status(&h).is_ok());
        h.insert("grpc-status", "14".parse().unwrap());
        h.insert(
            "grpc-message",
            "etcdserver:%20leader%20changed".parse().unwrap(),
        );
        let e = check_status(&h).unwrap_err().to_string();
        assert_eq!(e, "gRPC status Unavailable: etcdserver: leader changed");
    }
}
