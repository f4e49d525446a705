//! A member's watcher count, from its `/metrics`: etcd's `Status` carries none, and
//! watches are each member's own (a client watches through the member it is connected to),
//! so each member is asked. This member's own listener is its `--listen-metrics-urls`;
//! other members are asked on their client URLs, where HTTP is served beside gRPC (etcd
//! serves `/metrics` there too), with this member's TLS settings for `https://` ones.
//!
//! An answer that does not come (a member down, a client port without HTTP) is `None`,
//! shown as unknown: the count is worth a glance, not a failed page.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The gauge of registered watchers: Baton's name, then etcd's (whichever the member
/// exports).
const WATCHER_GAUGES: [&str; 2] = ["baton_watchers", "etcd_debugging_mvcc_watcher_total"];
/// The most of a `/metrics` page read (a member's is tens of KiB).
const MAX_METRICS_BYTES: usize = 4 << 20;
/// How long one scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);

/// The watcher count from the first of `urls` that answers, if any does.
pub async fn watchers(urls: &[String], tls: Option<&baton_client::TlsConfig>) -> Option<u64> {
    for url in urls {
        let got = tokio::time::timeout(SCRAPE_TIMEOUT, metrics_text(url, tls)).await;
        if let Ok(Ok(text)) = got {
            if let Some(n) = WATCHER_GAUGES.iter().find_map(|g| sample(&text, g)) {
                return Some(n.max(0.0) as u64);
            }
        }
    }
    None
}

/// The value of the unlabelled sample `name` in Prometheus' text format: the line
/// `name value [timestamp]` (`# HELP`/`# TYPE` lines and labelled samples of other names
/// do not start with `name `). One unlabelled gauge needs no parser.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// `GET <url>/metrics` over HTTP/1.1 (TLS for `https://`), its body.
async fn metrics_text(url: &str, tls: Option<&baton_client::TlsConfig>) -> Result<String, String> {
    let (secure, hostport) = match url.trim_end_matches('/') {
        u if u.starts_with("http://") => (false, &u["http://".len()..]),
        u if u.starts_with("https://") => (true, &u["https://".len()..]),
        u => return Err(format!("{u}: not an http(s) URL")),
    };
    let tcp = tokio::net::TcpStream::connect(hostport)
        .await
        .map_err(|e| e.to_string())?;
    let request = hyper::Request::get("/metrics")
        .header(hyper::header::HOST, hostport)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    if secure {
        let config = client_tls(tls)?;
        let host = hostport
            .rsplit_once(':')
            .map_or(hostport, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = tls
            .and_then(|t| t.server_name.clone())
            .unwrap_or_else(|| host.to_string());
        let name = ServerName::try_from(name).map_err(|e| e.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        get(TokioIo::new(stream), request).await
    } else {
        get(TokioIo::new(tcp), request).await
    }
}

async fn get<T>(io: T, request: hyper::Request<Empty<Bytes>>) -> Result<String, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_METRICS_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
    .await;
    driver.abort();
    result
}

/// rustls' client configuration from the member's settings: its CA (else nothing is
/// trusted: a member's client certificate is checked against a CA, never the system's),
/// its certificate as the client certificate, or any certificate with `--auto-tls`.
fn client_tls(tls: Option<&baton_client::TlsConfig>) -> Result<rustls::ClientConfig, String> {
    let tls = tls.ok_or("https:// without TLS settings")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(baton_tls::AnyServerCertificate::new(
                provider,
            )))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = &tls.ca_file {
            for cert in CertificateDer::pem_file_iter(ca).map_err(|e| e.to_string())? {
                roots
                    .add(cert.map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            }
        }
        builder.with_root_certificates(roots)
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let certs = CertificateDer::pem_file_iter(cert)
                .map_err(|e| e.to_string())?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| e.to_string())?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| e.to_string())
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

#[cfg(test)]
mod tests {
    use super::sample;

    #[test]
    fn the_unlabelled_sample_is_found_and_nothing_else() {
        let text = "# HELP baton_watchers Watchers.\n# TYPE baton_watchers gauge\n\
                    baton_watchers_total{x=\"1\"} 9\nbaton_watchers 3\nother 1\n";
        assert_eq!(sample(text, "baton_watchers"), Some(3.0));
        assert_eq!(
            sample("baton_watchers 2 1700000000000\n", "baton_watchers"),
            Some(2.0)
        );
        assert_eq!(sample(text, "etcd_debugging_mvcc_watcher_total"), None);
        assert_eq!(
            sample("baton_watchers{a=\"b\"} 4\n", "baton_watchers"),
            None
        );
    }
}
