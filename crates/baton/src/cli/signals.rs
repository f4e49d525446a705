//! SIGINT and SIGTERM as events a command waits for (to release what it holds first).

/// Resolves on SIGINT or SIGTERM and says which (for the conventional 128+N exit status).
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers. Done before anything is acquired, so a Ctrl-C at any point is
    /// handled by us (and the lock released) rather than killing the process mid-way.
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM; returns the signal number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
        }
    }
}
