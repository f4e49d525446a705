//! The SHA-256 trailer: the 32 bytes a snapshot stream ends with, over everything before
//! them. A file has one when its size modulo 512 is 32 (etcd's `hasChecksum`: a bbolt file
//! is whole pages, and 512 divides every page size); a file copied out of a data directory
//! has none and restores only with `--skip-hash-check`, as etcdctl's.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

/// The trailer's length.
pub const SHA256_LEN: usize = 32;

/// Why a snapshot file's trailer does not vouch for it. The messages are etcdctl's.
#[derive(Debug, thiserror::Error)]
pub enum TrailerError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("snapshot missing hash but --skip-hash-check=false")]
    Missing,
    #[error("expected sha256 {expected:?}, got {got:?}")]
    Mismatch { expected: Vec<u8>, got: Vec<u8> },
}

/// etcd's `hasChecksum`.
pub fn has_trailer(size: u64) -> bool {
    size % 512 == SHA256_LEN as u64
}

/// Checks `file`'s trailer (unless `skip`) and returns the length of the database in it
/// (the file without its trailer, if it has one). Reads the file once; memory is a buffer.
pub fn verify_trailer(file: &mut File, skip: bool) -> Result<u64, TrailerError> {
    let size = file.metadata()?.len();
    let with = has_trailer(size);
    let db_len = if with { size - SHA256_LEN as u64 } else { size };
    if skip {
        return Ok(db_len);
    }
    if !with {
        return Err(TrailerError::Missing);
    }
    let mut expected = vec![0u8; SHA256_LEN];
    file.seek(SeekFrom::Start(db_len))?;
    file.read_exact(&mut expected)?;
    file.seek(SeekFrom::Start(0))?;
    let mut h = Sha256::new();
    io::copy(&mut file.take(db_len), &mut HashOnly(&mut h))?;
    let got = h.finalize().to_vec();
    file.seek(SeekFrom::Start(0))?;
    if got != expected {
        return Err(TrailerError::Mismatch { expected, got });
    }
    Ok(db_len)
}

struct HashOnly<'a>(&'a mut Sha256);

impl Write for HashOnly<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Passes bytes on to `W` and hashes them, for the trailer of a stream being written.
pub struct HashingWriter<W: Write> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hash: Sha256::new(),
        }
    }

    /// The digest of everything written, and the writer.
    pub fn finish(self) -> ([u8; SHA256_LEN], W) {
        (self.hash.finalize().into(), self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
