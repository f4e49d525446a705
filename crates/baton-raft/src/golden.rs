//! Golden bytes of what this crate writes to disk and sends to peers (the rule:
//! `baton_core::format`). Test-only.
//!
//! Files live in `crates/baton-raft/tests/golden/<type>/<variant>.hex` (the text form of
//! `baton_core::format::golden_text`). Samples are enumerated through exhaustive `match`es
//! (a new variant does not compile until it has a file name) and their tags are compared
//! with the variants the decoder knows (`variant_count`: a variant without a sample fails).
//! Each golden file is decoded and encoded again, so the decoding side is pinned too.
//! `BATON_BLESS_NEW=1 cargo test -p baton-raft golden` writes missing files, never an existing
//! one. The WAL's records are pinned in `wal/tests.rs` (`wal::tests::golden_records`) with the helpers
//! here; the peer payloads below.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use baton_core::format::{golden_text, parse_golden_text, variant_count, variant_tag};
use serde::de::DeserializeOwned;
use serde::Serialize;

use baton_core::{Command, LeaseId, PutRequest};
use openraft::{EntryPayload, LeaderId, LogId, Membership};

use crate::types::{Member, RaftEntry, Request};
use crate::MemberInfo;

pub(crate) fn golden_dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(kind)
}

fn bless_new() -> bool {
    std::env::var_os("BATON_BLESS_NEW").is_some_and(|v| v == "1")
}

/// The standard header of a golden file.
pub(crate) fn header(kind: &str, name: &str, type_name: &str, value: &dyn Debug) -> String {
    format!(
        "{kind}/{name}: {type_name}\n{value:?}\nPinned by crates/baton-raft/src/golden.rs: never \
         edit by hand (see baton_core::format)."
    )
}

/// Compares `bytes` with `<dir>/<name>.hex`; what is wrong, if anything. A missing file is
/// written when blessing is on.
pub(crate) fn compare_file(dir: &Path, name: &str, header: &str, bytes: &[u8]) -> Option<String> {
    let path = dir.join(format!("{name}.hex"));
    match std::fs::read_to_string(&path) {
        Ok(text) => match parse_golden_text(&text) {
            Ok(golden) if golden == bytes => None,
            Ok(_) => Some(format!(
                "{}: the encoding changed (a variant inserted or reordered, a field added, \
                 removed, reordered or retyped, openraft upgraded?). Members and data \
                 directories holding the old bytes would misread them; see \
                 baton_core::format.\n--- file\n{text}+++ now\n{}",
                path.display(),
                golden_text(header, bytes)
            )),
            Err(e) => Some(format!("{}: {e}", path.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if bless_new() {
                std::fs::create_dir_all(dir).expect("create the golden directory");
                std::fs::write(&path, golden_text(header, bytes)).expect("write a golden file");
                eprintln!("wrote new golden file {}", path.display());
                None
            } else {
                Some(format!(
                    "{}: no golden file (a new variant?). Check the sample, then write it with \
                     BATON_BLESS_NEW=1",
                    path.display()
                ))
            }
        }
        Err(e) => Some(format!("{}: {e}", path.display())),
    }
}

/// Golden files in `dir` that no sample names (a sample was removed, and with it a pin).
pub(crate) fn orphans(dir: &Path, names: &BTreeSet<&str>) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|e| e.expect("read the golden directory").path())
        .filter(|p| {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            !names.contains(stem)
        })
        .map(|p| format!("{}: no sample produces this file", p.display()))
        .collect()
}

/// Whether the tags seen cover every variant of `T` its decoder knows.
pub(crate) fn missing_variants<T: DeserializeOwned>(
    kind: &str,
    tags: &BTreeSet<u32>,
) -> Option<String> {
    let all: BTreeSet<u32> = (0..variant_count::<T>()).collect();
    (*tags != all).then(|| {
        format!(
            "{kind}: variants {:?} have no sample (add one, and an arm to the match naming it)",
            all.difference(tags).collect::<Vec<_>>()
        )
    })
}

/// Checks samples of a peer payload `T` (an enum when `is_enum`) against
/// `tests/golden/<kind>/`, encoded as `wire::encode` sends them; each file must decode and
/// encode back to itself.
pub(crate) fn check_payloads<T>(
    kind: &str,
    is_enum: bool,
    samples: Vec<(&'static str, T)>,
) -> Vec<String>
where
    T: Serialize + DeserializeOwned + Debug,
{
    let dir = golden_dir(kind);
    let mut problems = Vec::new();
    let mut tags = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (name, value) in &samples {
        assert!(names.insert(*name), "{kind}: two samples named {name}");
        let bytes = crate::wire::encode(value).expect("samples encode");
        if is_enum {
            tags.insert(variant_tag(&bytes));
        }
        let h = header(
            kind,
            name,
            &format!("wire::encode of {}", std::any::type_name::<T>()),
            value,
        );
        problems.extend(compare_file(&dir, name, &h, &bytes));
        match crate::wire::decode::<T>(&bytes).map(|back| crate::wire::encode(&back)) {
            Ok(Ok(again)) if again == bytes => {}
            other => problems.push(format!(
                "{kind}/{name}: does not decode to itself: {other:?}"
            )),
        }
    }
    if is_enum {
        problems.extend(missing_variants::<T>(kind, &tags));
    }
    problems.extend(orphans(&dir, &names));
    problems
}

pub(crate) fn assert_no_problems(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n{}", problems.join("\n\n"));
}

/// Samples shared by the golden tests here and in `wal/tests.rs`.
pub(crate) fn member(n: u8) -> Member {
    Member {
        name: format!("m{n}"),
        peer_urls: vec![format!("http://10.0.0.{n}:2380")],
        client_urls: vec![format!("http://10.0.0.{n}:2379")],
    }
}

pub(crate) fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(LeaderId::new(term, 0xa1), index)
}

pub(crate) fn member_info() -> MemberInfo {
    MemberInfo {
        id: 0xb2,
        name: "m2".into(),
        peer_urls: vec!["http://10.0.0.2:2380".into()],
        client_urls: vec!["http://10.0.0.2:2379".into()],
        is_learner: true,
    }
}

pub(crate) fn put() -> Command {
    Command::Put(PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: LeaseId(3),
        prev_kv: true,
        ignore_value: false,
        ignore_lease: false,
    })
}

pub(crate) fn membership() -> Membership<u64, Member> {
    let nodes: BTreeMap<u64, Member> = [(0xa1, member(1)), (0xb2, member(2))].into();
    Membership::new(vec![BTreeSet::from([0xa1])], nodes)
}

/// One entry of every `EntryPayload` variant (what the WAL's `Entries` records and
/// `AppendEntries` carry).
pub(crate) fn entries() -> Vec<RaftEntry> {
    let payloads = vec![
        EntryPayload::Blank,
        EntryPayload::Normal(Request {
            time_ms: 1_700_000_000_123,
            commands: vec![put(), Command::Noop],
        }),
        EntryPayload::Membership(membership()),
    ];
    payloads
        .into_iter()
        .enumerate()
        .map(|(i, payload)| {
            // A new openraft payload kind must be pinned here (and in the WAL).
            match &payload {
                EntryPayload::Blank | EntryPayload::Normal(_) | EntryPayload::Membership(_) => {}
            }
            RaftEntry {
                log_id: log_id(2, 10 + i as u64),
                payload,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use baton_core::{KeyValue, LeaseId, Response, Revision};
    use openraft::error::{Infallible, InstallSnapshotError, RaftError};
    use openraft::raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    };
    use openraft::{EntryPayload, SnapshotMeta, StoredMembership, Vote};

    use super::*;
    use crate::credential::ClusterCredential;
    use crate::election::{PreVoteAnswer, PreVoteRequest};
    use crate::files::{self, MemberMeta};
    use crate::membership::change::{JoinRequest, JoinResponse, MemberChange};
    use crate::origin::LeaderDuty;
    use crate::types::TypeConfig;
    use crate::wire::{ForwardedProposal, LeaderRequest, LeaderResponse};
    use crate::{Halt, InternalError, KeepAlive, MemberChanged, MemberError, ProposeError};

    fn named<T>(values: Vec<T>, name: fn(&T) -> &'static str) -> Vec<(&'static str, T)> {
        values.into_iter().map(|v| (name(&v), v)).collect()
    }

    /// `member.meta`, whole files (frame included), in every version still read: version 2
    /// (written for every member without an admitted credential) and version 3 (a member
    /// admitted by `member add`, `membership::admission`). Each decodes back to its sample.
    #[test]
    fn member_meta_versions_are_pinned() {
        let v2 = MemberMeta {
            member_id: 0xa1,
            cluster_id: 0xc1,
            name: "golden".into(),
            credential: None,
        };
        let v3 = MemberMeta {
            credential: Some(ClusterCredential::of_token("golden")),
            ..v2.clone()
        };
        let dir = golden_dir("member_meta");
        let mut problems = Vec::new();
        let samples = [("v2", v2), ("v3", v3)];
        for (name, meta) in &samples {
            let bytes = files::encode_member(meta);
            let h = header("member_meta", name, "files::encode_member", meta);
            problems.extend(compare_file(&dir, name, &h, &bytes));
            if files::decode_member(&bytes).as_ref() != Ok(meta) {
                problems.push(format!("member_meta/{name}: does not decode to itself"));
            }
        }
        problems.extend(orphans(&dir, &samples.iter().map(|(n, _)| *n).collect()));
        assert_no_problems(problems);
    }

    #[test]
    fn entry_payloads_cover_every_variant() {
        let tags: BTreeSet<u32> = entries()
            .iter()
            .map(|e| variant_tag(&crate::wire::encode(&e.payload).unwrap()))
            .collect();
        assert_no_problems(
            missing_variants::<EntryPayload<TypeConfig>>("entry_payload", &tags)
                .into_iter()
                .collect(),
        );
    }

    #[test]
    fn leader_requests_are_pinned() {
        let samples = vec![
            LeaderRequest::Propose(put()),
            LeaderRequest::ReadIndex,
            LeaderRequest::KeepAlive(LeaseId(5)),
            LeaderRequest::TimeToLive(LeaseId(6)),
            LeaderRequest::Publish {
                id: 0xb2,
                member: member(2),
            },
            LeaderRequest::GrantCheck(LeaseId(7)),
            LeaderRequest::ChangeMembers(MemberChange::Promote { id: 0xb2 }),
        ];
        assert_no_problems(check_payloads(
            "leader_request",
            true,
            named(samples, |r| match r {
                LeaderRequest::Propose(_) => "propose",
                LeaderRequest::ReadIndex => "read_index",
                LeaderRequest::KeepAlive(_) => "keep_alive",
                LeaderRequest::TimeToLive(_) => "time_to_live",
                LeaderRequest::Publish { .. } => "publish",
                LeaderRequest::GrantCheck(_) => "grant_check",
                LeaderRequest::ChangeMembers(_) => "change_members",
            }),
        ));
    }

    #[test]
    fn leader_responses_are_pinned() {
        let samples = vec![
            LeaderResponse::Proposed(ForwardedProposal {
                revision: Revision(8),
                response: Response::Put(baton_core::PutResponse {
                    prev_kv: Some(KeyValue {
                        key: b"k".to_vec(),
                        create_revision: Revision(2),
                        mod_revision: Revision(3),
                        version: 4,
                        value: b"old".to_vec(),
                        lease: LeaseId(5),
                    }),
                }),
                raft_term: 9,
                raft_index: 10,
            }),
            LeaderResponse::ReadIndex(11),
            LeaderResponse::KeepAlive(KeepAlive::Renewed { ttl_s: 12 }),
            LeaderResponse::TimeToLive(Some(13)),
            LeaderResponse::Published,
            LeaderResponse::GrantCheck {
                read_index: 14,
                lease_alive: true,
            },
            LeaderResponse::MembersChanged(Ok(MemberChanged {
                added: Some(member_info()),
                members: vec![member_info()],
                raft_index: 15,
            })),
            LeaderResponse::Failed(ProposeError::NotLeader { leader: Some(0xa1) }),
        ];
        assert_no_problems(check_payloads(
            "leader_response",
            true,
            named(samples, |r| match r {
                LeaderResponse::Proposed(_) => "proposed",
                LeaderResponse::ReadIndex(_) => "read_index",
                LeaderResponse::KeepAlive(_) => "keep_alive",
                LeaderResponse::TimeToLive(_) => "time_to_live",
                LeaderResponse::Published => "published",
                LeaderResponse::GrantCheck { .. } => "grant_check",
                LeaderResponse::MembersChanged(_) => "members_changed",
                LeaderResponse::Failed(_) => "failed",
            }),
        ));
    }

    /// The enums inside forwarded requests and answers, each variant on its own.
    #[test]
    fn forwarded_enums_are_pinned() {
        let mut problems = Vec::new();
        let errors = vec![
            ProposeError::NoLeader,
            ProposeError::NotLeader { leader: Some(0xa1) },
            ProposeError::LeaderChanged,
            ProposeError::Timeout,
            ProposeError::ShuttingDown,
            ProposeError::Storage("disk".into()),
            ProposeError::LeaderFailed("gone".into()),
            ProposeError::MembershipChange("refused".into()),
            ProposeError::TooManyRequests,
            ProposeError::LeaderOnly(LeaderDuty::LeaseCheckpoint),
            ProposeError::NoSpace,
            ProposeError::Halted(Halt::Stopped),
            ProposeError::Internal(InternalError::UnexpectedAnswer),
        ];
        problems.extend(check_payloads(
            "propose_error",
            true,
            named(errors, |e| match e {
                ProposeError::NoLeader => "no_leader",
                ProposeError::NotLeader { .. } => "not_leader",
                ProposeError::LeaderChanged => "leader_changed",
                ProposeError::Timeout => "timeout",
                ProposeError::ShuttingDown => "shutting_down",
                ProposeError::Storage(_) => "storage",
                ProposeError::LeaderFailed(_) => "leader_failed",
                ProposeError::MembershipChange(_) => "membership_change",
                ProposeError::TooManyRequests => "too_many_requests",
                ProposeError::LeaderOnly(_) => "leader_only",
                ProposeError::NoSpace => "no_space",
                ProposeError::Halted(_) => "halted",
                ProposeError::Internal(_) => "internal",
            }),
        ));
        let halts = vec![Halt::Stopped, Halt::Panicked];
        problems.extend(check_payloads(
            "halt",
            true,
            named(halts, |h| match h {
                Halt::Stopped => "stopped",
                Halt::Panicked => "panicked",
            }),
        ));
        let internal = vec![
            InternalError::EncodeRequest,
            InternalError::UnexpectedAnswer,
            InternalError::ResultCount {
                commands: 3,
                results: 2,
            },
            InternalError::WriteAsMembershipChange,
        ];
        problems.extend(check_payloads(
            "internal_error",
            true,
            named(internal, |e| match e {
                InternalError::EncodeRequest => "encode_request",
                InternalError::UnexpectedAnswer => "unexpected_answer",
                InternalError::ResultCount { .. } => "result_count",
                InternalError::WriteAsMembershipChange => "write_as_membership_change",
            }),
        ));
        let duties = vec![
            LeaderDuty::Noop,
            LeaderDuty::ExpireLeases,
            LeaderDuty::ExpireLeasesInTerm,
            LeaderDuty::LeaseCheckpoint,
            LeaderDuty::RaiseAlarm,
            LeaderDuty::FencingKey,
        ];
        problems.extend(check_payloads(
            "leader_duty",
            true,
            named(duties, |d| match d {
                LeaderDuty::Noop => "noop",
                LeaderDuty::ExpireLeases => "expire_leases",
                LeaderDuty::ExpireLeasesInTerm => "expire_leases_in_term",
                LeaderDuty::LeaseCheckpoint => "lease_checkpoint",
                LeaderDuty::RaiseAlarm => "raise_alarm",
                LeaderDuty::FencingKey => "fencing_key",
            }),
        ));
        let changes = vec![
            MemberChange::Add {
                peer_urls: vec!["http://10.0.0.3:2380".into()],
                is_learner: true,
            },
            MemberChange::Remove { id: 0xc3 },
            MemberChange::Update {
                id: 0xc3,
                peer_urls: vec!["http://10.0.0.4:2380".into()],
            },
            MemberChange::Promote { id: 0xc3 },
        ];
        problems.extend(check_payloads(
            "member_change",
            true,
            named(changes, |c| match c {
                MemberChange::Add { .. } => "add",
                MemberChange::Remove { .. } => "remove",
                MemberChange::Update { .. } => "update",
                MemberChange::Promote { .. } => "promote",
            }),
        ));
        let member_errors = vec![
            MemberError::NotFound,
            MemberError::PeerUrlsExist,
            MemberError::BadUrls,
            MemberError::NotLearner,
            MemberError::LearnerNotReady,
            MemberError::TooManyLearners,
            MemberError::NotEnoughStarted,
            MemberError::Unhealthy,
            MemberError::NotClustered,
            MemberError::Propose(ProposeError::Timeout),
        ];
        problems.extend(check_payloads(
            "member_error",
            true,
            named(member_errors, |e| match e {
                MemberError::NotFound => "not_found",
                MemberError::PeerUrlsExist => "peer_urls_exist",
                MemberError::BadUrls => "bad_urls",
                MemberError::NotLearner => "not_learner",
                MemberError::LearnerNotReady => "learner_not_ready",
                MemberError::TooManyLearners => "too_many_learners",
                MemberError::NotEnoughStarted => "not_enough_started",
                MemberError::Unhealthy => "unhealthy",
                MemberError::NotClustered => "not_clustered",
                MemberError::Propose(_) => "propose",
            }),
        ));
        let keep_alives = vec![KeepAlive::Renewed { ttl_s: 16 }, KeepAlive::NotFound];
        problems.extend(check_payloads(
            "keep_alive",
            true,
            named(keep_alives, |k| match k {
                KeepAlive::Renewed { .. } => "renewed",
                KeepAlive::NotFound => "not_found",
            }),
        ));
        let answers = vec![
            PreVoteAnswer::Granted,
            PreVoteAnswer::Refused("leader".into()),
        ];
        problems.extend(check_payloads(
            "pre_vote_answer",
            true,
            named(answers, |a| match a {
                PreVoteAnswer::Granted => "granted",
                PreVoteAnswer::Refused(_) => "refused",
            }),
        ));
        assert_no_problems(problems);
    }

    /// The other peer payloads (structs: one sample each) and openraft's messages as Baton
    /// encodes them. openraft is pinned to an exact version; these files are what changes
    /// when it is upgraded.
    #[test]
    fn peer_messages_are_pinned() {
        let vote = Vote::new_committed(4, 0xa1);
        let mut problems = Vec::new();
        problems.extend(check_payloads(
            "pre_vote_request",
            false,
            vec![(
                "pre_vote_request",
                PreVoteRequest {
                    term: 5,
                    last_log_id: Some(log_id(4, 20)),
                },
            )],
        ));
        problems.extend(check_payloads(
            "join_request",
            false,
            vec![(
                "join_request",
                JoinRequest {
                    peer_urls: vec!["http://10.0.0.3:2380".into()],
                    credential: ClusterCredential::of_token("golden"),
                },
            )],
        ));
        problems.extend(check_payloads(
            "join_response",
            false,
            vec![(
                "join_response",
                JoinResponse {
                    members: vec![(0xa1, member(1))],
                    voters: vec![0xa1],
                },
            )],
        ));
        problems.extend(check_payloads(
            "append_entries_request",
            false,
            vec![(
                "append_entries_request",
                AppendEntriesRequest::<TypeConfig> {
                    vote,
                    prev_log_id: Some(log_id(2, 9)),
                    entries: entries(),
                    leader_commit: Some(log_id(2, 8)),
                },
            )],
        ));
        let answers: Vec<Result<AppendEntriesResponse<u64>, RaftError<u64, Infallible>>> = vec![
            Ok(AppendEntriesResponse::Success),
            Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(2, 11)))),
            Ok(AppendEntriesResponse::Conflict),
            Ok(AppendEntriesResponse::HigherVote(Vote::new(5, 0xb2))),
        ];
        let answers = answers
            .into_iter()
            .map(|a| {
                let name = match &a {
                    Ok(AppendEntriesResponse::Success) => "success",
                    Ok(AppendEntriesResponse::PartialSuccess(_)) => "partial_success",
                    Ok(AppendEntriesResponse::Conflict) => "conflict",
                    Ok(AppendEntriesResponse::HigherVote(_)) => "higher_vote",
                    Err(_) => "error",
                };
                (name, a)
            })
            .collect();
        problems.extend(check_payloads("append_entries_response", false, answers));
        problems.extend(check_payloads(
            "vote_request",
            false,
            vec![("vote_request", VoteRequest::new(vote, Some(log_id(4, 21))))],
        ));
        let vote_answer: Result<VoteResponse<u64>, RaftError<u64, Infallible>> = Ok(VoteResponse {
            vote,
            vote_granted: true,
            last_log_id: Some(log_id(4, 22)),
        });
        problems.extend(check_payloads(
            "vote_response",
            false,
            vec![("vote_response", vote_answer)],
        ));
        problems.extend(check_payloads(
            "install_snapshot_request",
            false,
            vec![(
                "install_snapshot_request",
                InstallSnapshotRequest::<TypeConfig> {
                    vote,
                    meta: SnapshotMeta {
                        last_log_id: Some(log_id(4, 30)),
                        last_membership: StoredMembership::new(Some(log_id(1, 1)), membership()),
                        snapshot_id: "4-30-1".into(),
                    },
                    offset: 4 << 20,
                    data: b"chunk".to_vec(),
                    done: false,
                },
            )],
        ));
        let snapshot_answer: Result<
            InstallSnapshotResponse<u64>,
            RaftError<u64, InstallSnapshotError>,
        > = Ok(InstallSnapshotResponse { vote });
        problems.extend(check_payloads(
            "install_snapshot_response",
            false,
            vec![("install_snapshot_response", snapshot_answer)],
        ));
        assert_no_problems(problems);
    }

    /// The Raft meta of a `member/snap/db` (its `baton` bucket's `raft` record), byte for
    /// byte; the file decodes back to the same meta.
    #[test]
    fn snapshot_db_meta_is_pinned() {
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(4, 30)),
            last_membership: StoredMembership::new(Some(log_id(1, 1)), membership()),
            snapshot_id: "4-30-1".into(),
        };
        let bytes = crate::snapshot::encode_db_meta(&meta);
        let dir = golden_dir("snapshot_db_meta");
        let h = header("snapshot_db_meta", "v1", "snapshot::DbMeta", &meta);
        let mut problems: Vec<String> = compare_file(&dir, "v1", &h, &bytes).into_iter().collect();
        problems.extend(orphans(&dir, &BTreeSet::from(["v1"])));
        if let Ok(text) = std::fs::read_to_string(dir.join("v1.hex")) {
            let golden = parse_golden_text(&text).expect("parses");
            assert_eq!(crate::snapshot::decode_db_meta(&golden), Ok(meta));
        }
        assert_no_problems(problems);
    }
}
