//! `etcdserverpb.Maintenance` (status, alarms, hashes, defragment, snapshots in etcd's
//! format — `snapshot_stream.rs`); root only once auth is enabled, as in etcd (`Auth` is
//! `auth_service.rs`).

use std::pin::Pin;

use baton_core::{AlarmAction, AlarmType, Command, Response};
use baton_proto::etcdserverpb as pb;
use futures::Stream;
use tonic::{Request, Status};

use crate::errors::{kv_status, not_supported};
use crate::Shared;

mod snapshot_stream;

/// The core's alarm for etcd's `AlarmType` (`None` for `NONE`, "any" in a GET; an
/// ACTIVATE or DEACTIVATE of it changes nothing).
fn core_alarm(alarm: pb::AlarmType) -> Option<AlarmType> {
    match alarm {
        pb::AlarmType::Nospace => Some(AlarmType::NoSpace),
        pb::AlarmType::Corrupt => Some(AlarmType::Corrupt),
        pb::AlarmType::None => None,
    }
}

fn alarm_member((member_id, alarm): (u64, AlarmType)) -> pb::AlarmMember {
    let alarm = match alarm {
        AlarmType::NoSpace => pb::AlarmType::Nospace,
        AlarmType::Corrupt => pb::AlarmType::Corrupt,
    };
    pb::AlarmMember {
        member_id,
        alarm: alarm as i32,
    }
}

/// The etcd release whose API Baton speaks: `etcdctl endpoint status` prints it, `/version`
/// and the `etcd_server_version` metric name it (one constant, so they cannot disagree).
pub const ETCD_API_VERSION: &str = crate::monitor::ETCD_SERVER_VERSION;

/// The Maintenance service.
pub struct MaintenanceService {
    pub(crate) shared: Shared,
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<pb::AlarmRequest>,
    ) -> Result<tonic::Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction as Action;
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let action = match req.action() {
            // etcd's GET goes through Raft; a read barrier is the same guarantee.
            Action::Get => {
                self.shared.read_barrier().await?;
                let wanted = core_alarm(req.alarm());
                let alarms = self.shared.node.read(|sm| {
                    sm.alarms()
                        .into_iter()
                        .filter(|(_, a)| req.alarm() == pb::AlarmType::None || Some(*a) == wanted)
                        .map(alarm_member)
                        .collect()
                });
                return Ok(tonic::Response::new(pb::AlarmResponse {
                    header: Some(self.shared.header()),
                    alarms,
                }));
            }
            Action::Activate => AlarmAction::Activate,
            // Exactly (member, alarm), as etcd's `Deactivate`; `etcdctl alarm disarm` lists
            // the alarms first and deactivates each.
            Action::Deactivate => AlarmAction::Deactivate,
        };
        // Raising an alarm stops writes of the whole cluster, clearing one lets them in
        // again: root only once auth is enabled. etcd lets any client raise one (its
        // `Maintenance.Alarm` ACTIVATE; `CORRUPT` is how an operator stops a cluster whose
        // data diverged), and so does Baton now, through the log like every alarm.
        self.shared.require_admin(&caller)?;
        let alarms = match core_alarm(req.alarm()) {
            // etcd's store keeps a `NONE` alarm it is asked to raise, which then refuses
            // nothing; nothing is raised here.
            None => Vec::new(),
            Some(alarm) => {
                let proposed = self
                    .shared
                    .propose(Command::Alarm {
                        action,
                        member_id: req.member_id,
                        alarm,
                    })
                    .await?;
                match proposed.applied.response {
                    Response::Alarm { changed } => changed.into_iter().map(alarm_member).collect(),
                    Response::Error(e) => return Err(kv_status(&e)),
                    other => {
                        return Err(Status::internal(format!(
                            "baton: unexpected answer to an alarm: {other:?}"
                        )))
                    }
                }
            }
        };
        Ok(tonic::Response::new(pb::AlarmResponse {
            header: Some(self.shared.header()),
            alarms,
        }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<tonic::Response<pb::StatusResponse>, Status> {
        let st = self.shared.node.status();
        let (revision, in_use, alarms) = self
            .shared
            .node
            .read(|sm| (sm.revision(), sm.approximate_size_bytes(), sm.alarms()));
        // etcd lists every raised alarm among the errors (`AlarmMember.String()`, as
        // `etcdctl alarm list` prints it), which `etcdctl endpoint status` shows.
        let errors = alarms
            .into_iter()
            .map(|(member, alarm)| format!("memberID:{member} alarm:{} ", alarm.name()))
            .collect();
        Ok(tonic::Response::new(pb::StatusResponse {
            header: Some(self.shared.header_at(revision.0, st.term)),
            version: ETCD_API_VERSION.into(),
            db_size: st.disk_bytes as i64,
            leader: st.leader_id.unwrap_or(0),
            raft_index: st.last_log_index,
            raft_term: st.term,
            raft_applied_index: st.applied_index,
            errors,
            db_size_in_use: in_use as i64,
            is_learner: self.shared.node.is_learner(),
        }))
    }

    async fn defragment(
        &self,
        request: Request<pb::DefragmentRequest>,
    ) -> Result<tonic::Response<pb::DefragmentResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        // What takes room on disk is the log and the snapshot (the store lives in memory,
        // and a compaction frees it at once): a snapshot of the state as it is now, which
        // purges the log it covers, shrinks the data directory as etcd's rewrite of its file
        // does (`Node::defragment`).
        self.shared
            .node
            .defragment()
            .await
            .map_err(|e| crate::errors::propose_status(&e))?;
        Ok(tonic::Response::new(pb::DefragmentResponse {
            header: Some(self.shared.header()),
        }))
    }

    async fn hash(
        &self,
        request: Request<pb::HashRequest>,
    ) -> Result<tonic::Response<pb::HashResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let (hash, revision) = self.shared.node.read(|sm| (sm.hash_kv(0), sm.revision()));
        let hash = hash.map_err(|e| kv_status(&e))?;
        Ok(tonic::Response::new(pb::HashResponse {
            header: Some(self.shared.header_at(revision.0, self.shared.term())),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<pb::HashKvRequest>,
    ) -> Result<tonic::Response<pb::HashKvResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let req = request.into_inner();
        let (hash, compact, revision) = self.shared.node.read(|sm| {
            (
                sm.hash_kv(req.revision),
                sm.compact_revision(),
                sm.revision(),
            )
        });
        let hash = hash.map_err(|e| kv_status(&e))?;
        Ok(tonic::Response::new(pb::HashKvResponse {
            header: Some(self.shared.header_at(revision.0, self.shared.term())),
            hash,
            compact_revision: compact.0,
        }))
    }

    type SnapshotStream =
        Pin<Box<dyn Stream<Item = Result<pb::SnapshotResponse, Status>> + Send + 'static>>;

    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<tonic::Response<Self::SnapshotStream>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let (state, consistent_index) = self.shared.node.frozen_state();
        let members = self
            .shared
            .node
            .members()
            .into_iter()
            .map(|m| baton_snapshot::Member {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect();
        let chunks = snapshot_stream::start(baton_snapshot::SnapshotSource {
            state,
            consistent_index,
            members,
        });
        Ok(tonic::Response::new(Box::pin(chunks)))
    }

    async fn move_leader(
        &self,
        request: Request<pb::MoveLeaderRequest>,
    ) -> Result<tonic::Response<pb::MoveLeaderResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let target = request.into_inner().target_id;
        self.shared
            .node
            .move_leader(target)
            .await
            .map_err(|e| crate::errors::transfer_status(&e))?;
        Ok(tonic::Response::new(pb::MoveLeaderResponse {
            header: Some(self.shared.header()),
        }))
    }

    async fn downgrade(
        &self,
        _request: Request<pb::DowngradeRequest>,
    ) -> Result<tonic::Response<pb::DowngradeResponse>, Status> {
        Err(not_supported("downgrade"))
    }
}
