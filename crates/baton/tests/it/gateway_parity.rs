//! Bad input on the JSON gateway answered as etcd 3.4 answers it: each request goes to a real
//! `baton serve` and to a real etcd 3.4.23 (`/usr/bin/etcd`), and the two answers must be
//! equal — HTTP status and body, with ids, revisions and terms masked — and nothing changes
//! on either (the revision before and after the bad requests is the same). Covered: malformed
//! JSON, wrong types, unknown fields, a body over the request limit, bad base64, unknown
//! paths and prefixes, wrong methods, and with auth on a missing or bogus token.

use serde_json::Value;

use crate::common::{Baton, Etcd};
use crate::gateway::{curl, Answer};

/// What is compared: the status and the body, JSON with its volatile numbers masked.
fn comparable(a: &Answer) -> (u16, String) {
    let body = match serde_json::from_str::<Value>(&a.body) {
        Ok(mut v) => {
            mask(&mut v);
            v.to_string()
        }
        Err(_) => a.body.clone(),
    };
    (a.status, body)
}

fn mask(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if matches!(
                    k.as_str(),
                    "cluster_id" | "member_id" | "revision" | "raft_term" | "ID"
                ) {
                    *v = Value::from("*");
                } else {
                    mask(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask),
        _ => {}
    }
}

struct Pair {
    _dir: tempfile::TempDir,
    _baton: Baton,
    _etcd: Etcd,
    baton: String,
    etcd: String,
}

fn pair() -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::start(&dir.path().join("b"));
    let etcd = Etcd::start();
    let (b, e) = (baton.url(), format!("http://{}", etcd.endpoint()));
    // etcd answers its gateway once it has a leader.
    for _ in 0..100 {
        if curl(&[&format!("{e}/health")]).status == 200 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Pair {
        _dir: dir,
        _baton: baton,
        _etcd: etcd,
        baton: b,
        etcd: e,
    }
}

/// One request: method, path, body, extra curl arguments.
type Case<'a> = (&'a str, &'a str, String, Vec<String>);

impl Pair {
    /// Sends `case` to both and asserts equal answers; returns etcd's.
    fn same(&self, (method, path, body, extra): &Case<'_>) -> (u16, String) {
        // A large body goes through a file (an argument list has a limit).
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), body).unwrap();
        let data = format!("@{}", file.path().display());
        let ask = |base: &str| {
            let url = format!("{base}{path}");
            let mut args: Vec<&str> = vec!["-X", method, &url];
            if !body.is_empty() {
                args.extend(["--data-binary", data.as_str()]);
            }
            args.extend(extra.iter().map(String::as_str));
            comparable(&curl(&args))
        };
        let (etcd, baton) = (ask(&self.etcd), ask(&self.baton));
        assert_eq!(
            baton,
            etcd,
            "{method} {path} {}",
            &body[..body.len().min(200)]
        );
        etcd
    }

    /// The revision on both (a range of a key nobody writes).
    fn revisions(&self) -> (String, String) {
        let rev = |base: &str| {
            let a = curl(&[&format!("{base}/v3/kv/range"), "-d", r#"{"key":"cmV2"}"#]);
            a.json()["header"]["revision"].as_str().unwrap().to_string()
        };
        (rev(&self.baton), rev(&self.etcd))
    }
}

fn post(path: &str, body: &str) -> Case<'static> {
    ("POST", leak(path), body.to_string(), Vec::new())
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn base64_value(len: usize) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(vec![b'x'; len])
}

#[test]
fn bad_input_gets_etcds_status_and_body_and_changes_nothing() {
    let p = pair();
    let before = p.revisions();
    let mut cases: Vec<Case<'_>> = Vec::new();
    // Malformed JSON.
    for body in [
        r#"{"key":"Zm9v","value":"YmFy""#,
        r#"{"key":"Zm9v" "value":"YmFy"}"#,
        "nonsense",
        r#"{"key":"Zm9v",}"#,
        "[1,]",
        r#"{"key":"\q"}"#,
        "{\"key\":\"a\u{1}b\"}",
        r#"{"key":tru}"#,
        r#"{"key":-}"#,
    ] {
        cases.push(post("/v3/kv/put", body));
    }
    // Wrong types.
    for body in [
        "[]",
        r#""x""#,
        r#"{"key":5}"#,
        r#"{"key":"Zm9v","lease":"abc"}"#,
        r#"{"key":"Zm9v","lease":1.5}"#,
        r#"{"key":"Zm9v","lease":true}"#,
        r#"{"key":"Zm9v","lease":"1e3"}"#,
        r#"{"key":"Zm9v","lease":99999999999999999999}"#,
        r#"{"key":"Zm9v","prev_kv":"yes"}"#,
        r#"{"key":"Zm9v","prev_kv":1}"#,
        r#"{"key":{"a":1}}"#,
    ] {
        cases.push(post("/v3/kv/put", body));
    }
    for body in [
        r#"{"key":"Zm9v","sort_order":"BOGUS"}"#,
        r#"{"key":"Zm9v","sort_order":true}"#,
        r#"{"limit":"z","key":5}"#,
        r#"{"key":"Zm9v","keysOnly":"x"}"#,
    ] {
        cases.push(post("/v3/kv/range", body));
    }
    for body in [
        r#"{"compare":{"key":"Zm9v"}}"#,
        r#"{"compare":[5]}"#,
        r#"{"compare":[{"key":"Zm9v","create_revision":"x"}]}"#,
        r#"{"success":[{"request_put":[]}]}"#,
    ] {
        cases.push(post("/v3/kv/txn", body));
    }
    cases.push(post("/v3/lease/revoke", r#"{"ID":"nope"}"#));
    cases.push(post("/v3/election/proclaim", r#"{"value":"djI="}"#));
    cases.push(post("/v3/election/resign", "{}"));
    // The first message of a stream: Go's error as is (Unknown, 500).
    cases.push(post("/v3/watch", r#"{"create_request":{"key":5}}"#));
    cases.push(post("/v3/watch", r#"{"create_request":"#));
    cases.push(post("/v3/lease/keepalive", r#"{"ID":"x"}"#));
    // Bad base64.
    for key in [
        "!!!",
        "Zm9",
        "Zm9vYg",
        "Zm9vYg=",
        "Zm9vYg=x",
        "Zm-v",
        "Zm9v=====",
        "Zm9vYmFyYmF6YQ",
    ] {
        cases.push(post(
            "/v3/kv/put",
            &format!(r#"{{"key":"{key}","value":"YmFy"}}"#),
        ));
    }
    // Over the request limit: grpc-go's refusal of the encoded message, and etcd's own.
    cases.push(post(
        "/v3/kv/put",
        &format!(r#"{{"key":"Zm9v","value":"{}"}}"#, base64_value(2 << 20)),
    ));
    cases.push(post(
        "/v3/kv/put",
        &format!(
            r#"{{"key":"Zm9v","value":"{}"}}"#,
            base64_value((1 << 20) + 600_000)
        ),
    ));
    // Unknown paths and prefixes, wrong methods.
    for path in [
        "/v3/nope",
        "/nope",
        "/v3alpha/kv/range",
        "/v3/kv/put/",
        "/v3/kv",
        "/v3/",
        "/v3/auth/status",
        "/v3/kv/put:x",
    ] {
        cases.push(post(path, "{}"));
    }
    for (method, path) in [
        ("GET", "/v3/kv/range"),
        ("PUT", "/v3/kv/put"),
        ("DELETE", "/v3beta/kv/put"),
        ("POST", "/health"),
        ("POST", "/version"),
        ("POST", "/v3"),
    ] {
        cases.push((method, path, String::new(), Vec::new()));
    }
    for case in &cases {
        p.same(case);
    }
    assert_eq!(p.revisions(), before, "bad input changed something");

    // Accepted with something odd in it: unknown fields ignored, trailing data never read,
    // an empty body the empty request, /v3beta the same as /v3.
    for case in [
        post(
            "/v3/kv/put",
            r#"{"key":"Zm9v","value":"YmFy","bogus":{"x":[1,null]}}"#,
        ),
        post("/v3/kv/put", r#"{"key":"Zm9v"} trailing"#),
        post(
            "/v3beta/kv/range",
            r#"{"key":"Zm9v","sortOrder":"DESCEND","limit":"1"}"#,
        ),
        post("/v3/kv/range", ""),
        post("/v3/kv/range", "null"),
        post("/v3/lease/grant", r#"{"TTL":"30","ttl":5}"#),
        post(
            "/v3/kv/txn",
            r#"{"compare":[{"result":0,"target":1,"key":"Zm9v","TargetUnion":null}],"success":[{"Request":{"RequestPut":{"key":"Zm9v","value":"YmFy"}}}]}"#,
        ),
    ] {
        p.same(&case);
    }

    // Auth on: no token, a bogus one, a good one.
    for (path, body) in [
        ("/v3/auth/user/add", r#"{"name":"root","password":"pw"}"#),
        ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
        ("/v3/auth/enable", "{}"),
    ] {
        assert_eq!(p.same(&post(path, body)).0, 200);
    }
    let put = r#"{"key":"YXV0aA==","value":"djE="}"#;
    let before = curl(&[
        &format!("{}/v3/auth/authenticate", p.baton),
        "-d",
        r#"{"name":"root","password":"pw"}"#,
    ]);
    assert_eq!(before.status, 200);
    for case in [
        post("/v3/kv/put", put),
        post("/v3/kv/range", r#"{"key":"YXV0aA=="}"#),
        (
            "POST",
            "/v3/kv/put",
            put.to_string(),
            vec!["-H".into(), "Authorization: bogus".into()],
        ),
        post(
            "/v3/auth/authenticate",
            r#"{"name":"root","password":"wrong"}"#,
        ),
    ] {
        p.same(&case);
    }
}
