//! `Maintenance.Snapshot`'s stream: a frozen copy of the state written as etcd's backend
//! (`baton_snapshot`) on a blocking thread, cut into etcd's 32 KiB chunks, each carrying the
//! bytes still to come, then the SHA-256 of everything as the last message — what
//! `etcdctl snapshot save` (and `baton snapshot save`) expect.
//!
//! The copy is O(1) (see `Node::frozen_state`); no lock is held while writing. Memory is
//! bounded: the writer's one page being filled plus the first keys of its pages (see
//! `baton_bbolt::Writer`), and at most `QUEUED_CHUNKS` chunks waiting for the client: the
//! writer blocks when they are all queued (backpressure from the gRPC stream's flow
//! control), and stops when the client goes away.

use std::io::{self, Write};

use baton_proto::etcdserverpb as pb;
use baton_snapshot::{HashingWriter, SnapshotSource};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// etcd's `snapshotSendBufferSize`: a chunk is a few OS pages.
pub(crate) const CHUNK_BYTES: usize = 32 * 1024;
/// Chunks queued for the client at most (128 KiB): enough to keep the stream busy while the
/// writer makes the next one, little enough to be nothing beside the state.
const QUEUED_CHUNKS: usize = 4;

/// The response stream of one snapshot.
pub(crate) type SnapshotChunks = ReceiverStream<Result<pb::SnapshotResponse, Status>>;

/// Starts writing `source` and returns the stream its chunks arrive on.
pub(crate) fn start(source: SnapshotSource) -> SnapshotChunks {
    let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let started = tokio::time::Instant::now();
        match write(&source, &tx) {
            Ok(total) => {
                let secs = started.elapsed().as_secs_f64();
                metrics::histogram!("etcd_disk_backend_snapshot_duration_seconds").record(secs);
                tracing::info!(
                    total_bytes = total,
                    took_s = secs,
                    "sent database snapshot to client"
                );
            }
            // The client went away: nothing to tell it.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                tracing::info!("snapshot stream closed by the client before its end");
            }
            Err(e) => {
                tracing::warn!(error = %e, "failed to write a snapshot");
                let _ = tx.blocking_send(Err(Status::internal(format!("baton: snapshot: {e}"))));
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Plans and writes the file, then the trailer; returns the database's size.
fn write(
    source: &SnapshotSource,
    tx: &mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
) -> io::Result<u64> {
    let layout = source.plan()?;
    let total = layout.file_bytes();
    tracing::info!(total_bytes = total, "sending database snapshot to client");
    let sink = ChunkSink {
        tx: tx.clone(),
        chunk: Vec::with_capacity(CHUNK_BYTES),
        sent: 0,
        total,
    };
    let hashing = source.write(HashingWriter::new(sink), layout)?;
    let (sha, mut sink) = hashing.finish();
    sink.send_chunk()?;
    assert_eq!(sink.sent, total, "the stream carried the planned size");
    send(
        tx,
        pb::SnapshotResponse {
            header: None,
            remaining_bytes: 0,
            blob: sha.to_vec(),
        },
    )?;
    Ok(total)
}

fn send(
    tx: &mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
    msg: pb::SnapshotResponse,
) -> io::Result<()> {
    tx.blocking_send(Ok(msg))
        .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
}

/// Cuts the bytes written into chunks and sends each, blocking while the queue is full.
struct ChunkSink {
    tx: mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
    chunk: Vec<u8>,
    sent: u64,
    total: u64,
}

impl ChunkSink {
    fn send_chunk(&mut self) -> io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        self.sent += self.chunk.len() as u64;
        let blob = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK_BYTES));
        send(
            &self.tx,
            pb::SnapshotResponse {
                header: None,
                remaining_bytes: self.total.saturating_sub(self.sent),
                blob,
            },
        )
    }
}

impl Write for ChunkSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK_BYTES - self.chunk.len());
        self.chunk.extend_from_slice(&buf[..n]);
        if self.chunk.len() == CHUNK_BYTES {
            self.send_chunk()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::{Command, CommandIndex, Entry, PutRequest, StateMachine, Term};
    use baton_snapshot::SHA256_LEN;

    fn source(keys: u64) -> SnapshotSource {
        let mut sm = StateMachine::new();
        for i in 0..keys {
            sm.apply(&Entry {
                index: CommandIndex(i),
                term: Term(1),
                time_ms: i,
                command: Command::Put(PutRequest {
                    key: format!("key/{i:06}").into_bytes(),
                    value: vec![b'v'; 100],
                    ..PutRequest::default()
                }),
            });
        }
        SnapshotSource {
            state: sm,
            consistent_index: keys,
            members: Vec::new(),
        }
    }

    /// Full 32 KiB chunks but the last, each saying what is still to come, then the trailer;
    /// the writer waits while the (bounded) queue is full and the reader reads slowly.
    #[test]
    fn chunks_count_down_to_the_trailer() {
        let src = source(3000);
        let total = src.plan().unwrap().file_bytes();
        let (tx, mut rx) = mpsc::channel(QUEUED_CHUNKS);
        let writer = std::thread::spawn(move || write(&src, &tx));
        let mut got = Vec::new();
        let mut chunks = Vec::new();
        while let Some(msg) = rx.blocking_recv() {
            let msg = msg.unwrap();
            chunks.push((msg.blob.len(), msg.remaining_bytes));
            got.push(msg.blob);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(writer.join().unwrap().unwrap(), total);
        let (sha, db) = got.split_last().unwrap();
        let db: Vec<u8> = db.concat();
        assert_eq!(db.len() as u64, total);
        assert!(
            chunks.len() > QUEUED_CHUNKS + 2,
            "several chunks: {}",
            chunks.len()
        );
        let mut remaining = total;
        for (len, left) in &chunks[..chunks.len() - 1] {
            remaining -= *len as u64;
            assert_eq!(*left, remaining);
        }
        assert!(chunks[..chunks.len() - 2]
            .iter()
            .all(|(len, _)| *len == CHUNK_BYTES));
        assert_eq!(chunks.last(), Some(&(SHA256_LEN, 0)));
        let mut h = HashingWriter::new(std::io::sink());
        h.write_all(&db).unwrap();
        assert_eq!(h.finish().0.as_slice(), sha.as_slice());
    }

    /// A client that goes away stops the writer (it does not write the rest into nothing).
    #[test]
    fn a_client_gone_stops_the_writer() {
        let src = source(3000);
        let (tx, mut rx) = mpsc::channel(QUEUED_CHUNKS);
        let writer = std::thread::spawn(move || write(&src, &tx));
        rx.blocking_recv().unwrap().unwrap();
        drop(rx);
        let err = writer.join().unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
