//! Who is looking: with auth on, a visitor logs in with an etcd user and password, the
//! member's `Auth.Authenticate` issues a token, and the token rides in a cookie the page's
//! script cannot read (`HttpOnly`), that no other site's page makes the browser send
//! (`SameSite=Strict`) and, when the member serves TLS, that never travels over plain HTTP
//! (`Secure`). The dashboard reads everything with that token, so the server's permission
//! checks apply to the visitor as to any client. Neither the password nor the token is
//! ever logged (the form has no `Debug`).

use axum::http::header::COOKIE;
use axum::http::{HeaderMap, HeaderValue};
use base64::Engine as _;
use cookie::{Cookie, SameSite};
use serde::Deserialize;

/// The cookie holding the token.
const TOKEN_COOKIE: &str = "baton_ui_token";
/// The cookie holding the user name, for "logged in as" only (it grants nothing: the token
/// does).
const USER_COOKIE: &str = "baton_ui_user";
/// Where the cookies are sent: the dashboard's paths only.
const COOKIE_PATH: &str = "/ui";

/// The login form's fields. No `Debug`: it holds a password.
#[derive(Deserialize)]
pub struct LoginForm {
    pub user: String,
    pub password: String,
}

/// A visitor's session as their cookies say (nothing checked yet: the server checks the
/// token on every read).
#[derive(Clone, Default)]
pub struct Session {
    pub token: Option<String>,
    pub user: Option<String>,
}

impl Session {
    /// The session in `headers`' cookies.
    pub fn from_headers(headers: &HeaderMap) -> Session {
        let mut session = Session::default();
        for header in headers.get_all(COOKIE) {
            let Ok(text) = header.to_str() else { continue };
            for cookie in Cookie::split_parse(text).flatten() {
                match cookie.name() {
                    TOKEN_COOKIE if !cookie.value().is_empty() => {
                        session.token = Some(cookie.value().to_string());
                    }
                    USER_COOKIE => {
                        session.user = base64::engine::general_purpose::URL_SAFE_NO_PAD
                            .decode(cookie.value())
                            .ok()
                            .and_then(|b| String::from_utf8(b).ok());
                    }
                    _ => {}
                }
            }
        }
        session
    }
}

fn cookie(name: &'static str, value: String, secure: bool) -> Cookie<'static> {
    Cookie::build((name, value))
        .path(COOKIE_PATH)
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .build()
}

/// The `Set-Cookie` values that start a session for `user` with `token`. Session cookies
/// (no expiry): the token's own lifetime on the server is what counts.
pub fn start(user: &str, token: &str, secure: bool) -> Vec<HeaderValue> {
    let user = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(user);
    [
        cookie(TOKEN_COOKIE, token.to_string(), secure),
        cookie(USER_COOKIE, user, secure),
    ]
    .iter()
    .filter_map(|c| HeaderValue::from_str(&c.to_string()).ok())
    .collect()
}

/// The `Set-Cookie` values that end the session (the browser drops both cookies).
pub fn end(secure: bool) -> Vec<HeaderValue> {
    [TOKEN_COOKIE, USER_COOKIE]
        .into_iter()
        .map(|name| {
            let mut c = cookie(name, String::new(), secure);
            c.make_removal();
            c
        })
        .filter_map(|c| HeaderValue::from_str(&c.to_string()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(cookies: &[HeaderValue]) -> HeaderMap {
        let mut h = HeaderMap::new();
        let pairs: Vec<String> = cookies
            .iter()
            .map(|c| c.to_str().unwrap().split(';').next().unwrap().to_string())
            .collect();
        h.insert(COOKIE, HeaderValue::from_str(&pairs.join("; ")).unwrap());
        h
    }

    #[test]
    fn the_session_cookies_are_http_only_strict_and_come_back() {
        let set = start("ops team", "AbC.12", true);
        for c in &set {
            let c = c.to_str().unwrap();
            for attr in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/ui"] {
                assert!(c.contains(attr), "{c} lacks {attr}");
            }
        }
        let s = Session::from_headers(&headers(&set));
        assert_eq!(s.token.as_deref(), Some("AbC.12"));
        assert_eq!(s.user.as_deref(), Some("ops team"));
        assert!(!start("u", "t", false)[0]
            .to_str()
            .unwrap()
            .contains("Secure"));
    }

    #[test]
    fn ending_a_session_empties_both_cookies() {
        let set = end(false);
        assert_eq!(set.len(), 2);
        for c in &set {
            let c = c.to_str().unwrap();
            assert!(c.contains("Max-Age=0") || c.contains("Expires="), "{c}");
        }
        assert!(Session::from_headers(&headers(&set)).token.is_none());
        assert!(Session::from_headers(&HeaderMap::new()).token.is_none());
    }
}
