//! The cluster's fencing-token signing keys across real processes: a three-member cluster
//! whose followers sign the grants they serve with the key the leader made, `baton fence
//! public-key` (text and JSON) on any member, `baton fence rotate-key` (the leader makes
//! the new key; tokens of the old one still verify), a follower refusing a rotation, the
//! key after kill -9 and restart, `FenceGate` refusing tampered tokens without raising the
//! gate, and root-only rotation with auth on.

use std::time::{Duration, Instant};

use crate::common::{self, baton_cmd, Baton, Cluster};
use baton_client::{
    Client, ClientConfig, Error, FenceGate, KeyId, Mutex, PublicKeys, Session, SessionOptions,
    Signature, VerifyError,
};

fn endpoints(c: &Cluster) -> Vec<String> {
    c.members.iter().map(|m| m.endpoint()).collect()
}

async fn client(endpoint: &str) -> Client {
    Client::connect(ClientConfig::new([endpoint.to_string()]))
        .await
        .unwrap()
}

/// `baton fence <args>` against `endpoints`: (exit status, stdout, stderr).
fn fence(endpoints: &str, args: &[&str]) -> (i32, String, String) {
    let out = baton_cmd()
        .arg("fence")
        .args(args)
        .args(["--endpoints", endpoints])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The public keys from `baton fence public-key` on `endpoint`, once there are `n`.
fn public_keys(endpoint: &str, n: usize) -> PublicKeys {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, out, err) = fence(endpoint, &["public-key"]);
        if code == 0 {
            let keys = PublicKeys::parse(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
            if keys.len() == n {
                return keys;
            }
        }
        assert!(Instant::now() < deadline, "public-key: {code} {out} {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_sign_grants_rotation_keeps_old_tokens_valid_and_keys_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &[]);
    let eps = endpoints(&cluster);
    let leader = common::agreed_leader(&eps, Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;

    // The bootstrap key, as every member reports it.
    let keys = public_keys(&eps[follower], 1);
    assert_eq!(public_keys(&eps[other], 1), keys);
    let (code, json, _) = fence(&eps[follower], &["public-key", "--output", "json"]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let k = &json["keys"][0];
    assert_eq!(
        (k["id"].as_u64(), k["algorithm"].as_str()),
        (Some(1), Some("ed25519"))
    );
    assert_eq!(k["current"], true);
    assert_eq!(
        k["public_key"].as_str().unwrap(),
        keys.get(KeyId::new(1)).unwrap().to_hex()
    );

    // A grant served by a follower is signed, and verifies.
    let c = client(&eps[follower]).await;
    let session = Session::new(&c, SessionOptions::new()).await.unwrap();
    let first = Mutex::new(&session).acquire("orders").await.unwrap();
    let signed = first.signed_token().unwrap().clone();
    assert_eq!(signed.key_id, KeyId::new(1));
    assert_eq!(signed.name, b"orders");
    assert_eq!(signed.lease, session.lease());
    assert_eq!(signed.verify(&keys), Ok(()));
    first.release().await.unwrap();

    // A follower does not rotate; the CLI finds the leader among the endpoints.
    assert!(matches!(
        client(&eps[follower]).await.rotate_fence_key().await,
        Err(Error::Server { message, .. }) if message == "etcdserver: not leader"
    ));
    let (code, out, err) = fence(&eps[follower], &["rotate-key"]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("no leader among the endpoints"), "{err}");
    let (code, out, err) = fence(&eps.join(","), &["rotate-key", "--output", "simple"]);
    assert_eq!((code, out.trim()), (0, "2"), "{err}");

    // Both keys listed everywhere; the old token still verifies, new grants use key 2.
    let rotated = public_keys(&eps[other], 2);
    assert_eq!(rotated.get(KeyId::new(1)), keys.get(KeyId::new(1)));
    assert_eq!(signed.verify(&rotated), Ok(()));
    let second = Mutex::new(&session).acquire("orders").await.unwrap();
    let signed2 = second.signed_token().unwrap().clone();
    assert_eq!(signed2.key_id, KeyId::new(2));
    assert_eq!(signed2.verify(&rotated), Ok(()));
    // A resource that kept only the old key cannot check the new token: refused, not
    // accepted on trust (fetch the keys again after a rotation).
    assert_eq!(
        signed2.verify(&keys),
        Err(VerifyError::UnknownKey(KeyId::new(2)))
    );

    // The gate with the keys: tampered tokens are refused before Baton is asked, so the
    // honest holder's next check still passes.
    let gate = FenceGate::new(&c).with_public_keys(rotated.clone());
    gate.admit_signed("orders-db", &signed2).await.unwrap();
    let mut higher = signed2.clone();
    higher.token = baton_client::FencingToken::new(signed2.token.get() + 1_000_000);
    let mut flipped = signed2.clone();
    let mut sig = *flipped.signature.unwrap().as_bytes();
    sig[0] ^= 1;
    flipped.signature = Some(Signature::from_bytes(sig));
    let mut other_lease = signed2.clone();
    other_lease.lease += 1;
    let mut other_rev = signed2.clone();
    other_rev.revision += 1;
    let mut other_name = signed2.clone();
    other_name.name = b"payments".to_vec();
    for forged in [&higher, &flipped, &other_lease, &other_rev, &other_name] {
        assert!(matches!(
            gate.check_signed("orders-db", forged).await,
            Err(Error::InvalidFencingSignature(VerifyError::BadSignature(_)))
        ));
    }
    let mut unknown = signed2.clone();
    unknown.key_id = KeyId::new(7);
    assert!(matches!(
        gate.check_signed("orders-db", &unknown).await,
        Err(Error::InvalidFencingSignature(VerifyError::UnknownKey(_)))
    ));
    assert!(matches!(
        gate.check("orders-db", higher.token).await,
        Err(Error::InvalidFencingSignature(VerifyError::Unsigned))
    ));
    let still = gate.check_signed("orders-db", &signed2).await.unwrap();
    assert!(still.accepted);
    assert_eq!(
        still.highest_token, signed2.token,
        "no forgery raised the gate"
    );
    second.release().await.unwrap();
    session.close().await.unwrap();

    // kill -9 of every member and a restart: the keys come back from the log.
    for m in &mut cluster.members {
        m.kill9();
    }
    for m in &mut cluster.members {
        m.spawn();
    }
    common::agreed_leader(&eps, Duration::from_secs(20)).await;
    assert_eq!(public_keys(&eps[follower], 2), rotated);
    let c = client(&eps[other]).await;
    let session = Session::new(&c, SessionOptions::new()).await.unwrap();
    let third = Mutex::new(&session).acquire("orders").await.unwrap();
    assert_eq!(third.signed_token().unwrap().verify(&rotated), Ok(()));
    assert_eq!(third.signed_token().unwrap().key_id, KeyId::new(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_only_root_rotates_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let admin = client(&b.endpoint()).await;
    public_keys(&b.endpoint(), 1);
    for (user, password) in [("root", "rootpw"), ("alice", "alicepw")] {
        admin.user_add(user, Some(password)).await.unwrap();
    }
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let as_user = |user: &str, password: &str| {
        ClientConfig::new([b.endpoint()]).with_user(user.to_string(), password.to_string())
    };
    let alice = Client::connect(as_user("alice", "alicepw")).await.unwrap();
    let refused = alice.rotate_fence_key().await;
    assert!(
        matches!(&refused, Err(Error::Server { message, .. }) if message.contains("permission denied")),
        "{refused:?}"
    );
    // Public keys are public: anyone may read them, with or without a user.
    assert_eq!(alice.fence_public_keys().await.unwrap().keys.len(), 1);
    let root = Client::connect(as_user("root", "rootpw")).await.unwrap();
    assert_eq!(root.rotate_fence_key().await.unwrap(), KeyId::new(2));
    assert_eq!(
        alice.fence_public_keys().await.unwrap().current,
        Some(KeyId::new(2))
    );
}
