//! The dashboard's HTTP routes, all under `/ui`:
//!
//! - `GET /ui`: the page, rendered on the server with the cluster as it is now;
//! - `GET /ui/events`: server-sent events, a `view` event with the page's live part every
//!   [`REFRESH`] it changed (at most [`MAX_LIVE_PAGES`] streams at once per member);
//! - `GET /ui/login`, `POST /ui/login`, `POST /ui/logout`: the session, with auth on;
//! - `GET /ui/assets/…`: the stylesheet and script, compiled into the binary (no build step,
//!   no CDN: the page works on a network without the internet).
//!
//! **Read-only, hence no CSRF tokens.** No route changes anything in the cluster: the
//! only state-changing requests are logging in and out, which change the visitor's own
//! cookies. A forged cross-site login could at worst log a visitor in as the forger (who
//! must know a password) on a read-only page, and a forged logout only logs them out; the
//! session cookie is `SameSite=Strict`, so other sites' pages cannot make the browser send
//! it at all. Anything that would act (force-release, saga retry) must not be added here
//! without CSRF protection.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Form, Router};
use tokio::sync::Semaphore;

use super::config::{
    DashboardConfig, MAX_LIVE_PAGES, MAX_LOGINS_AT_ONCE, MAX_RENDERS_AT_ONCE, REFRESH,
};
use super::gather::{Reader, TokenRefused};
use super::render::{self, CSS_PATH, JS_PATH};
use super::session::{self, LoginForm, Session};
use super::view::build;
use crate::cli::output::now_ms;

/// The dashboard's state, shared by its routes.
struct Dashboard {
    config: DashboardConfig,
    /// Permits for live pages (event streams).
    live_pages: Arc<Semaphore>,
    /// Permits for logins being checked.
    logins: Semaphore,
    /// Permits for whole pages being rendered (each reads the cluster once).
    renders: Semaphore,
}

type Shared = Arc<Dashboard>;

/// The login form is two short fields.
const MAX_LOGIN_BODY: usize = 4096;

/// The routes, to be merged into the member's HTTP router
/// (`ServerConfig::http_extension`).
pub fn router(config: DashboardConfig) -> Router {
    let state = Arc::new(Dashboard {
        config,
        live_pages: Arc::new(Semaphore::new(MAX_LIVE_PAGES)),
        logins: Semaphore::new(MAX_LOGINS_AT_ONCE),
        renders: Semaphore::new(MAX_RENDERS_AT_ONCE),
    });
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(|| async { redirect("/ui") }))
        .route("/ui/events", get(events))
        .route(
            "/ui/login",
            get(login_page)
                .post(login)
                .layer(DefaultBodyLimit::max(MAX_LOGIN_BODY)),
        )
        .route("/ui/logout", axum::routing::post(logout))
        .route(CSS_PATH, get(css))
        .route(JS_PATH, get(js))
        .with_state(state)
        .layer(axum::middleware::map_response(protect))
}

/// What every dashboard answer carries: its script and styles only from this member, no
/// framing by other sites, no caching of cluster data, no referrer leaking the URL.
async fn protect(mut response: Response) -> Response {
    let h = response.headers_mut();
    let set = |h: &mut HeaderMap, name: &'static str, value: &'static str| {
        h.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    };
    set(
        h,
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    set(h, "x-content-type-options", "nosniff");
    set(h, "x-frame-options", "DENY");
    set(h, "referrer-policy", "no-referrer");
    if !h.contains_key(CACHE_CONTROL) {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn redirect(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(LOCATION, to)]).into_response()
}

fn with_cookies(mut response: Response, cookies: Vec<HeaderValue>) -> Response {
    for c in cookies {
        response.headers_mut().append(SET_COOKIE, c);
    }
    response
}

/// Who a visitor reads the cluster as.
enum Visitor {
    /// Auth is off: anonymous, as any client.
    Anyone,
    /// Auth is on and the visitor has a session: their token (and name, for the page).
    User { token: String, name: String },
    /// Auth is on and the visitor has no session: nothing is read for them.
    NeedsLogin,
}

impl Visitor {
    fn of(d: &Dashboard, headers: &HeaderMap) -> Visitor {
        if !(d.config.auth_enabled)() {
            return Visitor::Anyone;
        }
        let session = Session::from_headers(headers);
        match session.token {
            Some(token) => Visitor::User {
                token,
                name: session.user.unwrap_or_else(|| "?".into()),
            },
            None => Visitor::NeedsLogin,
        }
    }

    /// The token and name to read as (`None`, `None` for anyone); `None` for a visitor who
    /// must log in first.
    fn credentials(self) -> Option<(Option<String>, Option<String>)> {
        match self {
            Visitor::Anyone => Some((None, None)),
            Visitor::User { token, name } => Some((Some(token), Some(name))),
            Visitor::NeedsLogin => None,
        }
    }
}

/// The session is over: its cookies go, and the visitor is sent to log in.
fn session_over(d: &Dashboard) -> Response {
    with_cookies(
        (StatusCode::SEE_OTHER, [(LOCATION, "/ui/login?expired")]).into_response(),
        session::end(d.config.secure_cookie),
    )
}

fn unavailable(error: &baton_client::Error) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("The dashboard cannot reach the cluster through this member: {error}"),
    )
        .into_response()
}

async fn index(State(d): State<Shared>, headers: HeaderMap) -> Response {
    let Ok(_permit) = d.renders.try_acquire() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many dashboard pages being rendered on this member; try again in a moment",
        )
            .into_response();
    };
    let Some((token, user)) = Visitor::of(&d, &headers).credentials() else {
        return redirect("/ui/login");
    };
    let reader = match Reader::connect(&d.config, token, user).await {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    match reader.snapshot().await {
        Ok(s) => Html(render::page(&build(&s, now_ms())).into_string()).into_response(),
        Err(TokenRefused) => session_over(&d),
    }
}

/// The live part of the page as server-sent events: `view` with the HTML to put in place,
/// whenever it changed; `expired` (and the end of the stream) when the session is over.
async fn events(State(d): State<Shared>, headers: HeaderMap) -> Response {
    let Some((token, user)) = Visitor::of(&d, &headers).credentials() else {
        return (StatusCode::UNAUTHORIZED, "log in at /ui/login").into_response();
    };
    let Ok(permit) = d.live_pages.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many live dashboard pages on this member; try again later",
        )
            .into_response();
    };
    let reader = match Reader::connect(&d.config, token, user).await {
        Ok(r) => r,
        Err(e) => return unavailable(&e),
    };
    struct Live {
        reader: Reader,
        last: String,
        first: bool,
        over: bool,
        _permit: tokio::sync::OwnedSemaphorePermit,
    }
    let start = Live {
        reader,
        last: String::new(),
        first: true,
        over: false,
        _permit: permit,
    };
    let stream = futures::stream::unfold(start, |mut live| async move {
        if live.over {
            return None;
        }
        loop {
            if !live.first {
                tokio::time::sleep(REFRESH).await;
            }
            live.first = false;
            match live.reader.snapshot().await {
                Ok(s) => {
                    // SSE ends a field at a carriage return: none may be in the data.
                    let html = render::live(&build(&s, now_ms()))
                        .into_string()
                        .replace('\r', " ");
                    if html != live.last {
                        live.last = html.clone();
                        let event = Event::default().event("view").data(html);
                        return Some((Ok::<_, std::convert::Infallible>(event), live));
                    }
                }
                Err(TokenRefused) => {
                    live.over = true;
                    let event = Event::default().event("expired").data("log in again");
                    return Some((Ok(event), live));
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn login_page(State(d): State<Shared>, uri: Uri) -> Response {
    if !(d.config.auth_enabled)() {
        return redirect("/ui");
    }
    let note = (uri.query() == Some("expired")).then_some("Your session ended: log in again.");
    Html(render::login(note).into_string()).into_response()
}

async fn login(State(d): State<Shared>, Form(form): Form<LoginForm>) -> Response {
    if !(d.config.auth_enabled)() {
        return redirect("/ui");
    }
    let refuse = |status: StatusCode, message: &str| {
        (status, Html(render::login(Some(message)).into_string())).into_response()
    };
    let Ok(_permit) = d.logins.try_acquire() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "Too many logins at once on this member; try again in a moment.",
        );
    };
    let config = baton_client::ClientConfig::new(d.config.endpoints.clone())
        .with_server_kind(baton_client::ServerKind::Baton);
    let config = match &d.config.tls {
        Some(tls) => config.with_tls(tls.clone()),
        None => config,
    };
    let client = match baton_client::Client::connect(config).await {
        Ok(c) => c,
        Err(e) => return unavailable(&e),
    };
    match client.authenticate(&form.user, &form.password).await {
        Ok(token) => {
            tracing::info!(user = %form.user, "dashboard: logged in");
            with_cookies(
                redirect("/ui"),
                session::start(&form.user, &token, d.config.secure_cookie),
            )
        }
        Err(baton_client::Error::Server { message, .. }) => {
            tracing::info!(user = %form.user, reason = %message, "dashboard: login refused");
            refuse(StatusCode::UNAUTHORIZED, &message)
        }
        Err(e) => unavailable(&e),
    }
}

async fn logout(State(d): State<Shared>) -> Response {
    with_cookies(redirect("/ui/login"), session::end(d.config.secure_cookie))
}

/// Static files: compiled in, so the binary is the whole dashboard.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")],
        body,
    )
        .into_response()
}

async fn css() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("assets/dashboard.css"),
    )
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/dashboard.js"),
    )
}
