//! The gate a leader transfer closes ([`TransferGate`]): while it is closed, proposals, read
//! indexes and membership changes on this member wait, so that nothing renews the
//! followers' leader leases while the transferee waits for them to expire (`transfer`).

use tokio::time::Instant;

/// `true` while a transfer runs.
pub(crate) struct TransferGate {
    active: tokio::sync::watch::Sender<bool>,
}

impl TransferGate {
    pub(crate) fn new() -> Self {
        TransferGate {
            active: tokio::sync::watch::channel(false).0,
        }
    }

    /// Closes the gate; `false` if it was closed already (another transfer runs).
    pub(crate) fn close(&self) -> bool {
        !self.active.send_replace(true)
    }

    pub(crate) fn open(&self) {
        self.active.send_replace(false);
    }

    /// Whether a leader transfer holds the gate now.
    pub(crate) fn is_closed(&self) -> bool {
        *self.active.borrow()
    }

    /// Waits while the gate is closed (at most until `deadline`).
    pub(crate) async fn wait(&self, deadline: Instant) {
        let mut rx = self.active.subscribe();
        if !*rx.borrow() {
            return;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        // Boxed: rare, and every proposal's future would carry the timer's state otherwise.
        let _ = Box::pin(tokio::time::timeout(
            remaining,
            rx.wait_for(|active| !*active),
        ))
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_closed_gate_holds_until_opened_or_the_deadline() {
        let gate = std::sync::Arc::new(TransferGate::new());
        assert!(!gate.is_closed());
        gate.wait(Instant::now()).await;
        assert!(gate.close());
        assert!(!gate.close(), "a second transfer finds the gate closed");
        let start = Instant::now();
        gate.wait(start + Duration::from_millis(20)).await;
        assert!(start.elapsed() >= Duration::from_millis(20));
        let g = gate.clone();
        let opener = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            g.open();
        });
        gate.wait(Instant::now() + Duration::from_secs(10)).await;
        assert!(!gate.is_closed());
        opener.await.unwrap();
    }
}
