//! `etcdserverpb.Cluster`: the member list. Membership changes arrive with multi-member
//! clusters; until then they are refused with a message that says so.

use baton_proto::etcdserverpb as pb;
use tonic::{Request, Status};

use crate::errors::not_supported;
use crate::Shared;

/// The Cluster service.
pub struct ClusterService {
    pub(crate) shared: Shared,
}

impl ClusterService {
    fn members(&self) -> Vec<pb::Member> {
        self.shared
            .node
            .members()
            .into_iter()
            .map(|m| pb::Member {
                id: m.id,
                name: m.name,
                peer_ur_ls: m.peer_urls,
                client_ur_ls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect()
    }
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn member_add(
        &self,
        _request: Request<pb::MemberAddRequest>,
    ) -> Result<tonic::Response<pb::MemberAddResponse>, Status> {
        Err(not_supported("adding members"))
    }

    async fn member_remove(
        &self,
        _request: Request<pb::MemberRemoveRequest>,
    ) -> Result<tonic::Response<pb::MemberRemoveResponse>, Status> {
        Err(not_supported("removing members"))
    }

    async fn member_update(
        &self,
        _request: Request<pb::MemberUpdateRequest>,
    ) -> Result<tonic::Response<pb::MemberUpdateResponse>, Status> {
        Err(not_supported("updating members"))
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
        _request: Request<pb::MemberPromoteRequest>,
    ) -> Result<tonic::Response<pb::MemberPromoteResponse>, Status> {
        Err(not_supported("promoting learners"))
    }
}
