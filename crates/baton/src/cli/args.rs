//! Arguments the client commands share: where Baton is, how to reach it over TLS, and
//! durations as people write them.

use std::path::PathBuf;
use std::time::Duration;

use baton_client::{ClientConfig, TlsConfig};
use clap::Args;

/// Where to find Baton. Shared by the client commands.
#[derive(Args, Debug, Clone)]
pub struct EndpointArgs {
    /// Comma-separated gRPC endpoints (host:port or http://host:port), tried in order until
    /// one accepts a connection.
    #[arg(
        long,
        env = "BATON_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub user: CredentialArgs,
}

impl EndpointArgs {
    /// A client configuration for `endpoints` with these flags' TLS settings and user.
    pub fn config(&self, endpoints: Vec<String>) -> ClientConfig {
        self.user
            .apply(self.tls.apply(ClientConfig::new(endpoints)))
    }
}

/// etcdctl's `--user` and `--password`.
#[derive(Args, Debug, Clone, Default)]
pub struct CredentialArgs {
    /// Authenticate as this user, `name` or `name:password` (etcdctl's `--user`); the
    /// password may come from `--password` instead.
    #[arg(long, value_name = "NAME[:PASSWORD]", global = true)]
    pub user: Option<String>,
    /// The `--user`'s password (etcdctl's `--password`).
    #[arg(long, value_name = "PASSWORD", global = true, requires = "user")]
    pub password: Option<String>,
}

impl CredentialArgs {
    /// `config` authenticating as the user, if one is given: `--user name:password`, or
    /// `--user name --password password` (etcdctl splits at the first `:`; a user given
    /// without a password is authenticated with an empty one).
    pub fn apply(&self, config: ClientConfig) -> ClientConfig {
        let Some(user) = &self.user else {
            return config;
        };
        let (name, password) = match (&self.password, user.split_once(':')) {
            (Some(p), _) => (user.clone(), p.clone()),
            (None, Some((name, p))) => (name.to_string(), p.to_string()),
            (None, None) => (user.clone(), String::new()),
        };
        config.with_user(name, password)
    }
}

/// etcdctl's TLS flags. Any of them makes endpoints without a scheme `https://`.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Verify the server's TLS certificate with this CA bundle (PEM) [default: the
    /// system's roots].
    #[arg(long, id = "tls_cacert", value_name = "FILE", global = true)]
    pub cacert: Option<PathBuf>,
    /// Client certificate (PEM), for servers that require one (`--client-cert-auth`).
    // The ids are not the flag names: `key` is also a positional of `baton kv put`.
    #[arg(
        long = "cert",
        id = "tls_cert",
        value_name = "FILE",
        global = true,
        requires = "tls_key"
    )]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long = "key",
        id = "tls_key",
        value_name = "FILE",
        global = true,
        requires = "tls_cert"
    )]
    pub key: Option<PathBuf>,
    /// Accept any server certificate (etcdctl's flag): still encrypted, but to whoever
    /// answers. For self-signed (`--auto-tls`) servers in tests only.
    #[arg(long, global = true)]
    pub insecure_skip_tls_verify: bool,
}

impl TlsArgs {
    /// `config` with these TLS settings, if any flag is given.
    pub fn apply(&self, config: ClientConfig) -> ClientConfig {
        if self.cacert.is_none()
            && self.cert.is_none()
            && self.key.is_none()
            && !self.insecure_skip_tls_verify
        {
            return config;
        }
        let mut tls = TlsConfig::new();
        tls.ca_file = self.cacert.clone();
        tls.cert_file = self.cert.clone();
        tls.key_file = self.key.clone();
        tls.insecure_skip_verify = self.insecure_skip_tls_verify;
        config.with_tls(tls)
    }
}

/// Parses a human duration: `10` or `1.5` (seconds), `500ms`, `2s`, `1m`.
///
/// Plain numbers are seconds so `--timeout 30` means what etcdctl users expect; the suffixes
/// exist because lock-delays and grace periods are often sub-second.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 10, 1.5, 500ms, 2s, 1m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}': a duration cannot be negative"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("").is_err());
    }
}
