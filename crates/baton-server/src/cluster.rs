//! `etcdserverpb.Cluster`: the member list and membership changes (etcd's MemberAdd,
//! MemberRemove, MemberUpdate, MemberPromote). The checks and the change itself are made by
//! the leader (`baton_raft::Node::member_add` and friends forward from a follower).

use baton_proto::etcdserverpb as pb;
use baton_raft::MemberInfo;
use tonic::{Request, Status};

use crate::errors::member_status;
use crate::Shared;

/// The Cluster service.
pub struct ClusterService {
    pub(crate) shared: Shared,
}

impl ClusterService {
    fn members(&self) -> Vec<pb::Member> {
        to_pb(self.shared.node.members())
    }
}

fn member_pb(m: MemberInfo) -> pb::Member {
    pb::Member {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}

fn to_pb(members: Vec<MemberInfo>) -> Vec<pb::Member> {
    members.into_iter().map(member_pb).collect()
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<pb::MemberAddRequest>,
    ) -> Result<tonic::Response<pb::MemberAddResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let req = request.into_inner();
        let changed = self
            .shared
            .node
            .member_add(req.peer_ur_ls, req.is_learner)
            .await
            .map_err(|e| member_status(&e))?;
        Ok(tonic::Response::new(pb::MemberAddResponse {
            header: Some(self.shared.header()),
            member: changed.added.map(member_pb),
            members: to_pb(changed.members),
        }))
    }

    async fn member_remove(
        &self,
        request: Request<pb::MemberRemoveRequest>,
    ) -> Result<tonic::Response<pb::MemberRemoveResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let changed = self
            .shared
            .node
            .member_remove(request.into_inner().id)
            .await
            .map_err(|e| member_status(&e))?;
        Ok(tonic::Response::new(pb::MemberRemoveResponse {
            header: Some(self.shared.header()),
            members: to_pb(changed.members),
        }))
    }

    async fn member_update(
        &self,
        request: Request<pb::MemberUpdateRequest>,
    ) -> Result<tonic::Response<pb::MemberUpdateResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let req = request.into_inner();
        let changed = self
            .shared
            .node
            .member_update(req.id, req.peer_ur_ls)
            .await
            .map_err(|e| member_status(&e))?;
        Ok(tonic::Response::new(pb::MemberUpdateResponse {
            header: Some(self.shared.header()),
            members: to_pb(changed.members),
        }))
    }

    async fn member_list(
        &self,
        request: Request<pb::MemberListRequest>,
    ) -> Result<tonic::Response<pb::MemberListResponse>, Status> {
        if request.into_inner().linearizable {
            self.shared.read_barrier().await?;
        }
        Ok(tonic::Response::new(pb::MemberListResponse {
            header: Some(self.shared.header()),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<pb::MemberPromoteRequest>,
    ) -> Result<tonic::Response<pb::MemberPromoteResponse>, Status> {
        // Root only once auth is enabled, as etcd.
        self.shared.require_admin(&self.shared.caller(&request)?)?;
        let changed = self
            .shared
            .node
            .member_promote(request.into_inner().id)
            .await
            .map_err(|e| member_status(&e))?;
        Ok(tonic::Response::new(pb::MemberPromoteResponse {
            header: Some(self.shared.header()),
            members: to_pb(changed.members),
        }))
    }
}
