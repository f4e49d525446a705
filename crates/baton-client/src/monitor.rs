//! What everything *held* (a lock, a permit, leadership) shares: it is lost when its
//! session is lost, or when its key disappears while the session lives (an operator's
//! force-release, a manual delete). Either way the holder learns it through one signal.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use crate::client::Client;
use crate::kv::GetOptions;
use crate::lost::LostReason;
use crate::session::{wait_lost, Session};
use crate::util::{backoff, AbortOnDrop};
use crate::watch::{EventKind, WatchOptions};

/// Watches one held key and its session.
pub(crate) struct Holding {
    rx: watch::Receiver<Option<LostReason>>,
    _task: AbortOnDrop,
}

impl Holding {
    /// Starts watching `key`, created at `create_rev`, held with `session`.
    pub(crate) fn start(session: &Session, key: Vec<u8>, create_rev: i64) -> Holding {
        let (tx, rx) = watch::channel(None);
        let lost = session.lost();
        let client = session.client().clone();
        let task = tokio::spawn(async move {
            let reason = tokio::select! {
                r = lost => r,
                () = key_gone(&client, &key, create_rev) => LostReason::KeyDeleted,
            };
            let _ = tx.send(Some(reason));
            // Keep the sender: receivers read the reason after the task ends too.
            std::future::pending::<()>().await;
        });
        Holding {
            rx,
            _task: AbortOnDrop(task),
        }
    }

    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        wait_lost(self.rx.clone())
    }

    pub(crate) fn reason(&self) -> Option<LostReason> {
        *self.rx.borrow()
    }
}

/// Returns when `key` no longer exists with create revision `create_rev`.
async fn key_gone(client: &Client, key: &[u8], create_rev: i64) {
    let mut from = create_rev + 1;
    let mut failures = 0;
    loop {
        let mut events = client.watch(key.to_vec(), WatchOptions::new().with_start_revision(from));
        while let Some(ev) = events.next().await {
            match ev {
                Ok(ev) if ev.kind == EventKind::Delete => return,
                Ok(ev) if ev.kv.create_revision != create_rev => return,
                Ok(_) => {}
                // Compacted or refused: find out directly.
                Err(_) => break,
            }
        }
        loop {
            match client.get(key.to_vec(), GetOptions::new()).await {
                Ok(r) => {
                    if r.kvs.first().map(|kv| kv.create_revision) != Some(create_rev) {
                        return;
                    }
                    from = r.header.map_or(from, |h| h.revision + 1);
                    break;
                }
                Err(_) => {
                    failures += 1;
                    tokio::time::sleep(backoff(
                        failures,
                        Duration::from_millis(50),
                        Duration::from_secs(1),
                    ))
                    .await;
                }
            }
        }
    }
}
