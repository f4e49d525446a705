//! Peer networking placeholder. Clusters have one member for now, so openraft never needs to
//! reach a peer; every connection answers "unreachable", which openraft treats as a transient
//! failure (backoff and retry), never as data.

use std::io;

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RaftNetwork, RaftNetworkFactory};

use crate::types::TypeConfig;

pub(crate) struct NoPeers;

pub(crate) struct UnreachablePeer {
    target: u64,
}

impl UnreachablePeer {
    fn err<E: std::error::Error>(&self) -> RPCError<u64, BasicNode, E> {
        let e = io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "peer networking is not implemented (member {:x})",
                self.target
            ),
        );
        RPCError::Unreachable(Unreachable::new(&e))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = UnreachablePeer;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Self::Network {
        UnreachablePeer { target }
    }
}

impl RaftNetwork<TypeConfig> for UnreachablePeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.err())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(self.err())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.err())
    }
}
