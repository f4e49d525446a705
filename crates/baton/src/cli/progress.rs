//! A progress line on a terminal, as etcdctl's snapshot commands keep one: bytes (of the
//! total, when known), keys, and the rate, redrawn at most ten times a second on stderr, and
//! nothing at all when stderr is not a terminal (scripts and logs get the final line only).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use super::output::bytes_human;

const REDRAW_EVERY: Duration = Duration::from_millis(100);

pub struct Progress {
    label: &'static str,
    /// What the count counts ("key versions").
    unit: &'static str,
    started: Instant,
    last_draw: Option<Instant>,
    on_terminal: bool,
}

impl Progress {
    pub fn new(label: &'static str, unit: &'static str) -> Progress {
        Progress {
            label,
            unit,
            started: Instant::now(),
            last_draw: None,
            on_terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Redraws the line if it is due: `bytes` of `total` (if known) and the count (if known).
    pub fn update(&mut self, bytes: u64, total: Option<u64>, keys: Option<u64>) {
        if !self.on_terminal || self.last_draw.is_some_and(|t| t.elapsed() < REDRAW_EVERY) {
            return;
        }
        self.last_draw = Some(Instant::now());
        let line = self.line(bytes, total, keys);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }

    /// Ends the line (on a terminal).
    pub fn done(&mut self, bytes: u64, total: Option<u64>, keys: Option<u64>) {
        if self.on_terminal {
            let line = self.line(bytes, total, keys);
            eprintln!("\r\x1b[2K{line}");
        }
    }

    fn line(&self, bytes: u64, total: Option<u64>, keys: Option<u64>) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let mut line = format!("{}: {}", self.label, bytes_human(bytes as i64));
        if let Some(total) = total.filter(|t| *t > 0) {
            let pct = (bytes as f64 * 100.0 / total as f64).min(100.0);
            line += &format!(" of {} ({pct:.0}%)", bytes_human(total as i64));
        }
        if let Some(keys) = keys {
            let unit = self.unit;
            line += &format!(", {keys} {unit} ({:.0}/s)", keys as f64 / secs);
        }
        line += &format!(", {}/s", bytes_human((bytes as f64 / secs) as i64));
        line
    }
}
