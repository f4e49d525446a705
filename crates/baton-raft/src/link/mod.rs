//! The peer link: the peer pipe's calls as length-prefixed frames on a plain byte stream
//! (TCP, or TLS under peer TLS), one connection per pair of members, no HTTP/2.
//!
//! Why: the gRPC pipe (`pipe`) made a call one frame each way, but every frame still
//! crossed the whole HTTP/2 stack on both ends — tonic's encoder and body, h2's stream and
//! flow-control state, its connection task, WINDOW_UPDATEs — and the profile of a 3-member
//! put with 100 clients put hyper/h2/tonic at 42–51 % of every member's CPU, a good part of
//! it the peer port (issue 19, item 4). Here a call is a 5-byte header and the protobuf
//! `PipeFrame` the gRPC pipe sends; frames queued meanwhile leave in one write.
//!
//! What does not change: each call frame is served exactly as the gRPC pipe's frame and as
//! its method's unary call (`PeerService::serve_frame`: the same envelope checks — format,
//! cluster, receiver, cluster-token credential, sender — and the same handler), a refusal
//! comes back as the status that call would have ended with, and the stream is the one the
//! peer transport makes, so under peer TLS the link exists only after the TLS handshake
//! checked the peer's certificate. InstallSnapshot and Members stay unary gRPC.
//!
//! # Wire format (version 1; pinned by `golden` tests)
//! - The dialer opens with [`frame::HELLO`] (24 bytes, as long as HTTP/2's client preface, which
//!   it cannot be mistaken for); the listener answers the same 24 bytes before any frame.
//!   The peer port tells a link from gRPC by these bytes (`sniff`), so both share
//!   `--listen-peer-urls`. A peer that answers anything else, or closes the connection
//!   instead (an older build: its HTTP/2 server answers with its SETTINGS frame), does not
//!   speak the link: nothing sent on it was served, and its calls take the gRPC pipe
//!   (`client`), the link being tried again after `pipe::RETRY_UNSUPPORTED`.
//! - Then frames both ways: a big-endian `u32` length of what follows, a kind byte, and
//!   the body. [`frame::Kind::Call`] (dialer → listener) and [`frame::Kind::Answer`] (back) carry a
//!   protobuf `PipeFrame`, answers in completion order under their call's id;
//!   [`frame::Kind::Ping`]/[`frame::Kind::Pong`] are empty, the keep-alive that HTTP/2 pings were.
//!   A length of zero, or above `pipe::MAX_FRAME_BYTES` + 1, or an unknown kind ends the
//!   connection.
//!
//! A new version gets a new hello: an older listener refuses it as above and the dialer
//! falls back, so members of two versions still talk.

mod client;
mod frame;
mod outbox;
mod server;
mod sniff;

use std::io;

use crate::env::{DialFuture, PeerStream};

pub(crate) use client::open;
pub(crate) use sniff::{accept_incoming, accept_tcp};

/// The host and port of a peer URL (`http://host:port`, `https://[::1]:port`), as a socket
/// connect takes them; a URL without a port gets its scheme's.
pub fn peer_host_port(url: &str) -> io::Result<(String, u16)> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let uri: tonic::transport::Uri = url
        .parse()
        .map_err(|e| invalid(format!("bad peer URL {url}: {e}")))?;
    let host = uri
        .host()
        .ok_or_else(|| invalid(format!("no host in peer URL {url}")))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("https")) => 443,
        (None, _) => 80,
    };
    Ok((host, port))
}

/// Dials an `http://` peer URL over plain TCP (no delay: small frames, each awaited).
pub fn dial_plain(url: &str) -> DialFuture {
    let url = url.to_string();
    Box::pin(async move {
        let (host, port) = peer_host_port(&url)?;
        let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        stream.set_nodelay(true)?;
        Ok(Box::new(stream) as Box<dyn PeerStream>)
    })
}

#[cfg(test)]
mod tests;
