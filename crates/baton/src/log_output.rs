//! `--log-outputs` (etcd's flag): where `baton serve`'s log lines go — stderr (`default`,
//! `stderr`), stdout, and files, any several at once.

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

/// The log's destinations; each log line is written whole to every one.
pub struct LogOutputs {
    stderr: bool,
    stdout: bool,
    files: Vec<Mutex<File>>,
}

impl LogOutputs {
    /// Opens the comma-separated outputs: `default` and `stderr` are stderr (etcd's
    /// `default` is stderr too unless it runs under systemd with zap, where it writes to the
    /// journal — which also captures stderr), `stdout`, or a path (created, appended to).
    pub fn open(list: &str) -> Result<LogOutputs> {
        let mut out = LogOutputs {
            stderr: false,
            stdout: false,
            files: Vec::new(),
        };
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "default" | "stderr" => out.stderr = true,
                "stdout" => out.stdout = true,
                "journal" | "systemd/journal" => bail!(
                    "--log-outputs {item}: writing to systemd's journal directly is not provided; \
                     use stderr, which systemd records in the journal"
                ),
                path => {
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .with_context(|| format!("--log-outputs: opening {path}"))?;
                    out.files.push(Mutex::new(file));
                }
            }
        }
        if !out.stdout && out.files.is_empty() {
            out.stderr = true;
        }
        Ok(out)
    }

    /// Colour codes only when every output is a terminal.
    pub fn is_terminal(&self) -> bool {
        self.files.is_empty()
            && (!self.stderr || io::stderr().is_terminal())
            && (!self.stdout || io::stdout().is_terminal())
    }
}

/// One log line being formatted: collected, then written to every output at once, so lines
/// from concurrent tasks never interleave.
pub struct LineWriter<'a> {
    outputs: &'a LogOutputs,
    buf: Vec<u8>,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter<'_> {
    fn drop(&mut self) {
        // A log line that cannot be written has nowhere to be reported.
        if self.outputs.stderr {
            let _ = io::stderr().write_all(&self.buf);
        }
        if self.outputs.stdout {
            let _ = io::stdout().write_all(&self.buf);
        }
        for f in &self.outputs.files {
            if let Ok(mut f) = f.lock() {
                let _ = f.write_all(&self.buf);
            }
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogOutputs {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter {
            outputs: self,
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn every_file_output_gets_each_whole_line() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
        std::fs::write(&a, "before\n").unwrap();
        let outputs = LogOutputs::open(&format!("{}, {}", a.display(), b.display())).unwrap();
        assert!(!outputs.stderr && !outputs.stdout && !outputs.is_terminal());
        {
            let mut w = outputs.make_writer();
            w.write_all(b"one ").unwrap();
            w.write_all(b"line\n").unwrap();
        }
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "before\none line\n");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "one line\n");
    }

    #[test]
    fn default_is_stderr_and_the_journal_is_refused() {
        let o = LogOutputs::open("default").unwrap();
        assert!(o.stderr && !o.stdout && o.files.is_empty());
        let o = LogOutputs::open("").unwrap();
        assert!(o.stderr);
        let o = LogOutputs::open("stdout").unwrap();
        assert!(o.stdout && !o.stderr);
        let e = LogOutputs::open("journal").err().unwrap().to_string();
        assert!(e.starts_with("--log-outputs journal: "), "{e}");
    }
}
