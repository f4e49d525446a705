//! Who a request comes from, and the tokens that say it (etcd's `--auth-token`).
//!
//! The replicated part of auth (users, roles, the flag, simple tokens) is the core's
//! (`baton_core::auth`); this module holds what must stay out of a deterministic state
//! machine: bcrypt (hashing before a user is proposed, checking a password before
//! `Authenticate` is), the random part of a simple token, each member's clock on a simple
//! token's TTL, JWT signing and verification, and reading a client certificate's common
//! name.
//!
//! A request's identity is, in etcd's order (`AuthInfoFromCtx`, then `AuthInfoFromTLS`):
//! the `token` metadata (a simple token must be in the core's table and within its TTL on
//! this member; a JWT must verify with the configured key and not be expired), else the
//! common name of a verified client certificate, else nobody.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_core::{AuthInfo, StateMachine};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;

use crate::conn::ClientConnectInfo;

/// etcd's `--auth-token-ttl` default: a simple token unused this long is invalid.
pub const DEFAULT_SIMPLE_TOKEN_TTL: Duration = Duration::from_secs(300);
/// etcd's default `ttl` of a JWT.
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(300);
/// etcd's `--bcrypt-cost` default (`bcrypt.DefaultCost`).
pub const DEFAULT_BCRYPT_COST: u32 = 10;
/// The metadata key etcd's clients send their token under (`authorization` is the other),
/// parsed once: every call is identified, and a lookup by `&str` parses the name each time.
const TOKEN_HEADER: http::HeaderName = http::HeaderName::from_static("token");
/// Length of a simple token's random part, from etcd's alphabet (`simple_token.go`).
const SIMPLE_TOKEN_LENGTH: usize = 16;
const SIMPLE_TOKEN_LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// Simple tokens whose TTL this member tracks before expired ones are swept.
const KEEPER_SWEEP_AT: usize = 2 * baton_core::MAX_SIMPLE_TOKENS;

/// Why `--auth-token` (or its key files) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("--auth-token: unknown token type {0:?} (simple or jwt)")]
    UnknownType(String),
    #[error("--auth-token: bad option {0:?}")]
    BadOption(String),
    #[error("--auth-token jwt: missing {0}")]
    Missing(&'static str),
    #[error("--auth-token jwt: unsupported sign-method {0:?}")]
    SignMethod(String),
    #[error("--auth-token jwt: cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("--auth-token jwt: {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("--bcrypt-cost {0}: bcrypt takes 4 to 31")]
    BcryptCost(u32),
}

/// How tokens are made and checked.
#[derive(Clone)]
pub enum TokenKind {
    /// etcd's `simple`: `<16 random letters>.<index>`, replicated, valid while used within
    /// `ttl` on the member asked.
    Simple {
        ttl: Duration,
    },
    Jwt(Arc<Jwt>),
}

/// A JWT signer/verifier (etcd's `jwt.go`): claims `username`, `revision`, `exp`.
pub struct Jwt {
    algorithm: Algorithm,
    /// `None`: verify-only (no `priv-key`), as etcd allows.
    encoding: Option<EncodingKey>,
    decoding: DecodingKey,
    ttl: Duration,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

/// The server's auth configuration and its node-local state (the simple tokens' TTLs).
/// Cheap to clone: every service holds the same one.
#[derive(Clone)]
pub struct Authenticator {
    tokens: TokenKind,
    bcrypt_cost: u32,
    keeper: Arc<Mutex<HashMap<String, Instant>>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.tokens {
            TokenKind::Simple { ttl } => format!("simple(ttl={ttl:?})"),
            TokenKind::Jwt(j) => format!("jwt({:?}, ttl={:?})", j.algorithm, j.ttl),
        };
        f.debug_struct("Authenticator")
            .field("tokens", &kind)
            .field("bcrypt_cost", &self.bcrypt_cost)
            .finish()
    }
}

impl Default for Authenticator {
    fn default() -> Self {
        Authenticator::new(
            TokenKind::Simple {
                ttl: DEFAULT_SIMPLE_TOKEN_TTL,
            },
            DEFAULT_BCRYPT_COST,
        )
    }
}

/// What resolving a request's identity can fail with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityError {
    /// etcd's `ErrInvalidAuthToken`: unknown, expired, tampered or foreign.
    InvalidToken,
}

impl Authenticator {
    pub fn new(tokens: TokenKind, bcrypt_cost: u32) -> Self {
        Authenticator {
            tokens,
            bcrypt_cost,
            keeper: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// From etcd's flags: `--auth-token` (`simple`, or `jwt,pub-key=…,priv-key=…,
    /// sign-method=…[,ttl=…]`), `--auth-token-ttl` (simple tokens) and `--bcrypt-cost`.
    pub fn from_flags(
        auth_token: &str,
        simple_ttl: Duration,
        bcrypt_cost: u32,
    ) -> Result<Self, AuthConfigError> {
        if !(4..=31).contains(&bcrypt_cost) {
            return Err(AuthConfigError::BcryptCost(bcrypt_cost));
        }
        let mut parts = auth_token.split(',');
        let kind = parts.next().unwrap_or_default();
        let tokens = match kind {
            "simple" => TokenKind::Simple { ttl: simple_ttl },
            "jwt" => TokenKind::Jwt(Arc::new(Jwt::from_options(parts)?)),
            other => return Err(AuthConfigError::UnknownType(other.to_string())),
        };
        Ok(Authenticator::new(tokens, bcrypt_cost))
    }

    /// A bcrypt hash of `password` at the configured cost. Slow (~50 ms at cost 10): call
    /// it off the runtime's workers.
    pub fn hash_password(&self, password: &str) -> Result<String, bcrypt::BcryptError> {
        bcrypt::hash(password, self.bcrypt_cost)
    }

    /// Whether `password` matches `hash` (constant-time inside bcrypt). Slow as hashing.
    pub fn password_matches(password: &str, hash: &str) -> bool {
        bcrypt::verify(password, hash).unwrap_or(false)
    }

    /// The random part of a simple token, drawn from `random` bytes (the replica's
    /// randomness seam); `None` with JWT tokens.
    pub fn simple_token_prefix(&self, random: &[u8]) -> Option<String> {
        match self.tokens {
            TokenKind::Simple { .. } => Some(
                random
                    .iter()
                    .take(SIMPLE_TOKEN_LENGTH)
                    .map(|b| SIMPLE_TOKEN_LETTERS[*b as usize % SIMPLE_TOKEN_LETTERS.len()] as char)
                    .collect(),
            ),
            TokenKind::Jwt(_) => None,
        }
    }

    /// Random bytes [`Self::simple_token_prefix`] needs.
    pub const RANDOM_BYTES: usize = SIMPLE_TOKEN_LENGTH;

    /// The token to hand out after `Authenticate` applied: the core's simple token (its
    /// TTL starts now on this member), or a JWT signed now (`now_ms`: wall clock).
    pub fn issue(
        &self,
        user: &str,
        revision: u64,
        simple: Option<String>,
        now_ms: u64,
    ) -> Result<String, String> {
        match (&self.tokens, simple) {
            (TokenKind::Simple { ttl }, Some(token)) => {
                self.keep(&token, *ttl);
                Ok(token)
            }
            (TokenKind::Jwt(jwt), _) => jwt.sign(user, revision, now_ms),
            (TokenKind::Simple { .. }, None) => Err("no simple token was issued".into()),
        }
    }

    fn keep(&self, token: &str, ttl: Duration) {
        let now = Instant::now();
        let mut keeper = self.keeper.lock().expect("keeper lock");
        if keeper.len() >= KEEPER_SWEEP_AT {
            keeper.retain(|_, deadline| *deadline > now);
        }
        keeper.insert(token.to_string(), now + ttl);
    }

    /// The identity of a request with `metadata` over `conn`, against `sm` (the auth store
    /// as applied here) at wall time `now_ms`.
    pub fn identify(
        &self,
        sm: &StateMachine,
        now_ms: u64,
        metadata: &MetadataMap,
        conn: Option<&ClientConnectInfo>,
    ) -> Result<Option<AuthInfo>, IdentityError> {
        let headers: &http::HeaderMap = metadata.as_ref();
        let token = headers
            .get(TOKEN_HEADER)
            .or_else(|| headers.get(http::header::AUTHORIZATION))
            .and_then(|v| v.to_str().ok());
        if let Some(token) = token {
            return self.identify_token(sm, now_ms, token).map(Some);
        }
        Ok(conn
            .and_then(|c| c.peer_certs.as_ref())
            .and_then(|certs| certs.first())
            .and_then(|leaf| baton_tls::common_name(leaf))
            .map(|user| AuthInfo {
                user,
                revision: sm.auth_revision(),
            }))
    }

    fn identify_token(
        &self,
        sm: &StateMachine,
        now_ms: u64,
        token: &str,
    ) -> Result<AuthInfo, IdentityError> {
        match &self.tokens {
            TokenKind::Simple { ttl } => {
                let user = sm
                    .simple_token_user(token)
                    .ok_or(IdentityError::InvalidToken)?;
                let now = Instant::now();
                let mut keeper = self.keeper.lock().expect("keeper lock");
                match keeper.get_mut(token) {
                    Some(deadline) if *deadline <= now => {
                        keeper.remove(token);
                        return Err(IdentityError::InvalidToken);
                    }
                    Some(deadline) => *deadline = now + *ttl,
                    // Issued through another member (or before a restart): its TTL starts
                    // when this member first sees it.
                    None => {
                        drop(keeper);
                        self.keep(token, *ttl);
                    }
                }
                Ok(AuthInfo {
                    user: user.to_string(),
                    revision: sm.auth_revision(),
                })
            }
            TokenKind::Jwt(jwt) => jwt.verify(token, now_ms),
        }
    }
}

impl Jwt {
    fn from_options<'a>(options: impl Iterator<Item = &'a str>) -> Result<Self, AuthConfigError> {
        let (mut public, mut private, mut method, mut ttl) = (None, None, None, DEFAULT_JWT_TTL);
        for opt in options {
            let (k, v) = opt
                .split_once('=')
                .ok_or_else(|| AuthConfigError::BadOption(opt.to_string()))?;
            match k {
                "pub-key" => public = Some(v.to_string()),
                "priv-key" => private = Some(v.to_string()),
                "sign-method" => method = Some(v.to_string()),
                "ttl" => {
                    ttl = parse_go_duration(v)
                        .ok_or_else(|| AuthConfigError::BadOption(opt.to_string()))?
                }
                _ => return Err(AuthConfigError::BadOption(opt.to_string())),
            }
        }
        let method = method.ok_or(AuthConfigError::Missing("sign-method"))?;
        let algorithm = match method.as_str() {
            "RS256" => Algorithm::RS256,
            "RS384" => Algorithm::RS384,
            "RS512" => Algorithm::RS512,
            "PS256" => Algorithm::PS256,
            "PS384" => Algorithm::PS384,
            "PS512" => Algorithm::PS512,
            "ES256" => Algorithm::ES256,
            "ES384" => Algorithm::ES384,
            "EdDSA" => Algorithm::EdDSA,
            other => return Err(AuthConfigError::SignMethod(other.to_string())),
        };
        let public = public.ok_or(AuthConfigError::Missing("pub-key"))?;
        let decoding = decoding_key(algorithm, &public)?;
        let encoding = match private {
            None => None,
            Some(path) => Some(encoding_key(algorithm, &path)?),
        };
        Ok(Jwt {
            algorithm,
            encoding,
            decoding,
            ttl,
        })
    }

    fn sign(&self, user: &str, revision: u64, now_ms: u64) -> Result<String, String> {
        let key = self
            .encoding
            .as_ref()
            .ok_or("auth: token signing attempted with verify-only key")?;
        let claims = Claims {
            username: user.to_string(),
            revision,
            exp: now_ms / 1000 + self.ttl.as_secs().max(1),
        };
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key).map_err(|e| e.to_string())
    }

    /// The signature, the algorithm and the expiry (against the replica's wall clock, not
    /// the library's) must all hold.
    fn verify(&self, token: &str, now_ms: u64) -> Result<AuthInfo, IdentityError> {
        let mut validation = Validation::new(self.algorithm);
        validation.validate_exp = false;
        validation.required_spec_claims.clear();
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map_err(|_| IdentityError::InvalidToken)?;
        if data.claims.exp * 1000 <= now_ms {
            return Err(IdentityError::InvalidToken);
        }
        Ok(AuthInfo {
            user: data.claims.username,
            revision: data.claims.revision,
        })
    }
}

fn read(path: &str) -> Result<Vec<u8>, AuthConfigError> {
    std::fs::read(path).map_err(|source| AuthConfigError::Read {
        path: path.to_string(),
        source,
    })
}

/// etcd takes a public key or a certificate (whose key it uses) as `pub-key`.
fn decoding_key(algorithm: Algorithm, path: &str) -> Result<DecodingKey, AuthConfigError> {
    let pem = read(path)?;
    let bad = |reason: String| AuthConfigError::Key {
        path: path.to_string(),
        reason,
    };
    let text = String::from_utf8_lossy(&pem);
    if text.contains("BEGIN CERTIFICATE") {
        let (_, block) = x509_parser::pem::parse_x509_pem(&pem).map_err(|e| bad(e.to_string()))?;
        let cert = block.parse_x509().map_err(|e| bad(e.to_string()))?;
        let key = cert.public_key().subject_public_key.data.to_vec();
        return Ok(match algorithm {
            Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_der(&key),
            Algorithm::EdDSA => DecodingKey::from_ed_der(&key),
            _ => DecodingKey::from_rsa_der(&key),
        });
    }
    match algorithm {
        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => DecodingKey::from_ed_pem(&pem),
        _ => DecodingKey::from_rsa_pem(&pem),
    }
    .map_err(|e| bad(e.to_string()))
}

fn encoding_key(algorithm: Algorithm, path: &str) -> Result<EncodingKey, AuthConfigError> {
    let pem = read(path)?;
    match algorithm {
        Algorithm::ES256 | Algorithm::ES384 => EncodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
        _ => EncodingKey::from_rsa_pem(&pem),
    }
    .map_err(|e| AuthConfigError::Key {
        path: path.to_string(),
        reason: e.to_string(),
    })
}

/// Go's `time.ParseDuration` for the forms a flag uses: `300ms`, `1s`, `5m`, `1h`, `1m30s`.
pub(crate) fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += Duration::from_secs_f64(n * scale);
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("3"), None);
        assert_eq!(parse_go_duration(""), None);
    }

    #[test]
    fn flags_are_parsed_as_etcd_does() {
        assert!(Authenticator::from_flags("simple", DEFAULT_SIMPLE_TOKEN_TTL, 10).is_ok());
        assert!(matches!(
            Authenticator::from_flags("magic", DEFAULT_SIMPLE_TOKEN_TTL, 10),
            Err(AuthConfigError::UnknownType(_))
        ));
        assert!(matches!(
            Authenticator::from_flags("jwt,sign-method=RS256", DEFAULT_SIMPLE_TOKEN_TTL, 10),
            Err(AuthConfigError::Missing("pub-key"))
        ));
        assert!(matches!(
            Authenticator::from_flags("simple", DEFAULT_SIMPLE_TOKEN_TTL, 3),
            Err(AuthConfigError::BcryptCost(3))
        ));
    }

    #[test]
    fn simple_token_prefixes_use_etcd_s_letters() {
        let a = Authenticator::default();
        let p =
            a.simple_token_prefix(&[0, 1, 51, 52, 255, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]);
        let p = p.unwrap();
        assert_eq!(p.len(), 16);
        assert!(p.starts_with("abZa"));
        assert!(p.bytes().all(|b| b.is_ascii_alphabetic()));
    }
}
