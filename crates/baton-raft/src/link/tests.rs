use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::baton::raft::v1::{PeerMessage, PipeFrame, PipeMethod};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::Status;

use super::client::{self, open};
use super::frame::{put_frame, FrameReader, Kind, HELLO};
use super::sniff::{sniff, Sniffed};
use super::{outbox, peer_host_port, server};
use crate::env::{DialFuture, PeerStream};
use crate::golden::{assert_no_problems, compare_file, golden_dir, header, orphans};
use crate::wire::PEER_FORMAT_VERSION;
use prost::Message as _;

fn message(payload: &[u8]) -> PeerMessage {
    PeerMessage {
        cluster_id: 0x1111,
        from: 2,
        to: 3,
        payload: payload.to_vec(),
        credential: vec![0xcc; 4],
        format_version: PEER_FORMAT_VERSION,
        lease_verdict: None,
    }
}

fn call(call_id: u64, payload: &[u8]) -> PipeFrame {
    PipeFrame {
        call_id,
        method: PipeMethod::Vote as i32,
        message: Some(message(payload)),
        ..Default::default()
    }
}

async fn read_all(bytes: Vec<u8>) -> Vec<(Kind, Option<PipeFrame>)> {
    let mut reader = FrameReader::new(&bytes[..]);
    let mut out = Vec::new();
    loop {
        while let Some(f) = reader.next_buffered().unwrap() {
            out.push(f);
        }
        if reader.fill().await.unwrap() == 0 {
            return out;
        }
    }
}

#[tokio::test]
async fn frames_read_back_as_written() {
    let mut bytes = Vec::new();
    put_frame(&mut bytes, Kind::Call, Some(&call(7, b"vote?")));
    put_frame(&mut bytes, Kind::Ping, None);
    put_frame(&mut bytes, Kind::Answer, Some(&call(7, &[9; 70_000])));
    let frames = read_all(bytes.clone()).await;
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[0], (Kind::Call, Some(call(7, b"vote?"))));
    assert_eq!(frames[1], (Kind::Ping, None));
    assert_eq!(frames[2], (Kind::Answer, Some(call(7, &[9; 70_000]))));

    // A frame split anywhere is only taken whole.
    for cut in [1, 4, 5, 6, bytes.len() - 1] {
        let mut reader = FrameReader::new(&bytes[cut..]);
        reader.buf.extend_from_slice(&bytes[..cut]);
        let first = reader.next_buffered().unwrap();
        if cut < 5 + call(7, b"vote?").encoded_len() {
            assert_eq!(first, None, "cut at {cut}");
        }
    }
}

#[tokio::test]
async fn a_bad_length_or_kind_ends_the_link() {
    let too_long = ((crate::pipe::MAX_FRAME_BYTES + 2) as u32).to_be_bytes();
    for (bytes, why) in [
        (vec![0, 0, 0, 0, 1], "length 0"),
        ([&too_long[..], &[1]].concat(), "too long"),
        (vec![0, 0, 0, 1, 9], "kind 9"),
        (vec![0, 0, 0, 2, 3, 0], "a ping with a body"),
        (vec![0, 0, 0, 2, 1, 0xff], "a call that does not decode"),
    ] {
        let mut reader = FrameReader::new(&bytes[..]);
        reader.fill().await.unwrap();
        assert!(reader.next_buffered().is_err(), "{why}");
    }
}

/// The link's bytes on the wire are a contract between members of different builds.
#[test]
fn link_bytes_are_pinned() {
    let dir = golden_dir("link");
    let mut problems = Vec::new();
    let mut call_bytes = Vec::new();
    put_frame(&mut call_bytes, Kind::Call, Some(&call(5, b"payload")));
    let mut answer_bytes = Vec::new();
    let refused = crate::pipe::answer(5, Err(Status::permission_denied("no")));
    put_frame(&mut answer_bytes, Kind::Answer, Some(&refused));
    // An AppendEntries from the leader with its lease verdict in the envelope.
    let mut with_verdict = call(6, b"append");
    with_verdict.method = PipeMethod::AppendEntries as i32;
    if let Some(m) = with_verdict.message.as_mut() {
        m.lease_verdict = Some(baton_proto::baton::raft::v1::LeaseVerdict {
            term: 4,
            committed_index: 0x0102,
            alive_for_ms: 200,
        });
    }
    let mut with_verdict_bytes = Vec::new();
    put_frame(&mut with_verdict_bytes, Kind::Call, Some(&with_verdict));
    let mut ping = Vec::new();
    put_frame(&mut ping, Kind::Ping, None);
    let mut pong = Vec::new();
    put_frame(&mut pong, Kind::Pong, None);
    let samples: Vec<(&str, String, Vec<u8>)> = vec![
        ("hello", "the hello, both ways".into(), HELLO.to_vec()),
        ("call", format!("{:?}", call(5, b"payload")), call_bytes),
        ("answer_refused", format!("{refused:?}"), answer_bytes),
        (
            "call_lease_verdict",
            format!("{with_verdict:?}"),
            with_verdict_bytes,
        ),
        ("ping", "ping".into(), ping),
        ("pong", "pong".into(), pong),
    ];
    for (name, value, bytes) in &samples {
        let h = header("link", name, "link frame", value);
        problems.extend(compare_file(&dir, name, &h, bytes));
    }
    let names: std::collections::BTreeSet<&str> = samples.iter().map(|(n, _, _)| *n).collect();
    problems.extend(orphans(&dir, &names));
    assert_no_problems(problems);
}

#[tokio::test]
async fn the_port_tells_a_link_from_http2() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let Sniffed::Other(mut other) = sniff(PREFACE).await.unwrap() else {
        panic!("HTTP/2's preface is not a link")
    };
    let mut back = Vec::new();
    other.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, PREFACE, "tonic reads every byte looked at");

    let mut stream = HELLO.to_vec();
    stream.extend_from_slice(b"frames");
    let Sniffed::Link(mut rest) = sniff(&stream[..]).await.unwrap() else {
        panic!("a hello is a link")
    };
    let mut after = Vec::new();
    rest.read_to_end(&mut after).await.unwrap();
    assert_eq!(after, b"frames", "nothing beyond the hello is consumed");

    // A hello's first bytes, then something else.
    let Sniffed::Other(mut other) = sniff(&b"baton.raft.v2"[..]).await.unwrap() else {
        panic!("another version is not this link")
    };
    let mut back = Vec::new();
    other.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"baton.raft.v2");
}

/// A dialer for one end of an in-memory stream.
fn dial_to(stream: tokio::io::DuplexStream) -> DialFuture {
    Box::pin(async move { Ok(Box::new(stream) as Box<dyn PeerStream>) })
}

/// Calls and answers over a link: answers in completion order reach their calls, and a
/// refusal comes back as the unary call's status.
#[tokio::test]
async fn calls_are_answered_over_a_link() {
    let (near, far) = tokio::io::duplex(64 * 1024);
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    tokio::spawn(async move {
        let Sniffed::Link(far) = sniff(far).await.unwrap() else {
            panic!("the dialer sends a hello")
        };
        server::serve(far, move |frame: PipeFrame| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let m = frame.message.unwrap();
                if m.payload == b"refuse" {
                    return Err(Status::permission_denied("baton: no"));
                }
                // The first call answers last.
                if m.payload == b"slow" {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(message(&[m.payload, b"!".to_vec()].concat()))
            }
        })
        .await
    });
    let pipe = open(dial_to(near));
    let (slow, fast, refused) = tokio::join!(
        pipe.call(PipeMethod::Vote, message(b"slow")),
        pipe.call(PipeMethod::Vote, message(b"fast")),
        pipe.call(PipeMethod::Vote, message(b"refuse")),
    );
    assert_eq!(slow.unwrap().payload, b"slow!");
    assert_eq!(fast.unwrap().payload, b"fast!");
    let refused = refused.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(refused.message(), "baton: no");
    assert_eq!(served.load(Ordering::SeqCst), 3);
    assert!(pipe.confirmed() && pipe.is_open());
}

/// A peer that answers the hello with something else — an older build's HTTP/2 server
/// sends its SETTINGS frame — or closes the connection does not speak the link: calls on
/// it fail as not delivered, and the pipe says so.
#[tokio::test]
async fn a_peer_that_does_not_answer_the_hello_does_not_speak_the_link() {
    for answer in [&b"\x00\x00\x06\x04\x00\x00\x00\x00\x00"[..], &b""[..]] {
        let (near, mut far) = tokio::io::duplex(1024);
        let sent = answer.to_vec();
        tokio::spawn(async move {
            let mut hello = [0u8; 24];
            far.read_exact(&mut hello).await.unwrap();
            far.write_all(&sent).await.unwrap();
            // Dropped: closed.
        });
        let pipe = open(dial_to(near));
        let e = pipe
            .call(PipeMethod::Vote, message(b"q"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(pipe.unsupported(), "answer {answer:?}");
    }
}

/// A dial that fails is a peer down, not an older build.
#[tokio::test]
async fn a_refused_dial_is_not_delivered_and_not_unsupported() {
    let dial: DialFuture = Box::pin(async { Err(std::io::ErrorKind::ConnectionRefused.into()) });
    let pipe = open(dial);
    let e = pipe
        .call(PipeMethod::Vote, message(b"q"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    let io = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the I/O error is the status's source");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(!pipe.unsupported());
}

/// A peer that went silent without closing (power loss, partition) is noticed by the
/// keep-alive: an idle link pings, and one whose ping goes unanswered is closed.
#[tokio::test(start_paused = true)]
async fn a_silent_peer_is_dropped_after_an_unanswered_ping() {
    let (near, mut far) = tokio::io::duplex(1024);
    let got = tokio::spawn(async move {
        let mut hello = [0u8; 24];
        far.read_exact(&mut hello).await.unwrap();
        far.write_all(HELLO).await.unwrap();
        let mut ping = [0u8; 5];
        far.read_exact(&mut ping).await.unwrap();
        // Keeps the stream open and answers nothing, until the test ends.
        let _open = far;
        std::future::pending::<()>().await;
        ping
    });
    let pipe = open(dial_to(near));
    tokio::time::sleep(client::KEEPALIVE / 2).await;
    assert!(pipe.is_open());
    tokio::time::sleep(client::KEEPALIVE * 3).await;
    assert!(!pipe.is_open(), "closed after the ping went unanswered");
    assert!(!pipe.unsupported());
    got.abort();
}

#[test]
fn peer_urls_give_host_and_port() {
    assert_eq!(
        peer_host_port("http://127.0.0.1:2380").unwrap(),
        ("127.0.0.1".to_string(), 2380)
    );
    assert_eq!(
        peer_host_port("https://[::1]:2380").unwrap(),
        ("::1".to_string(), 2380)
    );
    assert_eq!(
        peer_host_port("https://m1.example").unwrap(),
        ("m1.example".to_string(), 443)
    );
    assert!(peer_host_port("not a url").is_err());
}

/// Frames sent from many tasks at once over a stream that takes little at a time (so the
/// senders' direct writes stop short and the writer task finishes them) all arrive whole,
/// each sender's in the order sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_keeps_every_frame_whole_and_in_order() {
    let (near, far) = tokio::io::duplex(64);
    let (_, write) = tokio::io::split(near);
    let outbox = outbox::Outbox::new();
    let writer = outbox.start(write);
    let senders: Vec<_> = (0..3u64)
        .map(|task| {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                for i in 0..200u64 {
                    outbox
                        .send(Kind::Call, Some(&call(task * 1000 + i, &[i as u8; 300])))
                        .unwrap();
                    if i % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    let mut reader = FrameReader::new(far);
    let mut next = [0u64; 3];
    let mut got = 0;
    while got < 600 {
        while let Some((kind, frame)) = reader.next_buffered().unwrap() {
            assert_eq!(kind, Kind::Call);
            let id = frame.unwrap().call_id;
            let (task, i) = ((id / 1000) as usize, id % 1000);
            assert_eq!(i, next[task], "sender {task}'s frames in order");
            next[task] += 1;
            got += 1;
        }
        if got < 600 {
            assert!(reader.fill().await.unwrap() > 0);
        }
    }
    for s in senders {
        s.await.unwrap();
    }
    assert_eq!(next, [200; 3]);
    assert!(!writer.is_finished());
}

/// A peer that stops reading does not make frames pile up without bound: past the
/// outbox's limit sends fail and the writer task ends (the link with it).
#[tokio::test]
async fn an_outbox_a_peer_does_not_read_is_bounded() {
    let (near, _far) = tokio::io::duplex(1024);
    let (_, write) = tokio::io::split(near);
    let outbox = outbox::Outbox::new();
    let writer = outbox.start(write);
    let big = call(1, &vec![7; 1 << 20]);
    outbox.send(Kind::Call, Some(&big)).unwrap();
    // The writer task takes over and blocks in its write: nobody reads `_far`.
    tokio::task::yield_now().await;
    let sent = (0..200)
        .take_while(|_| outbox.send(Kind::Call, Some(&big)).is_ok())
        .count();
    assert!(sent < 200, "sends fail once too much is unwritten");
    assert!(outbox.send(Kind::Ping, None).is_err());
    let ended = tokio::time::timeout(Duration::from_secs(5), writer).await;
    assert!(ended.is_ok(), "the writer task ends with the outbox");
}
