//! The client port's HTTP side, driven with curl as etcd's users and e2e tests drive it:
//! the JSON gateway over HTTP/1.1 and HTTP/2 (cleartext and TLS), every route family,
//! watch / keep-alive / observe streams, auth with the `Authorization` header and with a
//! client certificate's CN, `/health`, `/version` and `/metrics` on the client port and on
//! `--listen-metrics-urls` listeners (http and https), and three members on one host with
//! etcd's usual flags and no metrics listener.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{etcdctl, fixture, free_port_below_ephemeral, Baton};

/// One curl answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    /// `1.1` or `2`.
    pub http_version: String,
    /// What curl printed on stderr (why there is no status, when there is none).
    #[allow(
        dead_code,
        reason = "read through Debug, in failed assertions' messages"
    )]
    pub error: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// `curl` with `args` (URL, data, flags), at most 20 s.
pub fn curl(args: &[&str]) -> Answer {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-w",
            "\n%{http_code} %{http_version}",
        ])
        .args(args)
        .output()
        .expect("curl is installed (scripts/install-deps)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').expect("curl's -w line");
    let (status, version) = tail.split_once(' ').expect("status and version");
    Answer {
        status: status.parse().unwrap_or(0),
        body: body.to_string(),
        http_version: version.to_string(),
        error: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `POST url` with `json`, over plain HTTP/1.1.
pub fn post(url: &str, json: &str) -> Answer {
    curl(&[url, "-d", json])
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn ok(a: &Answer) -> Value {
    assert_eq!(a.status, 200, "{a:?}");
    a.json()
}

/// Every route family answers over `flags` (an HTTP version choice, TLS options).
fn exercise_every_family(base: &str, flags: &[&str]) {
    let call = |path: &str, json: &str| -> Value {
        let url = format!("{base}{path}");
        let mut args = flags.to_vec();
        args.extend([url.as_str(), "-d", json]);
        ok(&curl(&args))
    };
    let (k, v) = (b64("fam/key"), b64("value"));
    // KV
    let put = call("/v3/kv/put", &format!(r#"{{"key":"{k}","value":"{v}"}}"#));
    let rev: i64 = put["header"]["revision"].as_str().unwrap().parse().unwrap();
    assert!(rev > 0 && put["header"]["cluster_id"].is_string(), "{put}");
    let got = call("/v3/kv/range", &format!(r#"{{"key":"{k}"}}"#));
    assert_eq!(got["kvs"][0]["value"], v.as_str(), "{got}");
    assert_eq!(got["count"], "1");
    let txn = call(
        "/v3/kv/txn",
        &format!(
            r#"{{"compare":[{{"key":"{k}","target":"VALUE","result":"EQUAL","value":"{v}"}}],"success":[{{"request_range":{{"key":"{k}"}}}}]}}"#
        ),
    );
    assert_eq!(txn["succeeded"], true, "{txn}");
    assert_eq!(
        txn["responses"][0]["response_range"]["kvs"][0]["value"],
        v.as_str()
    );
    let del = call(
        "/v3/kv/deleterange",
        &format!(r#"{{"key":"{k}","prev_kv":true}}"#),
    );
    assert_eq!(del["deleted"], "1", "{del}");
    assert_eq!(del["prev_kvs"][0]["key"], k.as_str());
    call("/v3/kv/compaction", &format!(r#"{{"revision":"{rev}"}}"#));
    // Lease, under both prefixes etcd binds
    let grant = call("/v3/lease/grant", r#"{"TTL":60}"#);
    let id = grant["ID"].as_str().unwrap().to_string();
    assert_eq!(grant["TTL"], "60");
    for path in ["/v3/lease/timetolive", "/v3/kv/lease/timetolive"] {
        let ttl = call(path, &format!(r#"{{"ID":"{id}","keys":true}}"#));
        assert_eq!(ttl["grantedTTL"], "60", "{ttl}");
    }
    for path in ["/v3/lease/leases", "/v3/kv/lease/leases"] {
        let leases = call(path, "{}");
        assert!(leases["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["ID"] == id.as_str()));
    }
    call("/v3/lease/revoke", &format!(r#"{{"ID":"{id}"}}"#));
    // Cluster, maintenance
    let members = call("/v3/cluster/member/list", "{}");
    assert_eq!(members["members"].as_array().unwrap().len(), 1, "{members}");
    let status = call("/v3/maintenance/status", "{}");
    assert!(
        status["version"].is_string() && status["leader"].is_string(),
        "{status}"
    );
    let hash = call("/v3/maintenance/hash", "{}");
    assert!(hash["hash"].is_number(), "{hash}");
    call("/v3/maintenance/alarm", r#"{"action":"GET"}"#);
    // Auth (off): users and roles can be managed
    call("/v3/auth/role/add", r#"{"name":"fam-role"}"#);
    let roles = call("/v3/auth/role/list", "{}");
    assert!(
        roles["roles"]
            .as_array()
            .unwrap()
            .contains(&Value::from("fam-role")),
        "{roles}"
    );
    call("/v3/auth/role/delete", r#"{"role":"fam-role"}"#);
    // Lock and election, on one lease
    let lease = call("/v3/lease/grant", r#"{"TTL":60}"#)["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let lock = call(
        "/v3/lock/lock",
        &format!(r#"{{"name":"{}","lease":"{lease}"}}"#, b64("fam-lock")),
    );
    let lock_key = lock["key"].as_str().unwrap().to_string();
    call("/v3/lock/unlock", &format!(r#"{{"key":"{lock_key}"}}"#));
    let name = b64("fam-election");
    let campaign = call(
        "/v3/election/campaign",
        &format!(
            r#"{{"name":"{name}","lease":"{lease}","value":"{}"}}"#,
            b64("v1")
        ),
    );
    let leader = campaign["leader"].clone();
    assert_eq!(leader["name"], name.as_str(), "{campaign}");
    call(
        "/v3/election/proclaim",
        &format!(r#"{{"leader":{leader},"value":"{}"}}"#, b64("v2")),
    );
    let now = call("/v3/election/leader", &format!(r#"{{"name":"{name}"}}"#));
    assert_eq!(now["kv"]["value"], b64("v2"), "{now}");
    call("/v3/election/resign", &format!(r#"{{"leader":{leader}}}"#));
    // HTTP beside the gateway
    let mut args = flags.to_vec();
    let health = format!("{base}/health");
    args.push(&health);
    let h = curl(&args);
    assert_eq!((h.status, h.body.as_str()), (200, r#"{"health":"true"}"#));
    let mut args = flags.to_vec();
    let metrics = format!("{base}/metrics");
    args.push(&metrics);
    let m = curl(&args);
    assert!(
        m.status == 200 && m.body.contains("grpc_server_handled_total"),
        "{m:?}"
    );
}

#[test]
fn every_route_family_over_http1_and_http2() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("m"));
    exercise_every_family(&b.url(), &["--http1.1"]);
    exercise_every_family(&b.url(), &["--http2-prior-knowledge"]);
    // Both protocols really were spoken, beside gRPC on the same port.
    let one = curl(&["--http1.1", &format!("{}/version", b.url())]);
    let two = curl(&["--http2-prior-knowledge", &format!("{}/version", b.url())]);
    assert_eq!(
        (one.http_version.as_str(), two.http_version.as_str()),
        ("1.1", "2")
    );
    assert_eq!(one.body, r#"{"etcdserver":"3.4.23","etcdcluster":"3.4.0"}"#);
    let ctl = etcdctl(
        &b.endpoint(),
        &["get", "fam/", "--prefix", "--keys-only"],
        None,
    );
    assert_eq!(ctl.code, 0, "{ctl:?}");
}

#[test]
fn tls_with_client_certificates_and_cn_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start_on(
        &dir.path().join("m"),
        "https://127.0.0.1:{port}",
        &[
            "--cert-file",
            &fixture("server.crt"),
            "--key-file",
            &fixture("server.key.insecure"),
            "--trusted-ca-file",
            &fixture("ca.crt"),
            "--client-cert-auth",
        ],
    );
    let base = format!("https://127.0.0.1:{}", b.client_port);
    let ca = fixture("ca.crt");
    // server.crt's CN is example.com; client-nocn.crt has none.
    let cn_cert = [
        "--cacert",
        &ca,
        "--cert",
        &fixture("server.crt"),
        "--key",
        &fixture("server.key.insecure"),
    ];
    let no_cn = [
        "--cacert",
        &ca,
        "--cert",
        &fixture("client-nocn.crt"),
        "--key",
        &fixture("client-nocn.key.insecure"),
    ];
    for version in ["--http1.1", "--http2"] {
        let mut flags = vec![version];
        flags.extend(cn_cert);
        exercise_every_family(&base, &flags);
    }
    // Without a client certificate there is no connection at all.
    let refused = curl(&["--cacert", &ca, &format!("{base}/health")]);
    assert_eq!(refused.status, 0, "{refused:?}");

    // Auth on: a request without a token is the certificate's CN, over the gateway as over
    // gRPC; a certificate without a CN is nobody.
    let call = |flags: &[&str], path: &str, json: &str| {
        let url = format!("{base}{path}");
        let mut args = flags.to_vec();
        args.extend([url.as_str(), "-d", json]);
        curl(&args)
    };
    for (path, json) in [
        (
            "/v3/auth/user/add",
            r#"{"name":"root","password":"rootpw"}"#,
        ),
        ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
        (
            "/v3/auth/user/add",
            r#"{"name":"example.com","options":{"no_password":true}}"#,
        ),
        ("/v3/auth/role/add", r#"{"name":"app"}"#),
        (
            "/v3/auth/role/grant",
            &format!(
                r#"{{"name":"app","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                b64("app/"),
                b64("app0")
            ),
        ),
        (
            "/v3/auth/user/grant",
            r#"{"user":"example.com","role":"app"}"#,
        ),
        ("/v3/auth/enable", "{}"),
    ] {
        let a = call(&no_cn, path, json);
        assert_eq!(a.status, 200, "{path}: {a:?}");
    }
    let put = |flags: &[&str], key: &str| {
        call(
            flags,
            "/v3/kv/put",
            &format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), b64("v")),
        )
    };
    assert_eq!(put(&cn_cert, "app/x").status, 200);
    let denied = put(&cn_cert, "other");
    assert_eq!(
        (denied.status, denied.json()),
        (
            403,
            serde_json::json!({"error":"etcdserver: permission denied","message":"etcdserver: permission denied","code":7})
        )
    );
    let nobody = put(&no_cn, "app/y");
    assert_eq!(
        (nobody.status, nobody.json()),
        (
            400,
            serde_json::json!({"error":"etcdserver: user name is empty","message":"etcdserver: user name is empty","code":3})
        )
    );
    let auth = call(
        &no_cn,
        "/v3/auth/authenticate",
        r#"{"name":"root","password":"rootpw"}"#,
    )
    .json();
    let header = format!("Authorization: {}", auth["token"].as_str().unwrap());
    let mut with_token = no_cn.to_vec();
    with_token.extend(["-H", &header]);
    assert_eq!(put(&with_token, "other").status, 200);
}

#[test]
fn auth_with_the_authorization_header() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("m"));
    let url = |p: &str| format!("{}{p}", b.url());
    for (path, json) in [
        (
            "/v3/auth/user/add",
            r#"{"name":"root","password":"rootpw"}"#,
        ),
        ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
        ("/v3/auth/enable", "{}"),
    ] {
        assert_eq!(post(&url(path), json).status, 200);
    }
    let put = format!(r#"{{"key":"{}","value":"{}"}}"#, b64("k"), b64("v"));
    let anonymous = post(&url("/v3/kv/put"), &put);
    assert_eq!(anonymous.status, 400);
    assert_eq!(
        anonymous.json()["message"],
        "etcdserver: user name is empty"
    );
    let wrong = post(
        &url("/v3/auth/authenticate"),
        r#"{"name":"root","password":"nope"}"#,
    );
    assert_eq!(
        wrong.json()["message"],
        "etcdserver: authentication failed, invalid user ID or password"
    );
    let token = ok(&post(
        &url("/v3/auth/authenticate"),
        r#"{"name":"root","password":"rootpw"}"#,
    ))["token"]
        .as_str()
        .unwrap()
        .to_string();
    let with = |header: &str| curl(&["-H", header, &url("/v3/kv/put"), "-d", &put]);
    assert_eq!(with(&format!("Authorization: {token}")).status, 200);
    // grpc-gateway passes Grpc-Metadata-* headers as metadata: the token key works too.
    assert_eq!(with(&format!("Grpc-Metadata-Token: {token}")).status, 200);
    let bogus = with("Authorization: bogus.1");
    assert_eq!(
        (bogus.status, bogus.json()["message"].as_str()),
        (401, Some("etcdserver: invalid auth token"))
    );
    // The watch stream checks the token too: refused in-stream, as etcd's watch refuses.
    let watch = curl(&[
        "--max-time",
        "2",
        &url("/v3/watch"),
        "-d",
        &format!(r#"{{"create_request":{{"key":"{}"}}}}"#, b64("k")),
    ]);
    assert!(watch.body.contains(r#""canceled":true"#), "{watch:?}");
    assert!(watch.body.contains("user name is empty"), "{watch:?}");
}

/// A curl that streams a response: its lines as they come.
struct Stream {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Stream {
    fn start(url: &str, body: &str) -> Stream {
        let mut child = Command::new("curl")
            .args(["-sSN", url, "-d", body])
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Stream { child, lines }
    }

    fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a line within 10 s");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn watch_keepalive_and_observe_stream_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("m"));
    let url = |p: &str| format!("{}{p}", b.url());
    let key = b64("streamed");
    // Two creates in one body, as a stream of JSON values; the body ends at once and the
    // watch goes on.
    let watch = Stream::start(
        &url("/v3/watch"),
        &format!(
            r#"{{"create_request":{{"key":"{key}"}}}} {{"create_request":{{"key":"{key}","prev_kv":true}}}}"#
        ),
    );
    let first = watch.next();
    assert_eq!(first["result"]["created"], true, "{first}");
    let second = watch.next();
    assert_eq!(second["result"]["watch_id"], "1", "{second}");
    for value in ["one", "two"] {
        ok(&post(
            &url("/v3/kv/put"),
            &format!(r#"{{"key":"{key}","value":"{}"}}"#, b64(value)),
        ));
    }
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = watch.next();
        let result = &event["result"];
        seen.push((
            result["watch_id"].as_str().unwrap_or("0").to_string(),
            result["events"][0]["kv"]["value"]
                .as_str()
                .unwrap()
                .to_string(),
        ));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            ("0", b64("one")),
            ("0", b64("two")),
            ("1", b64("one")),
            ("1", b64("two"))
        ]
        .map(|(a, b)| (a.to_string(), b))
    );

    // Keep-alive: one answer per request.
    let id = ok(&post(&url("/v3/lease/grant"), r#"{"TTL":30}"#))["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let k = curl(&[
        &url("/v3/lease/keepalive"),
        "-d",
        &format!(r#"{{"ID":"{id}"}}{{"ID":{id}}}"#),
    ]);
    let lines: Vec<Value> = k
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{k:?}");
    for line in &lines {
        assert_eq!(
            (
                line["result"]["ID"].as_str(),
                line["result"]["TTL"].as_str()
            ),
            (Some(id.as_str()), Some("30"))
        );
    }

    // Observe: the leader now, then each proclamation.
    let lease = ok(&post(&url("/v3/lease/grant"), r#"{"TTL":30}"#))["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let name = b64("observed");
    let leader = ok(&post(
        &url("/v3/election/campaign"),
        &format!(
            r#"{{"name":"{name}","lease":"{lease}","value":"{}"}}"#,
            b64("a")
        ),
    ))["leader"]
        .clone();
    let observe = Stream::start(
        &url("/v3/election/observe"),
        &format!(r#"{{"name":"{name}"}}"#),
    );
    assert_eq!(observe.next()["result"]["kv"]["value"], b64("a"));
    ok(&post(
        &url("/v3/election/proclaim"),
        &format!(r#"{{"leader":{leader},"value":"{}"}}"#, b64("b")),
    ));
    assert_eq!(observe.next()["result"]["kv"]["value"], b64("b"));

    // A server stream of bytes: the snapshot, one `{"result":{"blob":…}}` line per chunk,
    // whose bytes end in the SHA-256 of the rest (etcd's trailer).
    let snapshot = post(&url("/v3/maintenance/snapshot"), "{}");
    assert_eq!(snapshot.status, 200, "{snapshot:?}");
    let mut bytes = Vec::new();
    for line in snapshot.body.lines() {
        use base64::Engine as _;
        let chunk: Value = serde_json::from_str(line).unwrap();
        let blob = chunk["result"]["blob"]
            .as_str()
            .expect("a blob in every chunk");
        bytes.extend(
            base64::engine::general_purpose::STANDARD
                .decode(blob)
                .unwrap(),
        );
    }
    let (db, trailer) = bytes.split_at(bytes.len() - 32);
    use sha2::Digest as _;
    assert_eq!(sha2::Sha256::digest(db).as_slice(), trailer);
}

#[test]
fn metrics_listeners_http_and_https_use_the_client_tls_settings() {
    let dir = tempfile::tempdir().unwrap();
    let (https_port, http_port) = (free_port_below_ephemeral(), free_port_below_ephemeral());
    let metrics_urls = format!("https://127.0.0.1:{https_port},http://127.0.0.1:{http_port}");
    let mut b = Baton::start_on(
        &dir.path().join("m"),
        "https://127.0.0.1:{port}",
        &[
            "--cert-file",
            &fixture("server.crt"),
            "--key-file",
            &fixture("server.key.insecure"),
            "--trusted-ca-file",
            &fixture("ca.crt"),
            "--client-cert-auth",
        ],
    );
    // Baton::start_on adds a plain metrics URL of its own; start again with ours.
    b.extra_args
        .extend(["--listen-metrics-urls".into(), metrics_urls]);
    b.kill9();
    b.spawn();
    let ca = fixture("ca.crt");
    let cert = [
        "--cacert",
        &ca,
        "--cert",
        &fixture("server.crt"),
        "--key",
        &fixture("server.key.insecure"),
    ];
    for (base, flags) in [
        (format!("https://127.0.0.1:{https_port}"), cert.to_vec()),
        (format!("http://127.0.0.1:{http_port}"), vec![]),
        (
            format!("https://127.0.0.1:{}", b.client_port),
            cert.to_vec(),
        ),
    ] {
        for path in ["/health", "/version", "/metrics"] {
            let mut args = flags.clone();
            let url = format!("{base}{path}");
            args.push(&url);
            let a = curl(&args);
            assert_eq!(a.status, 200, "{url}: {a:?}");
        }
    }
    // The https metrics listener asks for a client certificate as the client port does.
    let refused = curl(&[
        "--cacert",
        &ca,
        &format!("https://127.0.0.1:{https_port}/health"),
    ]);
    assert_eq!(refused.status, 0, "{refused:?}");
    // It serves no gateway (etcd's metrics listener neither).
    let mut args = cert.to_vec();
    let url = format!("https://127.0.0.1:{https_port}/v3/kv/range");
    args.extend([url.as_str(), "-d", "{}"]);
    let gw = curl(&args);
    assert_eq!((gw.status, gw.body.as_str()), (404, "404 page not found\n"));
}

#[test]
fn three_members_on_one_host_with_etcds_flags_all_serve() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["infra1", "infra2", "infra3"];
    let client: Vec<u16> = names.iter().map(|_| free_port_below_ephemeral()).collect();
    let peer: Vec<u16> = names.iter().map(|_| free_port_below_ephemeral()).collect();
    let initial = names
        .iter()
        .zip(&peer)
        .map(|(n, p)| format!("{n}=http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    // etcd's own three-member example (its Procfile), ports aside: no --listen-metrics-urls.
    let spawn = |i: usize| {
        let name = names[i];
        {
            let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
            Command::new(env!("CARGO_BIN_EXE_baton"))
                .arg("serve")
                .args(["--name", name])
                .args(["--data-dir", &dir.path().join(name).to_string_lossy()])
                .args([
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{}", client[i]),
                ])
                .args([
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{}", client[i]),
                ])
                .args([
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{}", peer[i]),
                ])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{}", peer[i]),
                ])
                .args(["--initial-cluster-token", "etcd-cluster-1"])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap()
        }
    };
    // One member alone has no leader: etcd 3.4's 503 and Go's http.Error text.
    let mut children = Members(vec![spawn(0)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let alone = loop {
        let h = curl(&[&format!("http://127.0.0.1:{}/health", client[0])]);
        if h.status != 0 {
            break h;
        }
        assert!(Instant::now() < deadline, "the first member never listened");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        (alone.status, alone.body.as_str()),
        (503, "{\"health\":\"false\"}\n")
    );
    children.0.extend([spawn(1), spawn(2)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let healthy = |port: u16| curl(&[&format!("http://127.0.0.1:{port}/health")]);
    for &port in &client {
        loop {
            let h = healthy(port);
            if h.status == 200 {
                assert_eq!(h.body, r#"{"health":"true"}"#);
                break;
            }
            for c in children.0.iter_mut() {
                assert!(
                    c.try_wait().unwrap().is_none(),
                    "a member exited: see {:?}",
                    dir.path()
                );
            }
            assert!(
                Instant::now() < deadline,
                "member on {port} never healthy: {h:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let endpoints = client
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let ctl = etcdctl(&endpoints, &["endpoint", "health"], None);
    assert_eq!(ctl.code, 0, "{ctl:?}");
    for &port in &client {
        let put = post(
            &format!("http://127.0.0.1:{port}/v3/kv/put"),
            &format!(
                r#"{{"key":"{}","value":"{}"}}"#,
                b64(&port.to_string()),
                b64("x")
            ),
        );
        assert_eq!(put.status, 200, "{put:?}");
        let m = curl(&[&format!("http://127.0.0.1:{port}/metrics")]);
        assert_eq!(m.status, 200);
    }
    let all = post(
        &format!("http://127.0.0.1:{}/v3/kv/range", client[0]),
        &format!(r#"{{"key":"{}","range_end":"{}"}}"#, b64("0"), b64("9")),
    );
    assert_eq!(all.json()["count"], "3", "{all:?}");
    for c in children.0.iter_mut() {
        assert!(c.try_wait().unwrap().is_none());
    }
}

/// Member processes, killed when the test ends, however it ends.
struct Members(Vec<std::process::Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
