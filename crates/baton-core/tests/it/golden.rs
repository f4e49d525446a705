//! Golden bytes of every persisted core type (the rule: `baton_core::format`).
//!
//! One sample of every variant of `Command`, `Response`, `KvError` and the enums nested in
//! them, and one snapshot of a small state, each encoded as Baton writes it (bincode) and
//! compared with a checked-in file under `tests/golden/<type>/<variant>.hex`. The samples
//! give every field of a type a distinct value, so two fields swapped change the bytes too.
//! Each golden file is also decoded and compared with its sample: what is pinned is what
//! the decoder reads, not only what the encoder writes.
//!
//! - A variant added to one of these enums does not compile until the `match` naming its
//!   file has an arm, and fails `every_variant_has_a_sample` until it has a sample.
//! - A changed encoding fails with the file, the expected and the actual bytes.
//! - A missing file fails; `BATON_BLESS_NEW=1 cargo test -p baton-core --test golden`
//!   writes the missing ones (never an existing one: changing pinned bytes is done by hand,
//!   deliberately, in review, together with a format version bump).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use baton_core::format::{golden_text, parse_golden_text, variant_count, variant_tag};
use baton_core::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn bless_new() -> bool {
    std::env::var_os("BATON_BLESS_NEW").is_some_and(|v| v == "1")
}

/// Compares `bytes` with `<dir>/<name>.hex`; returns what is wrong, if anything. A missing
/// file is written when blessing is on.
fn compare_file(dir: &Path, name: &str, header: &str, bytes: &[u8]) -> Option<String> {
    let path = dir.join(format!("{name}.hex"));
    match std::fs::read_to_string(&path) {
        Ok(text) => match parse_golden_text(&text) {
            Ok(golden) if golden == bytes => None,
            Ok(_) => Some(format!(
                "{}: the encoding changed (a variant inserted or reordered, a field added, \
                 removed, reordered or retyped?). This breaks every data directory and member \
                 that holds the old bytes; see baton_core::format.\n--- file\n{text}+++ now\n{}",
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

/// Checks every sample of enum `T` against `tests/golden/<kind>/`: the file's bytes, that
/// they decode to the sample, that every variant the decoder knows has a sample, and that
/// no file is left without one.
fn check_enum<T>(kind: &str, samples: Vec<(&'static str, T)>) -> Vec<String>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let dir = golden_dir().join(kind);
    let mut problems = Vec::new();
    let mut tags = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (name, value) in &samples {
        assert!(names.insert(*name), "{kind}: two samples named {name}");
        let bytes = bincode::serialize(value).expect("samples serialize");
        tags.insert(variant_tag(&bytes));
        let header = format!(
            "{kind}/{name}: bincode of {}\n{value:?}\nPinned by crates/baton-core/tests/it/golden.rs: \
             never edit by hand (see baton_core::format).",
            std::any::type_name::<T>()
        );
        problems.extend(compare_file(&dir, name, &header, &bytes));
        match bincode::deserialize::<T>(&bytes) {
            Ok(back) if back == *value => {}
            other => problems.push(format!("{kind}/{name}: decodes as {other:?}")),
        }
    }
    let all: BTreeSet<u32> = (0..variant_count::<T>()).collect();
    if tags != all {
        problems.push(format!(
            "{kind}: variants {:?} have no sample (add one, and an arm to the match naming it)",
            all.difference(&tags).collect::<Vec<_>>()
        ));
    }
    problems.extend(orphans(&dir, &names));
    problems
}

/// Golden files no sample names: a sample was removed (and with it the pin of its variant).
fn orphans(dir: &Path, names: &BTreeSet<&str>) -> Vec<String> {
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

fn assert_no_problems(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n{}", problems.join("\n\n"));
}

fn kv(key: &[u8], create: i64, modified: i64, version: i64, value: &[u8], lease: i64) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        create_revision: Revision(create),
        mod_revision: Revision(modified),
        version,
        value: value.to_vec(),
        lease: LeaseId(lease),
    }
}

fn range(key: &[u8], end: &[u8]) -> KeyRange {
    KeyRange {
        key: key.to_vec(),
        range_end: end.to_vec(),
    }
}

fn put_request() -> PutRequest {
    PutRequest {
        key: b"key".to_vec(),
        value: b"value".to_vec(),
        lease: LeaseId(0x1234),
        prev_kv: true,
        ignore_value: false,
        ignore_lease: true,
    }
}

/// Every field distinct, so swapping any two changes the bytes.
fn range_request() -> RangeRequest {
    RangeRequest {
        range: range(b"a", b"z"),
        limit: 1,
        revision: 2,
        sort_order: SortOrder::Descend,
        sort_target: SortTarget::Mod,
        keys_only: true,
        count_only: false,
        min_mod_revision: 3,
        max_mod_revision: 4,
        min_create_revision: 5,
        max_create_revision: 6,
    }
}

fn delete_range_request() -> DeleteRangeRequest {
    DeleteRangeRequest {
        range: range(b"d", b"e"),
        prev_kv: true,
    }
}

fn txn_request() -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            range: range(b"c", b""),
            result: CompareResult::Greater,
            target: CompareTarget::Version(7),
        }],
        success: vec![
            RequestOp::Range(range_request()),
            RequestOp::Put(put_request()),
        ],
        failure: vec![
            RequestOp::DeleteRange(delete_range_request()),
            RequestOp::Txn(TxnRequest::default()),
        ],
    }
}

fn range_response() -> RangeResponse {
    RangeResponse {
        kvs: vec![kv(b"k", 2, 3, 4, b"v", 5)],
        more: true,
        count: 9,
    }
}

fn put_response() -> PutResponse {
    PutResponse {
        prev_kv: Some(kv(b"p", 10, 11, 12, b"old", 13)),
    }
}

fn delete_range_response() -> DeleteRangeResponse {
    DeleteRangeResponse {
        deleted: 2,
        prev_kvs: vec![kv(b"d1", 20, 21, 1, b"x", 0), kv(b"d2", 22, 23, 2, b"y", 0)],
    }
}

fn txn_response() -> TxnResponse {
    TxnResponse {
        succeeded: true,
        responses: vec![
            ResponseOp::Range(range_response()),
            ResponseOp::Put(put_response()),
            ResponseOp::DeleteRange(delete_range_response()),
            ResponseOp::Txn(TxnResponse::default()),
        ],
    }
}

fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Noop => "noop",
        Command::Put(_) => "put",
        Command::DeleteRange(_) => "delete_range",
        Command::Txn(_) => "txn",
        Command::Compact { .. } => "compact",
        Command::LeaseGrant { .. } => "lease_grant",
        Command::LeaseRevoke { .. } => "lease_revoke",
        Command::ExpireLeases { .. } => "expire_leases",
        Command::ExpireLeasesInTerm { .. } => "expire_leases_in_term",
        Command::LeaseCheckpoint { .. } => "lease_checkpoint",
        Command::LockEnqueue { .. } => "lock_enqueue",
        Command::LockForceRelease { .. } => "lock_force_release",
        Command::FenceCheck { .. } => "fence_check",
        Command::RegisterClient { .. } => "register_client",
        Command::UnregisterClient { .. } => "unregister_client",
        Command::Deduplicated { .. } => "deduplicated",
        Command::Alarm { .. } => "alarm",
        Command::Auth(_) => "auth",
        Command::Authorized { .. } => "authorized",
        Command::FencingKey { .. } => "fencing_key",
    }
}

fn permission() -> Permission {
    Permission {
        perm_type: PermType::ReadWrite,
        key: b"/a".to_vec(),
        range_end: b"/b".to_vec(),
    }
}

fn auth_command_name(c: &AuthCommand) -> &'static str {
    match c {
        AuthCommand::Enable => "enable",
        AuthCommand::Disable => "disable",
        AuthCommand::Authenticate { .. } => "authenticate",
        AuthCommand::UserAdd { .. } => "user_add",
        AuthCommand::UserDelete { .. } => "user_delete",
        AuthCommand::UserChangePassword { .. } => "user_change_password",
        AuthCommand::UserGrantRole { .. } => "user_grant_role",
        AuthCommand::UserRevokeRole { .. } => "user_revoke_role",
        AuthCommand::RoleAdd { .. } => "role_add",
        AuthCommand::RoleDelete { .. } => "role_delete",
        AuthCommand::RoleGrantPermission { .. } => "role_grant_permission",
        AuthCommand::RoleRevokePermission { .. } => "role_revoke_permission",
    }
}

fn auth_commands() -> Vec<AuthCommand> {
    vec![
        AuthCommand::Enable,
        AuthCommand::Disable,
        AuthCommand::Authenticate {
            name: "alice".into(),
            simple_token_prefix: Some("abcdefghijklmnop".into()),
        },
        AuthCommand::UserAdd {
            name: "bob".into(),
            password_hash: Some("$2a$10$hash".into()),
        },
        AuthCommand::UserDelete {
            name: "carol".into(),
        },
        AuthCommand::UserChangePassword {
            name: "dave".into(),
            password_hash: "$2a$10$other".into(),
        },
        AuthCommand::UserGrantRole {
            user: "erin".into(),
            role: "readers".into(),
        },
        AuthCommand::UserRevokeRole {
            name: "frank".into(),
            role: "writers".into(),
        },
        AuthCommand::RoleAdd {
            name: "grace".into(),
        },
        AuthCommand::RoleDelete {
            name: "heidi".into(),
        },
        AuthCommand::RoleGrantPermission {
            name: "ivan".into(),
            perm: permission(),
        },
        AuthCommand::RoleRevokePermission {
            role: "judy".into(),
            key: b"k".to_vec(),
            range_end: b"\0".to_vec(),
        },
    ]
}

fn commands() -> Vec<Command> {
    vec![
        Command::Noop,
        Command::Put(put_request()),
        Command::DeleteRange(delete_range_request()),
        Command::Txn(txn_request()),
        Command::Compact {
            revision: Revision(42),
        },
        Command::LeaseGrant {
            id: LeaseId(0x7f00_0000_0000_0001),
            ttl_s: 60,
        },
        Command::LeaseRevoke { id: LeaseId(77) },
        Command::ExpireLeases {
            ids: vec![LeaseId(1), LeaseId(2)],
        },
        Command::ExpireLeasesInTerm {
            term: Term(3),
            ids: vec![LeaseId(4)],
        },
        Command::LeaseCheckpoint {
            checkpoints: vec![(LeaseId(5), 6_000)],
        },
        Command::LockEnqueue {
            name: b"locks/a".to_vec(),
            lease: LeaseId(8),
            value: b"me".to_vec(),
            delay_ms: Some(9),
        },
        Command::LockForceRelease {
            name: b"locks/a".to_vec(),
            token: FencingToken(10),
            reason: "stuck".into(),
        },
        Command::FenceCheck {
            resource: b"db".to_vec(),
            token: FencingToken(11),
        },
        Command::RegisterClient { timeout_ms: 12_000 },
        Command::UnregisterClient { client_id: 13 },
        Command::Deduplicated {
            client_id: 14,
            sequence: 15,
            acknowledged_below: 16,
            command: Box::new(Command::Put(put_request())),
        },
        Command::Alarm {
            action: AlarmAction::Deactivate,
            member_id: 17,
            alarm: AlarmType::NoSpace,
        },
        Command::Auth(AuthCommand::UserAdd {
            name: "root".into(),
            password_hash: None,
        }),
        Command::Authorized {
            auth: AuthInfo {
                user: "alice".into(),
                revision: 18,
            },
            command: Box::new(Command::Put(put_request())),
        },
        Command::FencingKey {
            mode: FencingKeyMode::Rotate,
            public: FencingPublicKey(std::array::from_fn(|i| i as u8)),
            secret: FencingSecret(std::array::from_fn(|i| 0x80 + i as u8)),
        },
    ]
}

fn response_name(r: &Response) -> &'static str {
    match r {
        Response::Noop => "noop",
        Response::Put(_) => "put",
        Response::DeleteRange(_) => "delete_range",
        Response::Txn(_) => "txn",
        Response::Compact => "compact",
        Response::LeaseGrant { .. } => "lease_grant",
        Response::LeaseRevoke => "lease_revoke",
        Response::ExpireLeases { .. } => "expire_leases",
        Response::LeaseCheckpoint => "lease_checkpoint",
        Response::LockEnqueue { .. } => "lock_enqueue",
        Response::LockForceRelease { .. } => "lock_force_release",
        Response::FenceCheck { .. } => "fence_check",
        Response::ClientRegistered { .. } => "client_registered",
        Response::ClientUnregistered { .. } => "client_unregistered",
        Response::Deduplicated { .. } => "deduplicated",
        Response::Error(_) => "error",
        Response::Alarm { .. } => "alarm",
        Response::Auth(_) => "auth",
        Response::FencingKey { .. } => "fencing_key",
    }
}

fn responses() -> Vec<Response> {
    vec![
        Response::Noop,
        Response::Put(put_response()),
        Response::DeleteRange(delete_range_response()),
        Response::Txn(txn_response()),
        Response::Compact,
        Response::LeaseGrant {
            id: LeaseId(30),
            ttl_s: 31,
        },
        Response::LeaseRevoke,
        Response::ExpireLeases {
            expired: vec![LeaseId(32)],
            expired_holders: vec![b"locks/a/20".to_vec()],
        },
        Response::LeaseCheckpoint,
        Response::LockEnqueue {
            kv: kv(b"locks/a/21", 33, 34, 1, b"me", 0x21),
            created: true,
        },
        Response::LockForceRelease {
            released: Some(kv(b"locks/a/22", 35, 36, 2, b"it", 0x22)),
        },
        Response::FenceCheck {
            accepted: false,
            highest: FencingToken(37),
        },
        Response::ClientRegistered {
            client_id: 38,
            timeout_ms: 39,
        },
        Response::ClientUnregistered { existed: true },
        Response::Deduplicated {
            replayed: true,
            revision: Revision(40),
            response: Box::new(Response::Put(PutResponse::default())),
        },
        Response::Error(KvError::StaleSequence),
        Response::Alarm {
            changed: Some((41, AlarmType::NoSpace)),
        },
        Response::Auth(AuthResponse::Authenticated {
            token: Some("abc.42".into()),
            revision: 43,
        }),
        Response::FencingKey {
            installed: Some(FencingKeyId(44)),
        },
    ]
}

fn kv_error_name(e: &KvError) -> &'static str {
    match e {
        KvError::EmptyKey => "empty_key",
        KvError::KeyNotFound => "key_not_found",
        KvError::LeaseNotFound => "lease_not_found",
        KvError::LeaseExists => "lease_exists",
        KvError::LeaseTtlTooLarge => "lease_ttl_too_large",
        KvError::TooManyOps => "too_many_ops",
        KvError::DuplicateKey => "duplicate_key",
        KvError::Compacted => "compacted",
        KvError::FutureRevision => "future_revision",
        KvError::RequestTooLarge => "request_too_large",
        KvError::LeaseRequired => "lease_required",
        KvError::EmptyLockName => "empty_lock_name",
        KvError::EmptyFenceResource => "empty_fence_resource",
        KvError::InvalidFencingToken => "invalid_fencing_token",
        KvError::ReasonRequired => "reason_required",
        KvError::ReasonTooLong => "reason_too_long",
        KvError::NotHolder => "not_holder",
        KvError::LockDelayTooLong => "lock_delay_too_long",
        KvError::LockRegistryFull => "lock_registry_full",
        KvError::FenceTableFull => "fence_table_full",
        KvError::UnknownClient => "unknown_client",
        KvError::StaleSequence => "stale_sequence",
        KvError::InvalidSequence => "invalid_sequence",
        KvError::NotDeduplicable => "not_deduplicable",
        KvError::NoSpace => "no_space",
        KvError::Auth(_) => "auth",
        KvError::MisplacedAuthorized => "misplaced_authorized",
        KvError::Corrupt => "corrupt",
    }
}

fn kv_errors() -> Vec<KvError> {
    vec![
        KvError::EmptyKey,
        KvError::KeyNotFound,
        KvError::LeaseNotFound,
        KvError::LeaseExists,
        KvError::LeaseTtlTooLarge,
        KvError::TooManyOps,
        KvError::DuplicateKey,
        KvError::Compacted,
        KvError::FutureRevision,
        KvError::RequestTooLarge,
        KvError::LeaseRequired,
        KvError::EmptyLockName,
        KvError::EmptyFenceResource,
        KvError::InvalidFencingToken,
        KvError::ReasonRequired,
        KvError::ReasonTooLong,
        KvError::NotHolder,
        KvError::LockDelayTooLong,
        KvError::LockRegistryFull,
        KvError::FenceTableFull,
        KvError::UnknownClient,
        KvError::StaleSequence,
        KvError::InvalidSequence,
        KvError::NotDeduplicable,
        KvError::NoSpace,
        KvError::Auth(AuthError::PermissionDenied),
        KvError::MisplacedAuthorized,
        KvError::Corrupt,
    ]
}

fn named<T>(values: Vec<T>, name: fn(&T) -> &'static str) -> Vec<(&'static str, T)> {
    values.into_iter().map(|v| (name(&v), v)).collect()
}

#[test]
fn commands_are_pinned() {
    assert_no_problems(check_enum("command", named(commands(), command_name)));
}

#[test]
fn responses_are_pinned() {
    assert_no_problems(check_enum("response", named(responses(), response_name)));
}

#[test]
fn kv_errors_are_pinned() {
    assert_no_problems(check_enum("kv_error", named(kv_errors(), kv_error_name)));
}

/// The enums inside commands and responses, each variant on its own (the samples above
/// hold only some of them).
#[test]
fn nested_enums_are_pinned() {
    let mut problems = Vec::new();
    let request_ops = vec![
        RequestOp::Range(range_request()),
        RequestOp::Put(put_request()),
        RequestOp::DeleteRange(delete_range_request()),
        RequestOp::Txn(TxnRequest::default()),
    ];
    problems.extend(check_enum(
        "request_op",
        named(request_ops, |o| match o {
            RequestOp::Range(_) => "range",
            RequestOp::Put(_) => "put",
            RequestOp::DeleteRange(_) => "delete_range",
            RequestOp::Txn(_) => "txn",
        }),
    ));
    let response_ops = vec![
        ResponseOp::Range(range_response()),
        ResponseOp::Put(put_response()),
        ResponseOp::DeleteRange(delete_range_response()),
        ResponseOp::Txn(TxnResponse::default()),
    ];
    problems.extend(check_enum(
        "response_op",
        named(response_ops, |o| match o {
            ResponseOp::Range(_) => "range",
            ResponseOp::Put(_) => "put",
            ResponseOp::DeleteRange(_) => "delete_range",
            ResponseOp::Txn(_) => "txn",
        }),
    ));
    let targets = vec![
        CompareTarget::Version(1),
        CompareTarget::Create(2),
        CompareTarget::Mod(3),
        CompareTarget::Value(b"v".to_vec()),
        CompareTarget::Lease(4),
    ];
    problems.extend(check_enum(
        "compare_target",
        named(targets, |t| match t {
            CompareTarget::Version(_) => "version",
            CompareTarget::Create(_) => "create",
            CompareTarget::Mod(_) => "mod",
            CompareTarget::Value(_) => "value",
            CompareTarget::Lease(_) => "lease",
        }),
    ));
    let results = vec![
        CompareResult::Equal,
        CompareResult::Greater,
        CompareResult::Less,
        CompareResult::NotEqual,
    ];
    problems.extend(check_enum(
        "compare_result",
        named(results, |r| match r {
            CompareResult::Equal => "equal",
            CompareResult::Greater => "greater",
            CompareResult::Less => "less",
            CompareResult::NotEqual => "not_equal",
        }),
    ));
    let orders = vec![SortOrder::None, SortOrder::Ascend, SortOrder::Descend];
    problems.extend(check_enum(
        "sort_order",
        named(orders, |o| match o {
            SortOrder::None => "none",
            SortOrder::Ascend => "ascend",
            SortOrder::Descend => "descend",
        }),
    ));
    let sort_targets = vec![
        SortTarget::Key,
        SortTarget::Version,
        SortTarget::Create,
        SortTarget::Mod,
        SortTarget::Value,
    ];
    problems.extend(check_enum(
        "sort_target",
        named(sort_targets, |t| match t {
            SortTarget::Key => "key",
            SortTarget::Version => "version",
            SortTarget::Create => "create",
            SortTarget::Mod => "mod",
            SortTarget::Value => "value",
        }),
    ));
    let actions = vec![AlarmAction::Activate, AlarmAction::Deactivate];
    problems.extend(check_enum(
        "alarm_action",
        named(actions, |a| match a {
            AlarmAction::Activate => "activate",
            AlarmAction::Deactivate => "deactivate",
        }),
    ));
    problems.extend(check_enum(
        "alarm_type",
        named(vec![AlarmType::NoSpace, AlarmType::Corrupt], |a| match a {
            AlarmType::NoSpace => "no_space",
            AlarmType::Corrupt => "corrupt",
        }),
    ));
    problems.extend(check_enum(
        "auth_command",
        named(auth_commands(), auth_command_name),
    ));
    let auth_responses = vec![
        AuthResponse::Changed { revision: 50 },
        AuthResponse::Authenticated {
            token: None,
            revision: 51,
        },
    ];
    problems.extend(check_enum(
        "auth_response",
        named(auth_responses, |r| match r {
            AuthResponse::Changed { .. } => "changed",
            AuthResponse::Authenticated { .. } => "authenticated",
        }),
    ));
    let auth_errors = vec![
        AuthError::UserEmpty,
        AuthError::AuthFailed,
        AuthError::UserAlreadyExist,
        AuthError::UserNotFound,
        AuthError::RoleAlreadyExist,
        AuthError::RoleNotFound,
        AuthError::RoleEmpty,
        AuthError::PermissionDenied,
        AuthError::RoleNotGranted,
        AuthError::PermissionNotGranted,
        AuthError::RootUserNotExist,
        AuthError::RootRoleNotExist,
        AuthError::AuthNotEnabled,
        AuthError::AuthOldRevision,
        AuthError::InvalidAuthMgmt,
    ];
    problems.extend(check_enum(
        "auth_error",
        named(auth_errors, |e| match e {
            AuthError::UserEmpty => "user_empty",
            AuthError::AuthFailed => "auth_failed",
            AuthError::UserAlreadyExist => "user_already_exist",
            AuthError::UserNotFound => "user_not_found",
            AuthError::RoleAlreadyExist => "role_already_exist",
            AuthError::RoleNotFound => "role_not_found",
            AuthError::RoleEmpty => "role_empty",
            AuthError::PermissionDenied => "permission_denied",
            AuthError::RoleNotGranted => "role_not_granted",
            AuthError::PermissionNotGranted => "permission_not_granted",
            AuthError::RootUserNotExist => "root_user_not_exist",
            AuthError::RootRoleNotExist => "root_role_not_exist",
            AuthError::AuthNotEnabled => "auth_not_enabled",
            AuthError::AuthOldRevision => "auth_old_revision",
            AuthError::InvalidAuthMgmt => "invalid_auth_mgmt",
        }),
    ));
    let perm_types = vec![PermType::Read, PermType::Write, PermType::ReadWrite];
    problems.extend(check_enum(
        "perm_type",
        named(perm_types, |t| match t {
            PermType::Read => "read",
            PermType::Write => "write",
            PermType::ReadWrite => "read_write",
        }),
    ));
    problems.extend(check_enum(
        "fencing_key_mode",
        named(
            vec![FencingKeyMode::Bootstrap, FencingKeyMode::Rotate],
            |m| match m {
                FencingKeyMode::Bootstrap => "bootstrap",
                FencingKeyMode::Rotate => "rotate",
            },
        ),
    ));
    let kinds = vec![EventKind::Put, EventKind::Delete];
    problems.extend(check_enum(
        "event_kind",
        named(kinds, |k| match k {
            EventKind::Put => "put",
            EventKind::Delete => "delete",
        }),
    ));
    assert_no_problems(problems);
}

/// A state with something in every table of the snapshot body: keys with history and a
/// tombstone, a compaction, a lease with a key and a checkpoint, a lock with a delay and a
/// force-release, a fence, a client session with a cached answer, an alarm.
fn small_state() -> StateMachine {
    let mut sm = StateMachine::new();
    let mut index = 0;
    let mut apply = |sm: &mut StateMachine, command: Command| {
        index += 1;
        let applied = sm.apply(&Entry {
            index: CommandIndex(index),
            term: Term(2),
            time_ms: 1_000 * index,
            command,
        });
        assert!(
            !matches!(applied.response, Response::Error(_)),
            "{:?}",
            applied.response
        );
        applied
    };
    let put = |key: &[u8], value: &[u8], lease: i64| {
        Command::Put(PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: LeaseId(lease),
            ..Default::default()
        })
    };
    apply(&mut sm, put(b"a", b"1", 0));
    apply(&mut sm, put(b"a", b"2", 0));
    apply(&mut sm, put(b"b", b"3", 0));
    apply(
        &mut sm,
        Command::DeleteRange(DeleteRangeRequest {
            range: range(b"b", b""),
            prev_kv: false,
        }),
    );
    apply(
        &mut sm,
        Command::Compact {
            revision: Revision(3),
        },
    );
    apply(
        &mut sm,
        Command::LeaseGrant {
            id: LeaseId(0x50),
            ttl_s: 30,
        },
    );
    apply(&mut sm, put(b"leased", b"4", 0x50));
    apply(
        &mut sm,
        Command::LeaseCheckpoint {
            checkpoints: vec![(LeaseId(0x50), 20_000)],
        },
    );
    apply(
        &mut sm,
        Command::LockEnqueue {
            name: b"locks/l".to_vec(),
            lease: LeaseId(0x50),
            value: b"holder".to_vec(),
            delay_ms: Some(500),
        },
    );
    apply(
        &mut sm,
        Command::LockForceRelease {
            name: b"locks/l".to_vec(),
            token: FencingToken::NONE,
            reason: "operator".into(),
        },
    );
    apply(
        &mut sm,
        Command::FenceCheck {
            resource: b"db".to_vec(),
            token: FencingToken(7),
        },
    );
    let registered = apply(&mut sm, Command::RegisterClient { timeout_ms: 60_000 });
    let Response::ClientRegistered { client_id, .. } = registered.response else {
        panic!("{:?}", registered.response);
    };
    apply(
        &mut sm,
        Command::Deduplicated {
            client_id,
            sequence: 1,
            acknowledged_below: 0,
            command: Box::new(put(b"once", b"5", 0)),
        },
    );
    apply(
        &mut sm,
        Command::Alarm {
            action: AlarmAction::Activate,
            member_id: 9,
            alarm: AlarmType::NoSpace,
        },
    );
    sm
}

/// `small_state()` plus something in every table of the auth store: users (one without a
/// password), roles with permissions, the flag on, a simple token.
fn small_state_with_auth() -> StateMachine {
    let mut sm = small_state();
    let mut index = 100;
    let alarm = |action| Command::Alarm {
        action,
        member_id: 9,
        alarm: AlarmType::NoSpace,
    };
    // The alarm refuses what adds data: cleared around the auth commands, raised again.
    let commands = std::iter::once(alarm(AlarmAction::Deactivate))
        .chain(auth_samples().into_iter().map(Command::Auth))
        .chain(std::iter::once(alarm(AlarmAction::Activate)));
    for command in commands {
        index += 1;
        let applied = sm.apply(&Entry {
            index: CommandIndex(index),
            term: Term(2),
            time_ms: 1_000 * index,
            command,
        });
        assert!(
            !matches!(applied.response, Response::Error(_)),
            "{:?}",
            applied.response
        );
    }
    sm
}

fn auth_samples() -> Vec<AuthCommand> {
    vec![
        AuthCommand::UserAdd {
            name: "root".into(),
            password_hash: Some("$2a$10$roothash".into()),
        },
        AuthCommand::UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        },
        AuthCommand::UserAdd {
            name: "cn-user".into(),
            password_hash: None,
        },
        AuthCommand::RoleAdd {
            name: "readers".into(),
        },
        AuthCommand::RoleGrantPermission {
            name: "readers".into(),
            perm: permission(),
        },
        AuthCommand::UserGrantRole {
            user: "cn-user".into(),
            role: "readers".into(),
        },
        AuthCommand::Enable,
        AuthCommand::Authenticate {
            name: "root".into(),
            simple_token_prefix: Some("tokenprefix".into()),
        },
    ]
}

fn snapshot_header(name: &str, what: &str) -> String {
    format!(
        "snapshot/{name}: StateMachine::snapshot() of tests/it/golden.rs's {what}\n[format \
         byte][crc32 LE][bincode(SnapshotBody)]\nPinned by crates/baton-core/tests/it/golden.rs: \
         never edit by hand (see baton_core::format)."
    )
}

/// `small_state_with_auth()` plus a bootstrap key and a rotation (two public keys, the
/// second current).
fn small_state_with_fencing_keys() -> StateMachine {
    let mut sm = small_state_with_auth();
    let key = |mode, b: u8| Command::FencingKey {
        mode,
        public: FencingPublicKey([b; 32]),
        secret: FencingSecret([b + 0x40; 32]),
    };
    let alarm = |action| Command::Alarm {
        action,
        member_id: 9,
        alarm: AlarmType::NoSpace,
    };
    let commands = [
        alarm(AlarmAction::Deactivate),
        key(FencingKeyMode::Bootstrap, 1),
        key(FencingKeyMode::Rotate, 2),
        alarm(AlarmAction::Activate),
    ];
    for (i, command) in commands.into_iter().enumerate() {
        let index = 200 + i as u64;
        let applied = sm.apply(&Entry {
            index: CommandIndex(index),
            term: Term(2),
            time_ms: 1_000 * index,
            command,
        });
        assert!(
            !matches!(applied.response, Response::Error(_)),
            "{:?}",
            applied.response
        );
    }
    sm
}

/// The snapshot body (current format, 6) of a small state, byte for byte, and that it
/// restores to a state that snapshots to the same bytes. `small_state.hex` pinned format 4
/// (before the auth store) and `small_state_v5.hex` format 5 (before the fencing keys); both
/// stay as fixtures of their read paths and restore to the same states without what their
/// formats lacked.
#[test]
fn snapshot_is_pinned() {
    let sm = small_state_with_fencing_keys();
    let bytes = sm.snapshot();
    let dir = golden_dir().join("snapshot");
    let header = snapshot_header("small_state_v6", "small_state_with_fencing_keys()");
    let mut problems: Vec<String> = compare_file(&dir, "small_state_v6", &header, &bytes)
        .into_iter()
        .collect();
    problems.extend(orphans(
        &dir,
        &BTreeSet::from(["small_state", "small_state_v5", "small_state_v6"]),
    ));
    assert_eq!(bytes[0], 6);
    assert_eq!(sm.fencing_keys().public_keys().len(), 2);
    let v5 = std::fs::read_to_string(dir.join("small_state_v5.hex")).expect("the format 5 file");
    let v5 = parse_golden_text(&v5).expect("parses");
    assert_eq!(v5[0], 5, "small_state_v5.hex is format 5");
    let old = StateMachine::restore(&v5).expect("format 5 still restores");
    assert_eq!(old.snapshot(), small_state_with_auth().snapshot());
    assert!(old.fencing_keys().current().is_none());
    let restored = StateMachine::restore(&bytes).expect("restores");
    assert_eq!(
        restored.snapshot(),
        bytes,
        "a restored state snapshots the same"
    );
    assert!(restored.auth_enabled());

    let v4 = std::fs::read_to_string(dir.join("small_state.hex")).expect("the format 4 file");
    let v4 = parse_golden_text(&v4).expect("parses");
    assert_eq!(v4[0], 4, "small_state.hex is format 4");
    let old = StateMachine::restore(&v4).expect("format 4 still restores");
    assert_eq!(old.snapshot(), small_state().snapshot());
    assert!(old.auth_state().users.is_empty());
    assert_no_problems(problems);
}

/// The tables snapshot (format 1: the state without its key space, which Baton's
/// `member/snap/db` carries as etcd's `key` bucket) of a small state, byte for byte, and
/// that it restores, with the key space imported version by version, to the same state.
#[test]
fn tables_snapshot_is_pinned() {
    let sm = small_state_with_fencing_keys();
    let bytes = sm.tables_snapshot();
    let dir = golden_dir().join("tables_snapshot");
    let header = "tables_snapshot/small_state: StateMachine::tables_snapshot() of \
         tests/it/golden.rs's small_state_with_fencing_keys()\n[format byte][crc32 LE]\
         [bincode(TablesBody)]\nPinned by crates/baton-core/tests/it/golden.rs: never edit by \
         hand (see baton_core::format).";
    let mut problems: Vec<String> = compare_file(&dir, "small_state", header, &bytes)
        .into_iter()
        .collect();
    problems.extend(orphans(&dir, &BTreeSet::from(["small_state"])));
    assert_eq!(bytes[0], 1);
    let tables = Tables::decode(&bytes).expect("decodes");
    let mut im = Importer::compacted_at(tables.compact_revision());
    for v in sm.versions_in_revision_order() {
        im.version(
            v.key,
            v.mod_revision,
            v.live
                .as_ref()
                .map(|l| (l.create_revision, l.version, l.lease, &*l.value)),
        )
        .expect("imports");
    }
    let (restored, _) = im.finish_with_tables(tables).expect("restores");
    assert_eq!(restored.snapshot(), sm.snapshot(), "the same state");
    assert_eq!(restored.tables_snapshot(), bytes);
    assert_no_problems(problems);
}
