//! The gateway's routes, read from the descriptors baton-proto builds: every method with a
//! `google.api.http` option is reachable at its path(s) with its method, the request in the
//! body (`body: "*"`, the only form etcd uses). Nothing here names an etcd RPC: a method
//! annotated in a `.proto` file is served, one that is not is not.
//!
//! Bindings are taken in the order etcd's gateway registers them (services in file order:
//! KV, Watch, Lease, Cluster, Maintenance, Auth, then Lock and Election; methods in
//! declaration order) and the first binding of a path wins, as in grpc-gateway's mux: so
//! `/v3/maintenance/hash`, which etcd 3.4 binds to both `Hash` and `HashKV`, is `Hash`.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, MessageDescriptor, MethodDescriptor, Value};

/// The descriptors of every message and service (baton-proto's `FILE_DESCRIPTOR_SET`),
/// decoded once.
pub fn descriptors() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(baton_proto::FILE_DESCRIPTOR_SET)
            .expect("baton-proto's descriptor set is built by protox at compile time")
    })
}

/// How an RPC's messages flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Unary,
    /// One request, a stream of responses (`Observe`, `Snapshot`).
    ServerStream,
    /// A stream each way (`Watch`, `LeaseKeepAlive`); a request body is a stream of JSON
    /// values.
    Bidi,
}

/// One RPC reachable over HTTP.
#[derive(Debug, Clone)]
pub struct Route {
    /// The gRPC path, `/etcdserverpb.KV/Range`.
    pub grpc_path: String,
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
    pub shape: Shape,
}

/// Every binding, by HTTP path and method.
#[derive(Debug, Clone)]
pub struct RouteTable {
    routes: HashMap<String, (http::Method, Route)>,
}

/// A `.proto` binding this gateway cannot serve (it serves what etcd's files state).
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("{method}: HTTP path {path:?} has a template; only literal paths are served")]
    Template { method: String, path: String },
    #[error("{method}: body {body:?}; only the whole request (\"*\") is served")]
    Body { method: String, body: String },
    #[error("{method}: client-streaming RPCs without a server stream are not served")]
    ClientStream { method: String },
    #[error("the descriptors hold no google.api.http extension")]
    NoExtension,
}

/// What the table answers for a path and method.
#[derive(Debug)]
pub enum Lookup<'a> {
    Found(&'a Route),
    /// The path is bound, to another method.
    WrongMethod,
    NotFound,
}

impl RouteTable {
    /// The routes of every annotated method in `pool`.
    pub fn from_descriptors(pool: &DescriptorPool) -> Result<RouteTable, RouteError> {
        let http = pool
            .get_extension_by_name("google.api.http")
            .ok_or(RouteError::NoExtension)?;
        let mut routes = HashMap::new();
        for service in pool.services() {
            for method in service.methods() {
                let options = method.options();
                if !options.has_extension(&http) {
                    continue;
                }
                let Value::Message(rule) = options.get_extension(&http).into_owned() else {
                    unreachable!("google.api.http is a message")
                };
                let route = route(&method)?;
                for (verb, path) in bindings(&method, &rule)? {
                    routes.entry(path).or_insert_with(|| (verb, route.clone()));
                }
            }
        }
        Ok(RouteTable { routes })
    }

    /// The table for baton-proto's descriptors (built once).
    pub fn get() -> &'static RouteTable {
        static TABLE: OnceLock<RouteTable> = OnceLock::new();
        TABLE.get_or_init(|| {
            RouteTable::from_descriptors(descriptors())
                .expect("baton-proto's HTTP bindings are etcd's literal POST paths")
        })
    }

    pub fn lookup(&self, method: &http::Method, path: &str) -> Lookup<'_> {
        match self.routes.get(path) {
            Some((m, route)) if m == method => Lookup::Found(route),
            Some(_) => Lookup::WrongMethod,
            None => Lookup::NotFound,
        }
    }

    /// Every (path, gRPC path), sorted (for tests and documentation).
    pub fn paths(&self) -> Vec<(String, String)> {
        let mut all: Vec<_> = self
            .routes
            .iter()
            .map(|(p, (_, r))| (p.clone(), r.grpc_path.clone()))
            .collect();
        all.sort();
        all
    }
}

fn route(method: &MethodDescriptor) -> Result<Route, RouteError> {
    let shape = match (method.is_client_streaming(), method.is_server_streaming()) {
        (false, false) => Shape::Unary,
        (false, true) => Shape::ServerStream,
        (true, true) => Shape::Bidi,
        (true, false) => {
            return Err(RouteError::ClientStream {
                method: method.full_name().into(),
            })
        }
    };
    Ok(Route {
        grpc_path: format!("/{}/{}", method.parent_service().full_name(), method.name()),
        input: method.input(),
        output: method.output(),
        shape,
    })
}

/// The (method, path) pairs of a rule and its additional bindings.
fn bindings(
    method: &MethodDescriptor,
    rule: &prost_reflect::DynamicMessage,
) -> Result<Vec<(http::Method, String)>, RouteError> {
    let name = || method.full_name().to_string();
    let text = |field: &str| -> String {
        rule.get_field_by_name(field)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for (field, verb) in [
        ("get", http::Method::GET),
        ("put", http::Method::PUT),
        ("post", http::Method::POST),
        ("delete", http::Method::DELETE),
        ("patch", http::Method::PATCH),
    ] {
        let path = text(field);
        if path.is_empty() {
            continue;
        }
        if path.contains('{') || path.contains('*') || path.contains(':') {
            return Err(RouteError::Template {
                method: name(),
                path,
            });
        }
        let body = text("body");
        if body != "*" {
            return Err(RouteError::Body {
                method: name(),
                body,
            });
        }
        out.push((verb, path));
    }
    if let Some(Value::List(more)) = rule
        .get_field_by_name("additional_bindings")
        .map(|v| v.into_owned())
    {
        for extra in more {
            if let Value::Message(extra) = extra {
                out.extend(bindings(method, &extra)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_etcd_3_4_s() {
        let paths = RouteTable::get().paths();
        let want: &[(&str, &str)] = &[
            ("/v3/auth/authenticate", "/etcdserverpb.Auth/Authenticate"),
            ("/v3/auth/disable", "/etcdserverpb.Auth/AuthDisable"),
            ("/v3/auth/enable", "/etcdserverpb.Auth/AuthEnable"),
            ("/v3/auth/role/add", "/etcdserverpb.Auth/RoleAdd"),
            ("/v3/auth/role/delete", "/etcdserverpb.Auth/RoleDelete"),
            ("/v3/auth/role/get", "/etcdserverpb.Auth/RoleGet"),
            (
                "/v3/auth/role/grant",
                "/etcdserverpb.Auth/RoleGrantPermission",
            ),
            ("/v3/auth/role/list", "/etcdserverpb.Auth/RoleList"),
            (
                "/v3/auth/role/revoke",
                "/etcdserverpb.Auth/RoleRevokePermission",
            ),
            ("/v3/auth/user/add", "/etcdserverpb.Auth/UserAdd"),
            (
                "/v3/auth/user/changepw",
                "/etcdserverpb.Auth/UserChangePassword",
            ),
            ("/v3/auth/user/delete", "/etcdserverpb.Auth/UserDelete"),
            ("/v3/auth/user/get", "/etcdserverpb.Auth/UserGet"),
            ("/v3/auth/user/grant", "/etcdserverpb.Auth/UserGrantRole"),
            ("/v3/auth/user/list", "/etcdserverpb.Auth/UserList"),
            ("/v3/auth/user/revoke", "/etcdserverpb.Auth/UserRevokeRole"),
            ("/v3/cluster/member/add", "/etcdserverpb.Cluster/MemberAdd"),
            (
                "/v3/cluster/member/list",
                "/etcdserverpb.Cluster/MemberList",
            ),
            (
                "/v3/cluster/member/promote",
                "/etcdserverpb.Cluster/MemberPromote",
            ),
            (
                "/v3/cluster/member/remove",
                "/etcdserverpb.Cluster/MemberRemove",
            ),
            (
                "/v3/cluster/member/update",
                "/etcdserverpb.Cluster/MemberUpdate",
            ),
            ("/v3/election/campaign", "/v3electionpb.Election/Campaign"),
            ("/v3/election/leader", "/v3electionpb.Election/Leader"),
            ("/v3/election/observe", "/v3electionpb.Election/Observe"),
            ("/v3/election/proclaim", "/v3electionpb.Election/Proclaim"),
            ("/v3/election/resign", "/v3electionpb.Election/Resign"),
            ("/v3/kv/compaction", "/etcdserverpb.KV/Compact"),
            ("/v3/kv/deleterange", "/etcdserverpb.KV/DeleteRange"),
            ("/v3/kv/lease/leases", "/etcdserverpb.Lease/LeaseLeases"),
            ("/v3/kv/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke"),
            (
                "/v3/kv/lease/timetolive",
                "/etcdserverpb.Lease/LeaseTimeToLive",
            ),
            ("/v3/kv/put", "/etcdserverpb.KV/Put"),
            ("/v3/kv/range", "/etcdserverpb.KV/Range"),
            ("/v3/kv/txn", "/etcdserverpb.KV/Txn"),
            ("/v3/lease/grant", "/etcdserverpb.Lease/LeaseGrant"),
            ("/v3/lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive"),
            ("/v3/lease/leases", "/etcdserverpb.Lease/LeaseLeases"),
            ("/v3/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke"),
            (
                "/v3/lease/timetolive",
                "/etcdserverpb.Lease/LeaseTimeToLive",
            ),
            ("/v3/lock/lock", "/v3lockpb.Lock/Lock"),
            ("/v3/lock/unlock", "/v3lockpb.Lock/Unlock"),
            ("/v3/maintenance/alarm", "/etcdserverpb.Maintenance/Alarm"),
            (
                "/v3/maintenance/defragment",
                "/etcdserverpb.Maintenance/Defragment",
            ),
            ("/v3/maintenance/hash", "/etcdserverpb.Maintenance/Hash"),
            (
                "/v3/maintenance/snapshot",
                "/etcdserverpb.Maintenance/Snapshot",
            ),
            ("/v3/maintenance/status", "/etcdserverpb.Maintenance/Status"),
            (
                "/v3/maintenance/transfer-leadership",
                "/etcdserverpb.Maintenance/MoveLeader",
            ),
            ("/v3/watch", "/etcdserverpb.Watch/Watch"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(paths, want);
        let table = RouteTable::get();
        assert!(
            matches!(table.lookup(&http::Method::POST, "/v3/watch"), Lookup::Found(r) if r.shape == Shape::Bidi)
        );
        assert!(
            matches!(table.lookup(&http::Method::POST, "/v3/election/observe"), Lookup::Found(r) if r.shape == Shape::ServerStream)
        );
        assert!(matches!(
            table.lookup(&http::Method::GET, "/v3/kv/range"),
            Lookup::WrongMethod
        ));
        assert!(matches!(
            table.lookup(&http::Method::POST, "/v3/auth/status"),
            Lookup::NotFound
        ));
    }

    /// Go writes a message's fields in declaration order, prost-reflect in field-number
    /// order: for the gateway's output to be etcd's, the two must agree for every message
    /// a route can answer (and every message inside one).
    #[test]
    fn every_answered_message_declares_its_fields_in_number_order() {
        let mut seen = std::collections::HashSet::new();
        let mut todo: Vec<MessageDescriptor> = RouteTable::get()
            .routes
            .values()
            .map(|(_, r)| r.output.clone())
            .collect();
        while let Some(m) = todo.pop() {
            if !seen.insert(m.full_name().to_string()) {
                continue;
            }
            let declared: Vec<i32> = m
                .descriptor_proto()
                .field
                .iter()
                .map(|f| f.number())
                .collect();
            let mut sorted = declared.clone();
            sorted.sort();
            assert_eq!(declared, sorted, "{}", m.full_name());
            for f in m.fields() {
                if let prost_reflect::Kind::Message(inner) = f.kind() {
                    todo.push(inner);
                }
            }
        }
        assert!(seen.contains("mvccpb.KeyValue") && seen.contains("etcdserverpb.ResponseOp"));
    }
}
