//! etcd's auth and RBAC against a real `baton serve`, over raw gRPC with the `token`
//! metadata etcd's clients send: confinement of a user with read on one prefix (ranges,
//! watches, a watch lost on revocation, txns denied whole), etcd's errors for bad
//! credentials and foreign, tampered or expired tokens (changing nothing), and the auth
//! store surviving a restart from the log and from a snapshot.

use std::time::Duration;

use baton_proto::authpb;
use baton_proto::etcdserverpb as pb;
use pb::auth_client::AuthClient;
use pb::kv_client::KvClient;
use pb::watch_client::WatchClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::common::{self, Baton, FIXTURES};

fn with_token<T>(msg: T, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    if !token.is_empty() {
        r.metadata_mut().insert("token", token.parse().unwrap());
    }
    r
}

struct Api {
    auth: AuthClient<Channel>,
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
}

async fn connect(endpoint: &str) -> Api {
    let ch = common::channel(endpoint).await;
    Api {
        auth: AuthClient::new(ch.clone()),
        kv: KvClient::new(ch.clone()),
        watch: WatchClient::new(ch),
    }
}

impl Api {
    async fn login(&mut self, name: &str, password: &str) -> Result<String, tonic::Status> {
        let r = self
            .auth
            .authenticate(pb::AuthenticateRequest {
                name: name.into(),
                password: password.into(),
            })
            .await?;
        Ok(r.into_inner().token)
    }

    async fn get(&mut self, token: &str, key: &str) -> Result<pb::RangeResponse, tonic::Status> {
        let req = pb::RangeRequest {
            key: key.into(),
            ..Default::default()
        };
        Ok(self.kv.range(with_token(req, token)).await?.into_inner())
    }

    async fn put(&mut self, token: &str, key: &str) -> Result<(), tonic::Status> {
        let req = pb::PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        self.kv.put(with_token(req, token)).await.map(|_| ())
    }

    /// root/rootpw (root role), alice/alicepw with READ on prefix `/a` through role `ra`;
    /// made with auth off, as `etcdctl user add` before `auth enable`; then auth enabled.
    async fn setup(&mut self) {
        let a = &mut self.auth;
        for (name, password) in [("root", "rootpw"), ("alice", "alicepw")] {
            a.user_add(pb::AuthUserAddRequest {
                name: name.into(),
                password: password.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        a.role_add(pb::AuthRoleAddRequest { name: "ra".into() })
            .await
            .unwrap();
        a.role_grant_permission(pb::AuthRoleGrantPermissionRequest {
            name: "ra".into(),
            perm: Some(read_prefix_a()),
        })
        .await
        .unwrap();
        for (user, role) in [("root", "root"), ("alice", "ra")] {
            a.user_grant_role(pb::AuthUserGrantRoleRequest {
                user: user.into(),
                role: role.into(),
            })
            .await
            .unwrap();
        }
        a.auth_enable(pb::AuthEnableRequest {}).await.unwrap();
    }
}

fn read_prefix_a() -> authpb::Permission {
    authpb::Permission {
        perm_type: authpb::permission::Type::Read as i32,
        key: b"/a".to_vec(),
        range_end: b"/b".to_vec(),
    }
}

fn create(key: &str, end: &str) -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: key.into(),
                range_end: end.into(),
                ..Default::default()
            },
        )),
    }
}

fn assert_status(r: Result<impl std::fmt::Debug, tonic::Status>, code: Code, message: &str) {
    let e = r.expect_err("refused");
    assert_eq!((e.code(), e.message()), (code, message), "{e:?}");
}

/// A user with read on prefix `/a`: reads `/a`, not `/b`; cannot watch `/b`; loses a
/// running watch on `/a` when the permission is revoked; a txn touching `/b` in either
/// branch is denied whole and writes nothing.
#[tokio::test]
async fn a_user_with_read_on_a_prefix_is_confined_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::start(&dir.path().join("data"));
    let mut api = connect(&baton.endpoint()).await;
    api.setup().await;
    let root = api.login("root", "rootpw").await.unwrap();
    let alice = api.login("alice", "alicepw").await.unwrap();
    api.put(&root, "/a/1").await.unwrap();
    api.put(&root, "/b/1").await.unwrap();

    assert_eq!(api.get(&alice, "/a/1").await.unwrap().kvs.len(), 1);
    let denied = "etcdserver: permission denied";
    assert_status(
        api.get(&alice, "/b/1").await,
        Code::PermissionDenied,
        denied,
    );
    assert_status(
        api.put(&alice, "/a/2").await,
        Code::PermissionDenied,
        denied,
    );
    assert_status(
        api.get("", "/a/1").await,
        Code::InvalidArgument,
        "etcdserver: user name is empty",
    );

    // A txn whose failure branch reads /b: denied whole, its success put not written.
    let txn = pb::TxnRequest {
        compare: vec![],
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                key: b"/a/txn".to_vec(),
                ..Default::default()
            })),
        }],
        failure: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                key: b"/b/1".to_vec(),
                ..Default::default()
            })),
        }],
    };
    // Root may write /a; give alice write on /a so only the /b read is what denies.
    api.auth
        .role_grant_permission(with_token(
            pb::AuthRoleGrantPermissionRequest {
                name: "ra".into(),
                perm: Some(authpb::Permission {
                    perm_type: authpb::permission::Type::Readwrite as i32,
                    ..read_prefix_a()
                }),
            },
            &root,
        ))
        .await
        .unwrap();
    let before = api
        .get(&root, "/a/txn")
        .await
        .unwrap()
        .header
        .unwrap()
        .revision;
    assert_status(
        api.kv.txn(with_token(txn, &alice)).await,
        Code::PermissionDenied,
        denied,
    );
    let after = api.get(&root, "/a/txn").await.unwrap();
    assert!(after.kvs.is_empty(), "the denied txn wrote nothing");
    assert_eq!(after.header.unwrap().revision, before);

    // Watches: /b refused at create; /a runs until the permission is revoked.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut stream = api
        .watch
        .watch(with_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    tx.send(create("/b", "/c")).await.unwrap();
    let refused = stream.message().await.unwrap().unwrap();
    assert!(refused.created && refused.canceled, "{refused:?}");
    assert!(refused.cancel_reason.contains(denied), "{refused:?}");
    tx.send(create("/a", "/b")).await.unwrap();
    let created = stream.message().await.unwrap().unwrap();
    assert!(created.created && !created.canceled, "{created:?}");
    api.put(&root, "/a/3").await.unwrap();
    let event = stream.message().await.unwrap().unwrap();
    assert_eq!(event.events.len(), 1);
    api.auth
        .role_revoke_permission(with_token(
            pb::AuthRoleRevokePermissionRequest {
                role: "ra".into(),
                key: b"/a".to_vec(),
                range_end: b"/b".to_vec(),
            },
            &root,
        ))
        .await
        .unwrap();
    let cancel = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the watch is cancelled")
        .unwrap()
        .unwrap();
    assert!(
        cancel.canceled && cancel.watch_id == created.watch_id,
        "{cancel:?}"
    );
    assert!(cancel.cancel_reason.contains(denied), "{cancel:?}");
}

/// Wrong password, unknown user, a tampered token and a token from another cluster get
/// etcd's errors, and none of them changes anything.
#[tokio::test]
async fn bad_credentials_and_foreign_tokens_get_etcd_s_errors() {
    let dir = tempfile::tempdir().unwrap();
    let a = Baton::start(&dir.path().join("a"));
    let b = Baton::start(&dir.path().join("b"));
    let mut api = connect(&a.endpoint()).await;
    assert_status(
        api.login("root", "x").await,
        Code::FailedPrecondition,
        "etcdserver: authentication is not enabled",
    );
    api.setup().await;
    let failed = "etcdserver: authentication failed, invalid user ID or password";
    assert_status(
        api.login("alice", "wrong").await,
        Code::InvalidArgument,
        failed,
    );
    assert_status(
        api.login("mallory", "x").await,
        Code::InvalidArgument,
        failed,
    );
    let root = api.login("root", "rootpw").await.unwrap();
    let status = api
        .auth
        .auth_status(with_token(pb::AuthStatusRequest {}, &root))
        .await;
    let revision = status.unwrap().into_inner().auth_revision;

    let invalid = "etcdserver: invalid auth token";
    let mut tampered = root.clone();
    tampered.insert(0, if root.starts_with('x') { 'y' } else { 'x' });
    assert_status(
        api.put(&tampered, "/a/x").await,
        Code::Unauthenticated,
        invalid,
    );
    let mut other = connect(&b.endpoint()).await;
    other.setup().await;
    let foreign = other.login("root", "rootpw").await.unwrap();
    assert_status(
        api.put(&foreign, "/a/x").await,
        Code::Unauthenticated,
        invalid,
    );

    let status = api
        .auth
        .auth_status(with_token(pb::AuthStatusRequest {}, &root))
        .await;
    assert_eq!(status.unwrap().into_inner().auth_revision, revision);
    assert!(
        api.get(&root, "/a/x").await.unwrap().kvs.is_empty(),
        "nothing written"
    );
}

/// JWT tokens (`--auth-token jwt,…`, etcd's test keys): a tampered signature and an
/// expired token are "invalid auth token"; a good one works.
#[tokio::test]
async fn tampered_and_expired_jwts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = format!(
        "jwt,pub-key={FIXTURES}/server.crt,priv-key={FIXTURES}/server.key.insecure,sign-method=RS256,ttl=2s"
    );
    let baton = Baton::start_with(&dir.path().join("data"), &["--auth-token", &opts]);
    let mut api = connect(&baton.endpoint()).await;
    api.setup().await;
    let token = api.login("root", "rootpw").await.unwrap();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    api.put(&token, "/a/1").await.unwrap();
    let invalid = "etcdserver: invalid auth token";
    let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
    let sig = parts[2].clone();
    parts[2] = format!(
        "{}{}",
        if sig.starts_with('A') { 'B' } else { 'A' },
        &sig[1..]
    );
    assert_status(
        api.put(&parts.join("."), "/a/2").await,
        Code::Unauthenticated,
        invalid,
    );
    tokio::time::sleep(Duration::from_millis(3100)).await;
    assert_status(
        api.put(&token, "/a/3").await,
        Code::Unauthenticated,
        invalid,
    );
    let fresh = api.login("root", "rootpw").await.unwrap();
    assert_eq!(api.get(&fresh, "/a/2").await.unwrap().kvs.len(), 0);
}

/// Users, roles, permissions, the flag and simple tokens survive kill -9 and a restart,
/// once replayed from the log and once restored from a snapshot.
#[tokio::test]
async fn the_auth_store_survives_restarts_from_the_log_and_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut baton = Baton::start_with(&dir.path().join("data"), &["--snapshot-count", "20"]);
    let mut api = connect(&baton.endpoint()).await;
    api.setup().await;
    let alice = api.login("alice", "alicepw").await.unwrap();
    for round in 0..2 {
        baton.kill9();
        baton.spawn();
        let mut api = connect(&baton.endpoint()).await;
        let status = api
            .auth
            .auth_status(pb::AuthStatusRequest {})
            .await
            .unwrap();
        assert!(status.into_inner().enabled, "round {round}");
        assert_status(
            api.get(&alice, "/b").await,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        api.get(&alice, "/a").await.unwrap();
        let root = api.login("root", "rootpw").await.unwrap();
        // Enough entries for a snapshot before the second restart.
        for i in 0..25 {
            api.put(&root, &format!("/k/{i}")).await.unwrap();
        }
    }
}

/// The CLI: `baton user|role|auth` as etcdctl's, and `--user name:password` on the KV
/// commands; without it a KV command gets etcd's "user name is empty".
#[test]
fn the_cli_manages_users_and_roles_and_authenticates() {
    use crate::common::baton;
    let dir = tempfile::tempdir().unwrap();
    let server = Baton::start(&dir.path().join("data"));
    let ep = server.endpoint();
    let ok = |args: &[&str], expect: &str| {
        let out = baton(&ep, args, None);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
        assert!(out.stdout.contains(expect), "{args:?}: {}", out.stdout);
    };
    ok(&["user", "add", "root:rootpw"], "User root created");
    ok(
        &["user", "grant-role", "root", "root"],
        "Role root is granted to user root",
    );
    ok(
        &["user", "add", "bob", "--new-password", "bobpw"],
        "User bob created",
    );
    ok(&["role", "add", "apps"], "Role apps created");
    ok(
        &[
            "role",
            "grant-permission",
            "apps",
            "readwrite",
            "/app/",
            "--prefix",
        ],
        "Role apps updated",
    );
    ok(&["user", "grant-role", "bob", "apps"], "granted");
    ok(&["auth", "enable"], "Authentication Enabled");
    ok(&["kv", "--user", "bob:bobpw", "put", "/app/x", "1"], "");
    let denied = baton(
        &ep,
        &["kv", "--user", "bob:bobpw", "put", "/other", "1"],
        None,
    );
    assert_ne!(denied.code, 0);
    assert!(
        denied.stderr.contains("etcdserver: permission denied"),
        "{}",
        denied.stderr
    );
    let anonymous = baton(&ep, &["kv", "get", "/app/x"], None);
    assert!(
        anonymous.stderr.contains("etcdserver: user name is empty"),
        "{}",
        anonymous.stderr
    );
    let wrong = baton(&ep, &["kv", "--user", "bob:nope", "get", "/app/x"], None);
    assert!(
        wrong.stderr.contains("invalid user ID or password"),
        "{}",
        wrong.stderr
    );
    ok(
        &[
            "role",
            "--user",
            "root",
            "--password",
            "rootpw",
            "get",
            "apps",
        ],
        "[/app/, /app0)",
    );
    ok(&["user", "--user", "root:rootpw", "list"], "bob");
    ok(
        &["auth", "--user", "root:rootpw", "status"],
        "Authentication Status: true",
    );
    ok(
        &["auth", "--user", "root:rootpw", "disable"],
        "Authentication Disabled",
    );
    ok(&["kv", "get", "/app/x"], "/app/x");
}
