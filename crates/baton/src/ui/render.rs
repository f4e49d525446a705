//! The HTML: the page around the live part, the live part itself (what the event stream
//! sends again on every refresh), and the login page. maud escapes every value it inserts,
//! so a key or value that looks like markup is shown, never run. The `data-*` attributes
//! name what the browser test reads (holder, token, queue order).

use maud::{html, Markup, DOCTYPE};

use super::view::{
    Delay, ElectionRow, Health, LeasesView, LockRow, LocksView, MemberRow, QueueView, Role,
    TxnsView, View,
};
use crate::cli::output::span;

/// Where the page's static files are served (from the binary).
pub const CSS_PATH: &str = "/ui/assets/dashboard.css";
pub const JS_PATH: &str = "/ui/assets/dashboard.js";

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="color-scheme" content="light dark";
            title { (title) }
            link rel="stylesheet" href=(CSS_PATH);
        }
    }
}

/// The whole dashboard page: the live part as of `view`, and the script that keeps it live.
pub fn page(view: &View) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("Baton · cluster"))
            body {
                header.top {
                    span.brand { "Baton" }
                    span #live .live data-state="connecting" { "connecting…" }
                    span.spacer {}
                    @if let Some(user) = &view.user {
                        form.logout method="post" action="/ui/logout" {
                            span.user { (user) }
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main #view aria-live="polite" { (live(view)) }
                script src=(JS_PATH) defer {}
            }
        }
    }
}

/// The part of the page every refresh replaces.
pub fn live(v: &View) -> Markup {
    html! {
        p.asof { "as of " time #asof { (v.as_of) } }
        (summary(v))
        section #members {
            h2 { "Members" }
            @match &v.members {
                Ok(rows) => (members(rows)),
                Err(e) => (failed(e)),
            }
        }
        @match &v.locks {
            Ok(l) => (locks(l)),
            Err(e) => {
                section #locks { h2 { "Locks" } (failed(e)) }
                section #elections { h2 { "Elections" } (failed(e)) }
            }
        }
        section #leases {
            h2 { "Leases" }
            @match &v.leases {
                Ok(l) => (leases(l)),
                Err(e) => (failed(e)),
            }
        }
        section #txns {
            h2 { "Sagas and 2PC transactions" }
            @match &v.txns {
                Ok(t) => (txns(t)),
                Err(e) => (failed(e)),
            }
        }
    }
}

fn failed(error: &str) -> Markup {
    html! { p.error role="alert" { "Could not read this: " (error) } }
}

fn card(label: &str, value: Option<String>, id: &str, alarm: bool) -> Markup {
    html! {
        div.card.alarm[alarm] #(id) {
            span.label { (label) }
            span.value { (value.unwrap_or_else(|| "?".into())) }
        }
    }
}

fn summary(v: &View) -> Markup {
    let s = &v.summary;
    let unhealthy = s.healthy < s.members;
    html! {
        section.cards aria-label="Summary" {
            (card("Leader", Some(s.leader.clone().unwrap_or_else(|| "none".into())), "sum-leader", s.leader.is_none()))
            (card("Term", s.term.map(|t| t.to_string()), "sum-term", false))
            (card("Healthy", Some(format!("{}/{}", s.healthy, s.members)), "sum-healthy", unhealthy))
            (card("Revision", s.revision.map(|r| r.to_string()), "sum-revision", false))
            (card("Locks & elections", s.locks.map(|n| n.to_string()), "sum-locks", false))
            (card("Leases", s.leases.map(|n| n.to_string()), "sum-leases", false))
            (card("Stuck", s.stuck.map(|n| n.to_string()), "sum-stuck", s.stuck.unwrap_or(0) > 0))
        }
    }
}

fn health(h: &Health) -> Markup {
    match h {
        Health::Healthy => html! { span.badge.ok { "healthy" } },
        Health::NoLeader => html! { span.badge.bad { "no leader" } },
        Health::Alarm(e) => html! { span.badge.bad title=(e) { "alarm: " (e) } },
        Health::Unreachable(e) => html! { span.badge.bad title=(e) { "unreachable" } },
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "–".into(), |v| v.to_string())
}

fn members(rows: &[MemberRow]) -> Markup {
    html! {
        div.scroll {
            table.members {
                thead { tr {
                    th { "Name" } th.wide { "ID" } th { "Role" } th { "Health" } th.num { "Term" }
                    th.num { "Raft index" } th.num.wide { "Applied" } th.num { "Revision" }
                    th.num.wide { "DB size" } th.num { "Watchers" } th.wide { "Client URLs" }
                } }
                tbody {
                    @for m in rows {
                        tr data-member=(m.name) data-role=(m.role.name()) {
                            td { b { (m.name) } }
                            td.mono.wide { (m.id) }
                            td { span.role.leader[m.role == Role::Leader] { (m.role.name()) } }
                            td { (health(&m.health)) }
                            td.num { (opt(m.term)) }
                            td.num { (opt(m.index)) }
                            td.num.wide { (opt(m.applied)) }
                            td.num { (opt(m.revision)) }
                            td.num.wide { (opt(m.db_size.clone())) }
                            td.num data-watchers=(opt(m.watchers)) {
                                (opt(m.watchers))
                            }
                            td.mono.small.wide { (m.client_urls) }
                        }
                    }
                }
            }
        }
    }
}

fn queue(q: &QueueView, what: &str) -> Markup {
    html! {
        div.queue data-waiters=(q.count) {
            h4 { (what) " (" (q.count) " waiting)" }
            @if q.waiters.is_empty() {
                p.muted { "nobody waiting" }
            } @else {
                ol {
                    @for w in &q.waiters {
                        li data-waiter-key=(w.key) {
                            span.pos { (w.position) }
                            span.mono.key { (w.key) }
                            span.meta { "rev " (w.revision) " · lease " (w.lease) }
                        }
                    }
                }
                @if q.more > 0 {
                    p.muted { "and " (q.more) " more" }
                }
            }
        }
    }
}

fn delay(d: &Delay) -> Markup {
    match d {
        Delay::None => html! {},
        Delay::Set { ms } => html! { p.delay { "lock-delay " (span(*ms)) } },
        Delay::Running { ms, left_ms } => html! {
            p.delay.running { "lock-delay " (span(*ms)) ": not granted for " (span(*left_ms)) " more (expired holder)" }
        },
    }
}

fn lock(l: &LockRow) -> Markup {
    let state = match (&l.holder, &l.delay) {
        (Some(_), _) => "held",
        (None, Delay::Running { .. }) => "delayed",
        (None, _) => "free",
    };
    html! {
        article.lock data-lock=(l.name) {
            header {
                h3.mono { (l.name) }
                span.badge.(state) { (state) }
            }
            @if let Some(h) = &l.holder {
                dl.holder data-holder-key=(h.key) data-token=(h.token) {
                    div { dt { "Holder" } dd.mono { (h.key) } }
                    div { dt { "Fencing token" } dd.token { (h.token) } }
                    div { dt { "Lease" } dd.mono { (h.lease) } }
                    div { dt { "TTL left" } dd { (h.ttl) } }
                }
            } @else {
                p.muted.holder data-holder-key="" { "nobody holds it" }
            }
            (delay(&l.delay))
            (queue(&l.queue, "Queue"))
        }
    }
}

fn election(e: &ElectionRow) -> Markup {
    html! {
        tr data-election=(e.name) {
            td.mono { b { (e.name) } }
            td.mono data-leader-key=(e.leader.key) { (e.leader.key) }
            td.mono { (e.value) }
            td.num { (e.leader.token) }
            td.mono.wide { (e.leader.lease) }
            td.num { (e.leader.ttl) }
            td.num { (e.queue.count) }
        }
    }
}

fn locks(l: &LocksView) -> Markup {
    html! {
        section #locks {
            h2 { "Locks " span.count { (l.locks.len()) } }
            @if l.locks.is_empty() {
                p.muted { "No locks." }
            }
            div.locks {
                @for lock_row in &l.locks { (lock(lock_row)) }
            }
            @if l.not_shown > 0 {
                p.muted.more { (l.not_shown) " more locks and elections not shown (" (l.total) " in the registry)" }
            }
        }
        section #elections {
            h2 { "Elections " span.count { (l.elections.len()) } }
            @if l.elections.is_empty() {
                p.muted { "No elections." }
            } @else {
                div.scroll {
                    table {
                        thead { tr {
                            th { "Election" } th { "Leader key" } th { "Value" } th.num { "Token" }
                            th.wide { "Lease" } th.num { "TTL left" } th.num { "Candidates waiting" }
                        } }
                        tbody { @for e in &l.elections { (election(e)) } }
                    }
                }
            }
        }
    }
}

fn leases(l: &LeasesView) -> Markup {
    html! {
        @if l.rows.is_empty() {
            p.muted { "No leases." }
        } @else {
            div.scroll {
                table {
                    thead { tr {
                        th { "Lease" } th.num { "TTL left" } th.num.wide { "Granted" } th { "Keys" }
                    } }
                    tbody {
                        @for r in &l.rows {
                            tr data-lease=(r.id) {
                                td.mono { (r.id) }
                                td.num { (r.ttl) }
                                td.num.wide { (r.granted) }
                                td {
                                    @if r.keys.is_empty() { span.muted { "none" } }
                                    @for k in &r.keys { span.mono.chip { (k) } " " }
                                    @if r.more_keys > 0 { span.muted { "+" (r.more_keys) " more" } }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if l.not_shown > 0 {
            p.muted.more { (l.not_shown) " more leases not shown (" (l.total) " in all)" }
        }
    }
}

fn txns(t: &TxnsView) -> Markup {
    html! {
        @if t.namespaces.is_empty() {
            p.muted { "No saga or 2PC records in Baton (no baton-txn namespace)." }
        } @else {
            p.counts {
                "Namespaces: " span.mono { (t.namespaces.join(", ")) }
                @if t.more_namespaces { " and more" }
            }
            p.counts {
                @for (kind, state, n) in &t.counts {
                    span.badge.stuck[*state == "stuck"] { (kind.name()) " " (state) ": " (n) } " "
                }
            }
            @for e in &t.errors { (failed(e)) }
            @if t.rows.is_empty() {
                p.muted { "None." }
            } @else {
                div.scroll {
                    table.txns {
                        thead { tr {
                            th { "Kind" } th.wide { "Namespace" } th { "ID" } th { "State" }
                            th { "Where" } th.num.wide { "Attempts" } th { "Last error" } th.num { "Age" }
                        } }
                        tbody {
                            @for r in &t.rows {
                                tr.stuck[r.stuck] data-txn=(r.id) data-state=(r.state) {
                                    td { (r.kind.name()) }
                                    td.mono.wide { (r.namespace) }
                                    td.mono.small { (r.id) }
                                    td {
                                        span.badge.bad[r.stuck] { (r.state) }
                                        @if r.stuck && r.state != "stuck" { " " span.badge.bad { "needs attention" } }
                                    }
                                    td.wrap { (r.detail) }
                                    td.num.wide { (opt(r.attempts)) }
                                    td.small { (r.last_error) }
                                    td.num { (r.age) }
                                }
                            }
                        }
                    }
                }
            }
            @if t.not_shown > 0 {
                p.muted.more { (t.not_shown) " more not shown" }
            }
            @if t.open_not_read > 0 {
                p.muted.more { (t.open_not_read) " more unfinished ones not read (the page reads a bounded number per namespace)" }
            }
        }
    }
}

/// The login page (auth is on and the visitor has no valid session). It shows nothing of
/// the cluster.
pub fn login(error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("Baton · log in"))
            body.login {
                main {
                    form.login method="post" action="/ui/login" {
                        h1 { "Baton" }
                        p.muted { "Authentication is on: log in with a Baton (etcd) user. You will see what that user may read." }
                        @if let Some(e) = error {
                            p.error role="alert" { (e) }
                        }
                        label { "User" input name="user" autocomplete="username" required autofocus; }
                        label { "Password" input name="password" type="password" autocomplete="current-password"; }
                        button type="submit" { "Log in" }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::snapshot::{LockListing, LockReading, QueueEntry, Snapshot};
    use crate::ui::view::build;

    #[test]
    fn keys_that_look_like_markup_are_shown_not_run() {
        let s = Snapshot {
            taken_ms: 0,
            user: Some("<b>me</b>".into()),
            members: Ok(Vec::new()),
            locks: Ok(LockListing {
                total: 1,
                locks: vec![LockReading {
                    name: b"<script>alert(1)</script>".to_vec(),
                    holder: Some(QueueEntry {
                        key: b"x\"/><img src=x onerror=alert(1)>".to_vec(),
                        token: 5,
                        lease: 1,
                        ttl_s: 3,
                    }),
                    ..LockReading::default()
                }],
            }),
            leases: Err("<i>denied</i>".into()),
            txns: Err("x".into()),
        };
        let html = page(&build(&s, 0)).into_string();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("<img"));
        assert!(!html.contains("<i>denied"));
        assert!(!html.contains("<b>me"));
    }
}
