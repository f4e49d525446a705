//! TLS on the client port with etcd's flags, checked with Debian's etcdctl and etcd's own
//! test certificates (`integration/fixtures` of golang-etcd-server-dev, which
//! `scripts/install-deps` installs): `https://` URLs, `--client-cert-auth` with a trusted CA,
//! a revocation list, `http` and `https` on one port, `--auto-tls`, and the refusals.

use crate::common::{baton_cmd, etcdctl, fixture, Baton, Out};

fn server_cert_args() -> Vec<String> {
    vec![
        "--cert-file".into(),
        fixture("server.crt"),
        "--key-file".into(),
        fixture("server.key.insecure"),
    ]
}

/// The server's certificate plus client certificates required from etcd's test CA.
fn mtls_args() -> Vec<String> {
    let mut flags = server_cert_args();
    flags.extend([
        "--trusted-ca-file".into(),
        fixture("ca.crt"),
        "--client-cert-auth".into(),
    ]);
    flags
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// etcdctl over TLS to `https://127.0.0.1:<port>` with `tls` flags.
fn tls_ctl(b: &Baton, tls: &[String], cmd: &[&str]) -> Out {
    let mut all: Vec<&str> = args(tls);
    all.extend_from_slice(cmd);
    etcdctl(&format!("https://127.0.0.1:{}", b.client_port), &all, None)
}

fn ok(out: &Out) -> &str {
    assert_eq!(out.code, 0, "etcdctl failed: {}{}", out.stdout, out.stderr);
    &out.stdout
}

#[test]
fn https_client_urls_serve_etcdctl_over_tls_and_refuse_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start_on(
        &dir.path().join("m"),
        "https://127.0.0.1:{port}",
        &args(&server_cert_args()),
    );
    let ca = vec!["--cacert".to_string(), fixture("ca.crt")];
    assert_eq!(ok(&tls_ctl(&b, &ca, &["put", "k", "v"])).trim(), "OK");
    assert_eq!(
        ok(&tls_ctl(&b, &ca, &["get", "k", "--print-value-only"])).trim(),
        "v"
    );
    // A plain-text client gets nothing from a TLS-only port.
    let plain = etcdctl(&b.url(), &["get", "k"], None);
    assert_ne!(plain.code, 0, "plain text on a TLS port: {plain:?}");
    // Nor does a client that does not trust the server's CA.
    let untrusted = etcdctl(
        &format!("https://127.0.0.1:{}", b.client_port),
        &["--cacert", &fixture("server2.crt"), "get", "k"],
        None,
    );
    assert_ne!(
        untrusted.code, 0,
        "an untrusted server certificate was accepted"
    );
}

#[test]
fn client_cert_auth_takes_only_trusted_unrevoked_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let mut flags = mtls_args();
    flags.extend(["--client-crl-file".into(), fixture("revoke.crl")]);
    let b = Baton::start_on(
        &dir.path().join("m"),
        "https://127.0.0.1:{port}",
        &args(&flags),
    );
    let ca = vec!["--cacert".to_string(), fixture("ca.crt")];
    let no_cert = tls_ctl(&b, &ca, &["put", "k", "v"]);
    assert_ne!(no_cert.code, 0, "a client without a certificate was served");
    let with_cert = [
        ca.clone(),
        vec![
            "--cert".into(),
            fixture("server.crt"),
            "--key".into(),
            fixture("server.key.insecure"),
        ],
    ]
    .concat();
    assert_eq!(
        ok(&tls_ctl(&b, &with_cert, &["put", "k", "v"])).trim(),
        "OK"
    );
    // The revoked certificate (in revoke.crl) is refused.
    let revoked = [
        ca,
        vec![
            "--cert".into(),
            fixture("server-revoked.crt"),
            "--key".into(),
            fixture("server-revoked.key.insecure"),
        ],
    ]
    .concat();
    let out = tls_ctl(&b, &revoked, &["get", "k"]);
    assert_ne!(out.code, 0, "a revoked client certificate was served");
    let log = b.log();
    assert!(
        !log.contains("BEGIN"),
        "key or certificate material in the log"
    );
}

/// etcd's `CommonName-root.crt` is a self-signed `CA:TRUE` certificate; its e2e suite uses
/// it as the server's certificate, the client's and the trusted CA at once. Go accepts a
/// client certificate that is itself a trust anchor, webpki alone does not: Baton accepts
/// it exactly when it is one of `--trusted-ca-file`'s certificates and not revoked.
#[test]
fn a_trusted_ca_certificate_is_accepted_as_its_own_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (root, key) = (
        fixture("CommonName-root.crt"),
        fixture("CommonName-root.key"),
    );
    let own = |extra: &[String]| {
        let mut flags: Vec<String> = vec![
            "--cert-file".into(),
            root.clone(),
            "--key-file".into(),
            key.clone(),
            "--trusted-ca-file".into(),
            root.clone(),
            "--client-cert-auth".into(),
        ];
        flags.extend_from_slice(extra);
        flags
    };
    let as_root: Vec<String> = ["--cacert", &root, "--cert", &root, "--key", &key]
        .map(String::from)
        .to_vec();
    let b = Baton::start_on(
        &dir.path().join("anchor"),
        "https://127.0.0.1:{port}",
        &args(&own(&[])),
    );
    assert_eq!(ok(&tls_ctl(&b, &as_root, &["put", "k", "v"])).trim(), "OK");
    assert_eq!(
        ok(&tls_ctl(&b, &as_root, &["get", "k", "--print-value-only"])).trim(),
        "v"
    );
    drop(b);

    // Where it is not a trust anchor, a CA certificate is no client certificate.
    let other = Baton::start_on(
        &dir.path().join("other-ca"),
        "https://127.0.0.1:{port}",
        &args(&mtls_args()),
    );
    let foreign = [
        vec!["--cacert".to_string(), fixture("ca.crt")],
        as_root[2..].to_vec(),
    ]
    .concat();
    let out = tls_ctl(&other, &foreign, &["get", "k"]);
    assert_ne!(out.code, 0, "a CA certificate from another CA was served");
    drop(other);

    // Revoked by serial in --client-crl-file, it is refused like any revoked certificate.
    let crl = revocation_list_of_itself(dir.path(), &root, &key);
    let revoked = Baton::start_on(
        &dir.path().join("revoked"),
        "https://127.0.0.1:{port}",
        &args(&own(&["--client-crl-file".to_string(), crl])),
    );
    let out = tls_ctl(&revoked, &as_root, &["get", "k"]);
    assert_ne!(out.code, 0, "a revoked anchor certificate was served");
}

/// A CRL signed by the self-signed `cert` revoking `cert` itself, made with the openssl
/// command (`openssl ca` needs a database file and a config).
fn revocation_list_of_itself(dir: &std::path::Path, cert: &str, key: &str) -> String {
    let ca = dir.join("openssl-ca");
    std::fs::create_dir_all(&ca).unwrap();
    std::fs::write(ca.join("index.txt"), "").unwrap();
    std::fs::write(ca.join("crlnumber"), "01\n").unwrap();
    // A CRL number (and so a v2 CRL, the only version webpki reads) and the issuer's key id.
    std::fs::write(
        ca.join("ca.cnf"),
        format!(
            "[ca]\ndefault_ca = own\n[own]\ndatabase = {db}\ncrlnumber = {n}\n\
             default_md = sha256\ndefault_crl_days = 30\ncrl_extensions = crl_ext\n\
             [crl_ext]\nauthorityKeyIdentifier = keyid:always\n",
            db = ca.join("index.txt").display(),
            n = ca.join("crlnumber").display(),
        ),
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("the openssl command (Debian's openssl) is needed");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let cnf = ca.join("ca.cnf").display().to_string();
    let crl = ca.join("self.crl").display().to_string();
    openssl(&[
        "ca", "-config", &cnf, "-keyfile", key, "-cert", cert, "-revoke", cert,
    ]);
    openssl(&[
        "ca", "-config", &cnf, "-keyfile", key, "-cert", cert, "-gencrl", "-out", &crl,
    ]);
    crl
}

#[test]
fn one_port_serves_http_and_https() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start_on(
        &dir.path().join("m"),
        "http://127.0.0.1:{port},https://127.0.0.1:{port}",
        &args(&server_cert_args()),
    );
    ok(&etcdctl(&b.url(), &["put", "plain", "1"], None));
    let ca = vec!["--cacert".to_string(), fixture("ca.crt")];
    assert_eq!(
        ok(&tls_ctl(&b, &ca, &["get", "plain", "--print-value-only"])).trim(),
        "1"
    );
}

#[test]
fn auto_tls_serves_a_self_signed_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let b = Baton::start_on(&data, "https://127.0.0.1:{port}", &["--auto-tls"]);
    assert!(data.join("fixtures/client/cert.pem").exists());
    let skip = vec![
        "--insecure-transport=false".to_string(),
        "--insecure-skip-tls-verify".to_string(),
    ];
    assert_eq!(ok(&tls_ctl(&b, &skip, &["put", "a", "b"])).trim(), "OK");
    // The self-signed certificate is not trusted by a client that verifies.
    let verify = tls_ctl(
        &b,
        &["--cacert".to_string(), fixture("ca.crt")],
        &["get", "a"],
    );
    assert_ne!(verify.code, 0);
}

#[test]
fn tls_flags_that_cannot_work_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![], "need --cert-file and --key-file"),
        (
            [server_cert_args(), vec!["--client-cert-auth".into()]].concat(),
            "--client-cert-auth needs --trusted-ca-file",
        ),
        (
            [
                server_cert_args(),
                vec!["--cipher-suites".into(), "TLS_NO_SUCH_SUITE".into()],
            ]
            .concat(),
            "unknown cipher suite",
        ),
        (
            vec![
                "--cert-file".into(),
                fixture("server.crt"),
                "--key-file".into(),
                fixture("server.crt"),
            ],
            "--key-file",
        ),
    ];
    for (i, (flags, want)) in cases.into_iter().enumerate() {
        let out = baton_cmd()
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join(format!("d{i}")))
            .arg("--listen-client-urls")
            .arg("https://127.0.0.1:0")
            .args(&flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} started");
        assert!(stderr.contains(want), "case {i}: want {want:?} in {stderr}");
    }
}

/// `baton`'s own commands (baton-client) with etcdctl's TLS flags, against a server that
/// requires client certificates: an endpoint without a scheme becomes `https://`.
#[test]
fn the_baton_cli_speaks_tls_with_etcdctls_flags() {
    let dir = tempfile::tempdir().unwrap();
    let flags = mtls_args();
    let b = Baton::start_on(
        &dir.path().join("m"),
        "https://127.0.0.1:{port}",
        &args(&flags),
    );
    let run = |extra: &[&str], cmd: &[&str]| {
        let out = baton_cmd()
            .args(["kv"])
            .args(cmd)
            .arg("--endpoints")
            .arg(b.endpoint())
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ca, cert, key) = (
        fixture("ca.crt"),
        fixture("server.crt"),
        fixture("server.key.insecure"),
    );
    let full = ["--cacert", &ca, "--cert", &cert, "--key", &key];
    let (ok_put, out) = run(&full, &["put", "tls-key", "tls-value"]);
    assert!(ok_put, "{out}");
    let (ok_get, out) = run(&full, &["get", "tls-key", "-o", "simple"]);
    assert!(ok_get && out.contains("tls-value"), "{out}");
    // Without the client certificate the server refuses the handshake. (The error names
    // the TLS alert when the refusal reaches the call with its cause, which HTTP/2 does not
    // always keep: a call that was pending when the connection died is just "canceled".)
    let (refused, out) = run(&["--cacert", &ca], &["get", "tls-key"]);
    assert!(!refused, "served without a client certificate: {out}");
    // --insecure-skip-tls-verify: no CA needed to reach the server (with a certificate).
    let skip = ["--insecure-skip-tls-verify", "--cert", &cert, "--key", &key];
    let (ok_skip, out) = run(&skip, &["get", "tls-key", "-o", "simple"]);
    assert!(ok_skip && out.contains("tls-value"), "{out}");
    // Without it (and without the CA), the server's certificate is not trusted.
    let (untrusted, out) = run(&["--cert", &cert, "--key", &key], &["get", "tls-key"]);
    assert!(!untrusted, "{out}");
    // A certificate without its key is a usage error, caught before connecting.
    let (usage, _) = run(&["--cacert", &ca, "--cert", &cert], &["get", "tls-key"]);
    assert!(!usage);
}
