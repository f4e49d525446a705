//! What the client port's `:authority` adaptor costs per request, in isolation: one
//! connection's client bytes read through `AuthorityRewrite` in 8 KiB reads (h2's), either
//! followed (what every client connection gets) or passed (the baseline: the same reads with
//! nothing looked at). A benchmark, not a test; run it under callgrind for instruction counts:
//!
//! ```sh
//! cargo build --release -p baton-server --example authority_overhead
//! valgrind --tool=callgrind target/release/examples/authority_overhead follow go 20000
//! valgrind --tool=callgrind target/release/examples/authority_overhead pass go 20000
//! ```
//!
//! `go`: each request as grpc-go sends one (etcd's clients): every field indexed after the
//! first request but a fresh `grpc-timeout` literal (Huffman, incremental indexing), and a
//! DATA frame with a small put. `h2`: as Rust's h2 clients without a deadline send one
//! (tonic's, `baton bench`'s): every field indexed but `:path`, a literal without indexing,
//! so the block leaves the table as it was and the adaptor passes it undecoded. `url`: like
//! `go` with an `http://` URL as `:authority` (every block rewritten).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use baton_server::authority::AuthorityRewrite;
use baton_server::transport::AUTHORITY_LIMITS;
use httlib_hpack::Encoder;
use tokio::io::{AsyncRead, ReadBuf};

const INDEX: u8 = Encoder::WITH_INDEXING | Encoder::HUFFMAN_VALUE | Encoder::BEST_FORMAT;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `requests` requests on one connection, as the named client sends them.
fn connection(client: &str, requests: u32) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    let authority = if client == "url" {
        "http://127.0.0.1:2379"
    } else {
        "127.0.0.1:2379"
    };
    let mut enc = Encoder::default();
    let put = [
        &[0u8, 0, 0, 0, 22][..],
        &[0x0a, 8],
        b"key-0001",
        &[0x12, 8],
        b"value-01",
    ]
    .concat();
    for i in 0..requests {
        let mut block = Vec::new();
        let mut field = |name: &str, value: &str, flags: u8| {
            let f = (name.as_bytes().to_vec(), value.as_bytes().to_vec(), flags);
            enc.encode(f, &mut block).expect("encodes");
        };
        field(":method", "POST", INDEX);
        field(":scheme", "http", INDEX);
        // h2's encoder never indexes a path: a literal under the static name, each time.
        let path_flags = if client == "h2" {
            Encoder::HUFFMAN_VALUE | Encoder::BEST_FORMAT
        } else {
            INDEX
        };
        field(":path", "/etcdserverpb.KV/Put", path_flags);
        field(":authority", authority, INDEX);
        field("content-type", "application/grpc", INDEX);
        field("user-agent", "grpc-go/1.26.0", INDEX);
        field("te", "trailers", INDEX);
        if client != "h2" {
            field("grpc-timeout", &format!("{}u", 4_999_000 + i % 1000), INDEX);
        }
        let stream = 1 + 2 * i;
        out.extend(frame(0x1, 0x4, stream, &block));
        out.extend(frame(0x0, 0x1, stream, &put));
    }
    out
}

/// The client's bytes, handed out as a socket would: as much as the reader asks for.
struct Socket {
    bytes: Vec<u8>,
    at: usize,
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let n = (this.bytes.len() - this.at).min(buf.remaining());
        buf.put_slice(&this.bytes[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

/// Reads everything through `io` in 8 KiB reads; returns the bytes read.
fn drain(mut io: AuthorityRewrite<Socket>) -> usize {
    let mut cx = Context::from_waker(Waker::noop());
    let mut space = vec![0u8; 8192];
    let mut total = 0;
    loop {
        let mut buf = ReadBuf::new(&mut space);
        match Pin::new(&mut io).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => return total,
            Poll::Ready(Ok(())) => total += buf.filled().len(),
            other => panic!("{other:?}"),
        }
    }
}

#[allow(clippy::disallowed_methods)] // a measurement of elapsed time, not a deadline
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: authority_overhead follow|pass go|h2|url REQUESTS";
    let mode = args.get(1).expect(usage).clone();
    let client = args.get(2).expect(usage).clone();
    let requests: u32 = args.get(3).expect(usage).parse().expect(usage);
    let bytes = connection(&client, requests);
    let socket = Socket {
        bytes: bytes.clone(),
        at: 0,
    };
    let io = match mode.as_str() {
        "follow" => AuthorityRewrite::new(socket, AUTHORITY_LIMITS),
        "pass" => AuthorityRewrite::passthrough(socket),
        _ => panic!("{usage}"),
    };
    let start = std::time::Instant::now();
    let read = drain(io);
    let elapsed = start.elapsed();
    if client != "url" {
        assert_eq!(read, bytes.len(), "nothing changed");
    }
    println!(
        "{mode} {client}: {requests} requests, {} bytes in, {read} out, {:.0} ns/request",
        bytes.len(),
        elapsed.as_nanos() as f64 / f64::from(requests)
    );
}
