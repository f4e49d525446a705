//! Noticing that a held key disappeared while its lease is still alive.
//!
//! A lock or leadership can end without the lease ending: an operator's ForceRelease, an
//! `etcdctl del`, a Resign by someone holding the leader key. The keep-alives keep
//! succeeding then, so the holder must watch its own key as well.

use std::time::Duration;

use baton_proto::etcdserverpb::{
    watch_client::WatchClient, watch_create_request::FilterType, watch_request::RequestUnion,
    RangeRequest, WatchCreateRequest, WatchRequest,
};
use baton_proto::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// Resolves (with a reason) once `key`, created at revision `created`, is deleted.
///
/// Watches from `created + 1` so a deletion between the grant and the watch is not missed.
/// If the stream breaks (or history was compacted) a read decides whether the key, with this
/// create revision, still exists, and the watch resumes after that read's revision.
/// Never resolves if the server cannot be reached at all: the lease watchdog covers that.
pub async fn key_deleted(channel: Channel, key: Vec<u8>, created: i64) -> String {
    let mut watch = WatchClient::new(channel.clone());
    let mut kv = baton_proto::etcdserverpb::kv_client::KvClient::new(channel);
    let mut from = created + 1;
    loop {
        let (tx, rx) = mpsc::channel(1);
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: key.clone(),
                start_revision: from,
                filters: vec![FilterType::Noput as i32],
                ..Default::default()
            })),
        };
        let _ = tx.send(create).await;
        if let Ok(resp) = watch.watch(ReceiverStream::new(rx)).await {
            let mut stream = resp.into_inner();
            while let Ok(Some(msg)) = stream.message().await {
                if msg
                    .events
                    .iter()
                    .any(|e| e.r#type == EventType::Delete as i32)
                {
                    return deleted_reason();
                }
                if msg.canceled {
                    // Compacted past `from`: fall back to reading the key.
                    break;
                }
            }
        }
        // `tx` is dropped here, closing our side of the stream.
        drop(tx);
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(resp) = kv
            .range(RangeRequest {
                key: key.clone(),
                ..Default::default()
            })
            .await
        {
            let resp = resp.into_inner();
            match resp.kvs.first() {
                Some(kv) if kv.create_revision == created => {
                    if let Some(h) = resp.header {
                        from = from.max(h.revision + 1);
                    }
                }
                _ => return deleted_reason(),
            }
        }
    }
}

fn deleted_reason() -> String {
    "its key was deleted while the lease was still alive (an operator's ForceRelease, a \
     Release/Resign by someone else, or a manual delete)"
        .to_string()
}
