//! Peer TLS with etcd's `--peer-*` flags (issue 16): a 3-member cluster whose peers must
//! show a certificate of etcd's test CA (`integration/fixtures`). A process without one —
//! plain text, TLS without a client certificate, or one of another CA — gets nothing from
//! any peer method, even knowing the cluster token, the cluster id and the member ids; the
//! cluster keeps serving, and each refused handshake is counted.

use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::common::peer::{self, LeaderRequest, Method};
use crate::common::{self, etcdctl, fixture, Cluster};

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

/// A certificate for localhost signed by a CA of its own (not etcd's test CA): PEM
/// (cert, key).
fn foreign_identity() -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "another CA");
    let ca_key = KeyPair::generate().unwrap();
    let mut leaf =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "example.com");
    let key = KeyPair::generate().unwrap();
    let cert = leaf
        .signed_by(&key, &Issuer::from_params(&ca, &ca_key))
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A channel to `127.0.0.1:port` over TLS trusting etcd's test CA, showing `identity`.
fn tls_channel(port: u16, identity: Option<(Vec<u8>, Vec<u8>)>) -> Channel {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.crt")))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// A plain-text (h2c) channel to `127.0.0.1:port`.
fn plain_channel(port: u16) -> Channel {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// How a stranger dials a peer port.
type Dialer = Box<dyn Fn(u16) -> Channel>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_mtls_keeps_out_every_process_without_the_peer_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--peer-cert-file".to_string(),
        fixture("server.crt"),
        "--peer-key-file".to_string(),
        fixture("server.key.insecure"),
        "--peer-trusted-ca-file".to_string(),
        fixture("ca.crt"),
        "--peer-client-cert-auth".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = Cluster::start_with_peer_scheme(dir.path(), 3, "https", &flags);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let leader = common::agreed_leader(&eps, Duration::from_secs(20)).await;
    let put = etcdctl(&eps[leader], &["put", "before", "1"], None);
    assert_eq!(put.code, 0, "{put:?}\n{}", cluster.logs());

    let list = etcdctl(&eps[leader], &["member", "list", "-w", "json"], None);
    let list: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    let cluster_id = list["header"]["cluster_id"].as_u64().unwrap();
    let leader_id = list["header"]["member_id"].as_u64().unwrap();
    let follower_id = list["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["ID"].as_u64().unwrap())
        .find(|id| *id != leader_id)
        .unwrap();

    // The strongest stranger: it knows the token, the cluster id and the member ids, and
    // claims to be a follower. Every method, every member.
    let forged_put = peer::encode(&LeaderRequest::Propose(baton_core::Command::Put(
        baton_core::PutRequest {
            key: b"forged".to_vec(),
            value: b"x".to_vec(),
            ..Default::default()
        },
    )));
    let join = peer::encode(&peer::JoinRequest {
        peer_urls: vec!["https://127.0.0.1:1".into()],
        credential: peer::cluster_credential(&cluster.token),
    });
    let (foreign_cert, foreign_key) = foreign_identity();
    let strangers: Vec<(&str, Dialer)> = vec![
        ("plain text", Box::new(plain_channel)),
        (
            "TLS without a certificate",
            Box::new(|p| tls_channel(p, None)),
        ),
        (
            "TLS with another CA's certificate",
            Box::new(move |p| {
                tls_channel(
                    p,
                    Some((
                        foreign_cert.clone().into_bytes(),
                        foreign_key.clone().into_bytes(),
                    )),
                )
            }),
        ),
    ];
    let methods = [
        (Method::Forward, forged_put.clone()),
        (Method::ForwardBatch, peer::encode(&[&forged_put])),
        (Method::Members, join.clone()),
        (Method::Vote, vec![0; 16]),
        (Method::AppendEntries, vec![0; 16]),
    ];
    for m in &cluster.members {
        for (who, channel) in &strangers {
            for (method, payload) in &methods {
                let answer = peer::call_on(
                    channel(m.peer_port),
                    *method,
                    (cluster_id, follower_id, leader_id),
                    Some(&cluster.token),
                    payload.clone(),
                )
                .await;
                assert!(
                    answer.is_err(),
                    "{who}: {method:?} to the member on peer port {} was answered",
                    m.peer_port
                );
            }
        }
    }

    // The same call with the peer certificate is answered: the refusals above are the
    // certificates', not a broken client.
    let member = peer::call_on(
        tls_channel(
            cluster.members[leader].peer_port,
            Some((read("server.crt"), read("server.key.insecure"))),
        ),
        Method::Members,
        (0, 0, 0),
        None,
        join,
    )
    .await;
    assert!(member.is_ok(), "{member:?}");

    // Admission by `member add` does not open the TLS port to certificate holders without
    // the token: one advertising exactly an added member's peer URLs is refused as before
    // (behind the TLS transport the peer service sees no source address to check).
    let added = format!("https://127.0.0.1:{}", common::free_port_below_ephemeral());
    let peer_urls = format!("--peer-urls={added}");
    let add = etcdctl(
        &eps[leader],
        &["member", "add", "m4", &peer_urls, "--learner"],
        None,
    );
    assert_eq!(add.code, 0, "{add:?}");
    let unadmitted = peer::call_on(
        tls_channel(
            cluster.members[leader].peer_port,
            Some((read("server.crt"), read("server.key.insecure"))),
        ),
        Method::Members,
        (0, 0, 0),
        None,
        peer::encode(&peer::JoinRequest {
            peer_urls: vec![added],
            credential: peer::cluster_credential("not the cluster's token"),
        }),
    )
    .await
    .expect_err("a joiner without the token over peer TLS");
    assert_eq!(unadmitted.code(), tonic::Code::PermissionDenied);
    assert!(
        unadmitted
            .message()
            .contains("the request's source address is unknown to the peer service (peer TLS)"),
        "{unadmitted:?}"
    );

    // Nothing forged was written, and every member still serves reads and writes.
    for (i, ep) in eps.iter().enumerate() {
        let key = format!("after-{i}");
        let put = etcdctl(ep, &["put", &key, "1"], None);
        assert_eq!(put.code, 0, "{put:?}");
        let get = etcdctl(ep, &["get", "--prefix", ""], None);
        assert_eq!(get.code, 0, "{get:?}");
        assert!(get.stdout.contains(&key), "{}", get.stdout);
        assert!(!get.stdout.contains("forged"), "{}", get.stdout);
    }
    // Each member counted the handshakes it refused.
    for m in &cluster.members {
        let refused = common::metric(
            m.metrics_port,
            "baton_tls_handshake_failures_total{kind=\"refused\"}",
        )
        .await
        .unwrap_or(0.0);
        assert!(refused >= 10.0, "member on {}: {refused}", m.peer_port);
    }
}

/// Peer TLS flags that cannot work stop the member at start, naming the flag.
#[test]
fn peer_tls_flags_that_cannot_work_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cert = fixture("server.crt");
    let key = fixture("server.key.insecure");
    let ca = fixture("ca.crt");
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "https://127.0.0.1:0",
            vec![],
            "need --peer-cert-file and --peer-key-file",
        ),
        (
            "https://127.0.0.1:0",
            vec![
                "--peer-cert-file",
                &cert,
                "--peer-key-file",
                &key,
                "--peer-client-cert-auth",
            ],
            "--peer-client-cert-auth needs --peer-trusted-ca-file",
        ),
        (
            "https://127.0.0.1:0",
            vec!["--peer-cert-file", &cert, "--peer-key-file", &cert],
            "--peer-key-file",
        ),
        (
            "https://127.0.0.1:0",
            vec![
                "--peer-cert-file",
                &cert,
                "--peer-key-file",
                &key,
                "--peer-trusted-ca-file",
                &ca,
                "--peer-cert-allowed-cn",
                "a",
                "--peer-cert-allowed-hostname",
                "b",
            ],
            "mutually exclusive",
        ),
        (
            "http://127.0.0.1:0,https://127.0.0.1:0",
            vec!["--peer-auto-tls"],
            "all http:// or all https://",
        ),
    ];
    for (i, (peer_urls, flags, want)) in cases.into_iter().enumerate() {
        let out = crate::common::baton_cmd()
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join(format!("d{i}")))
            .arg("--listen-client-urls")
            .arg("http://127.0.0.1:0")
            .arg("--listen-peer-urls")
            .arg(peer_urls)
            .args(&flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} started");
        assert!(stderr.contains(want), "case {i}: want {want:?} in {stderr}");
    }
}
