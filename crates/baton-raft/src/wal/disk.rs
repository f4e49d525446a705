//! The real disk under the log writer: files on the data directory's file system,
//! allocated ahead with fallocate(2) and made durable with fdatasync(2). The simulation
//! injects its own [`LogDisk`] instead (`crate::env`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::env::{LogDisk, LogFile};

/// The file system the data directory is on.
pub(crate) struct RealDisk;

impl LogDisk for RealDisk {
    fn open(&self, path: &Path, _durable: u64) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().write(true).open(path)?;
        Ok(Box::new(RealFile(file)))
    }
}

/// One log file, opened for writing.
struct RealFile(File);

impl LogFile for RealFile {
    fn file_len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn allocate(&mut self, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain syscall on a file descriptor we own, no pointers involved.
        let rc = unsafe {
            libc::fallocate(
                self.0.as_raw_fd(),
                0,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    #[allow(clippy::disallowed_methods)] // Measures the real disk (the 2 ms inline rule), no deadline.
    fn sync(&mut self) -> io::Result<Duration> {
        let t = Instant::now();
        self.0.sync_data()?;
        Ok(t.elapsed())
    }
}
