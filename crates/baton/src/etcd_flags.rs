//! etcd's way of taking a member's configuration, for `baton serve`: Go's flag syntax,
//! `ETCD_*` environment variables and `--config-file` (etcd's YAML), turned into the argv that
//! clap parses into [`crate::serve::ServeArgs`] — which stays the one definition of Baton's
//! flags. An etcd unit file, compose file or test harness thus starts Baton unchanged.
//!
//! **Why a translation rather than clap alone.** etcd parses with Go's `flag` package and
//! `etcdmain/config.go`, whose rules clap does not have: `-flag` as well as `--flag`; a
//! boolean takes no separate value (`--flag false` is an error, `--flag=false` is not) and
//! accepts Go's spellings (`1`, `t`, `TRUE`, …); a flag given twice takes the last value; an
//! environment variable counts only for a flag not on the command line (both at once is
//! fatal in etcd 3.4: "conflicting environment variable … is shadowed"); with a config file
//! (`--config-file` or `ETCD_CONFIG_FILE`) every other flag and variable is ignored. And every
//! flag of `etcd --help` must either do what it does in etcd or be refused with one line that
//! says why ([`ETCD_FLAGS`]); a refused flag given with a value that asks nothing of Baton
//! (etcd's default: `--enable-v2=false`, `--proxy=off`, `--discovery=`) is accepted.
//!
//! Flags that are not etcd's pass to clap as they are (Baton's own, and those others add to
//! `ServeArgs`); whether one takes a value is read from clap's own definition.

use std::collections::BTreeMap;
use std::path::Path;

use yaml_rust2::{Yaml, YamlLoader};

/// What `baton serve` should do with its arguments.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Run with this argv (program name and `serve` first) and log these warnings.
    Serve {
        argv: Vec<String>,
        warnings: Vec<String>,
    },
    /// `--version`: print etcd's version lines and exit.
    Version,
}

/// A flag, variable or config file that cannot be taken; the message is the one line
/// `baton serve` prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, FlagError> {
    Err(FlagError(msg.into()))
}

/// A mapping from an etcd flag's value to Baton's flags (name, value), or why the value is
/// refused.
type Mapping = fn(&str) -> Result<Vec<(&'static str, String)>, String>;

/// What Baton does with one of etcd's flags.
#[derive(Clone, Copy)]
enum Kind {
    /// A `ServeArgs` field of the same name with etcd's meaning (or one that other changes add
    /// now): passed to clap as given.
    Native,
    /// Accepted only with a value `ok` accepts (the values that ask nothing Baton lacks);
    /// otherwise refused with `--name: why`.
    Refuse(fn(&str) -> bool, &'static str),
    /// Translated into Baton's flags (or into nothing): `Ok(pairs)`, or the refusal's reason.
    Map(Mapping),
    /// etcd's own ignored flags (`etcdmain/config.go`'s `ignored`): accepted with a warning,
    /// as etcd does.
    Ignored,
}

/// One of etcd 3.4's server flags.
struct Spec {
    name: &'static str,
    /// Go's boolean flags take no separate value.
    bool: bool,
    kind: Kind,
}

const fn native(name: &'static str, bool: bool) -> Spec {
    Spec {
        name,
        bool,
        kind: Kind::Native,
    }
}

const fn refuse(name: &'static str, bool: bool, ok: fn(&str) -> bool, why: &'static str) -> Spec {
    Spec {
        name,
        bool,
        kind: Kind::Refuse(ok, why),
    }
}

const fn map(name: &'static str, bool: bool, f: Mapping) -> Spec {
    Spec {
        name,
        bool,
        kind: Kind::Map(f),
    }
}

const fn ignored(name: &'static str) -> Spec {
    Spec {
        name,
        bool: true,
        kind: Kind::Ignored,
    }
}

fn is_empty(v: &str) -> bool {
    v.trim().is_empty()
}
fn is_false(v: &str) -> bool {
    go_bool(v) == Some(false)
}
fn is_true(v: &str) -> bool {
    go_bool(v) == Some(true)
}
fn is_zero(v: &str) -> bool {
    go_uint(v) == Some(0)
}
fn is_zero_duration(v: &str) -> bool {
    v.trim().is_empty() || go_duration_ns(v) == Some(0)
}

/// Every flag of `etcd --help` (3.4.23) and the hidden ones `etcdmain/config.go` defines,
/// with what Baton does with it. `--config-file` and `--version` are handled before.
const ETCD_FLAGS: &[Spec] = &[
    // Member.
    native("name", false),
    native("data-dir", false),
    refuse(
        "wal-dir",
        false,
        is_empty,
        "Baton keeps its Raft log inside --data-dir (raft/); a separate WAL directory is not provided",
    ),
    native("snapshot-count", false),
    native("heartbeat-interval", false),
    native("election-timeout", false),
    map("initial-election-tick-advance", true, |v| match go_bool(v) {
        // Baton's election timer (pre-vote, `baton_raft::election`) gives a restarted
        // member one randomized timeout to hear from a leader before it asks for votes,
        // which is what etcd's `false` does; it never fast-forwards.
        Some(false) => Ok(vec![]),
        Some(true) => Err("Baton never fast-forwards election ticks at start (a restarted member first waits one election timeout to hear from a leader); only =false is accepted".into()),
        None => Err(format!("invalid boolean {v:?}")),
    }),
    native("listen-peer-urls", false),
    native("listen-client-urls", false),
    map("max-snapshots", false, |v| match go_uint(v) {
        // A maximum: Baton keeps only its newest snapshot, within any bound but "unlimited".
        Some(0) => Err("Baton keeps only its newest snapshot; unlimited retention (0) is not provided".into()),
        Some(_) => Ok(vec![]),
        None => Err(format!("invalid value {v:?}: a count is expected")),
    }),
    map("max-wals", false, |v| match go_uint(v) {
        Some(0) => Err("Baton trims its log after each snapshot; unlimited retention (0) is not provided".into()),
        Some(_) => Ok(vec![]),
        None => Err(format!("invalid value {v:?}: a count is expected")),
    }),
    native("quota-backend-bytes", false),
    refuse(
        "backend-batch-interval",
        false,
        is_zero_duration,
        "Baton has no bbolt backend to batch: every acknowledged write is already fsynced in its log",
    ),
    refuse(
        "backend-batch-limit",
        false,
        is_zero,
        "Baton has no bbolt backend to batch: every acknowledged write is already fsynced in its log",
    ),
    refuse(
        "max-txn-ops",
        false,
        |v| go_uint(v) == Some(baton_server::MAX_TXN_OPS as u64),
        "Baton's limit is fixed at etcd's default, 128 operations per transaction",
    ),
    refuse(
        "max-request-bytes",
        false,
        |v| go_uint(v) == Some(baton_server::MAX_REQUEST_BYTES as u64),
        "Baton's limit is fixed at etcd's default, 1572864 bytes",
    ),
    native("max-concurrent-streams", false),
    refuse(
        "grpc-keepalive-min-time",
        false,
        |v| go_duration_ns(v) == Some(5_000_000_000),
        "Baton does not police how often clients ping (its HTTP/2 server has no such policy); only etcd's default, 5s, is accepted",
    ),
    native("grpc-keepalive-interval", false),
    native("grpc-keepalive-timeout", false),
    // Clustering.
    native("initial-advertise-peer-urls", false),
    native("initial-cluster", false),
    native("initial-cluster-state", false),
    native("initial-cluster-token", false),
    native("advertise-client-urls", false),
    refuse("discovery", false, is_empty, "discovery services are not provided; list the members with --initial-cluster"),
    map("discovery-fallback", false, |v| match v {
        // Matters only with --discovery, which is refused.
        "proxy" | "exit" => Ok(vec![]),
        _ => Err(format!("invalid value {v:?}: proxy or exit")),
    }),
    refuse("discovery-proxy", false, is_empty, "discovery services are not provided; list the members with --initial-cluster"),
    refuse("discovery-srv", false, is_empty, "DNS discovery is not provided; list the members with --initial-cluster"),
    refuse("discovery-srv-name", false, is_empty, "DNS discovery is not provided; list the members with --initial-cluster"),
    native("strict-reconfig-check", true),
    refuse("enable-v2", true, is_false, "the v2 API is not provided"),
    refuse(
        "pre-vote",
        true,
        is_true,
        "Baton always runs Raft's pre-vote phase; it cannot be turned off",
    ),
    native("auto-compaction-retention", false),
    native("auto-compaction-mode", false),
    // Proxy (etcd's v2 proxy).
    map("proxy", false, |v| match v {
        "off" => Ok(vec![]),
        "on" | "readonly" => Err("etcd's v2 proxy is not provided (for a TCP proxy, see `baton gateway`)".into()),
        _ => Err(format!("invalid value {v:?}: off, readonly or on")),
    }),
    // Matter only with --proxy, which is refused: validated as etcd does, no effect.
    map("proxy-failure-wait", false, uint_no_effect),
    map("proxy-refresh-interval", false, uint_no_effect),
    map("proxy-dial-timeout", false, uint_no_effect),
    map("proxy-write-timeout", false, uint_no_effect),
    map("proxy-read-timeout", false, uint_no_effect),
    // Security.
    native("cert-file", false),
    native("key-file", false),
    native("client-cert-auth", true),
    native("client-crl-file", false),
    refuse(
        "client-cert-allowed-hostname",
        false,
        is_empty,
        "checking client certificates' hostname is not provided (--trusted-ca-file and --client-cert-auth are)",
    ),
    native("trusted-ca-file", false),
    native("auto-tls", true),
    native("peer-cert-file", false),
    native("peer-key-file", false),
    native("peer-client-cert-auth", true),
    native("peer-trusted-ca-file", false),
    native("peer-cert-allowed-cn", false),
    native("peer-cert-allowed-hostname", false),
    native("peer-auto-tls", true),
    native("peer-crl-file", false),
    native("cipher-suites", false),
    refuse(
        "experimental-peer-skip-client-san-verification",
        true,
        is_false,
        "Baton always verifies peer certificates' names",
    ),
    map("cors", false, |v| {
        if v.split(',').all(|o| matches!(o.trim(), "*" | "")) {
            Ok(vec![])
        } else {
            Err("Baton's HTTP endpoints answer every origin alike; only \"*\" (allow all, etcd's default) is accepted".into())
        }
    }),
    map("host-whitelist", false, |v| {
        if v.split(',').all(|h| matches!(h.trim(), "*" | "")) {
            Ok(vec![])
        } else {
            Err("Baton does not check HTTP Host headers; only \"*\" (allow all, etcd's default) is accepted".into())
        }
    }),
    // Auth.
    native("auth-token", false),
    native("bcrypt-cost", false),
    native("auth-token-ttl", false),
    // Profiling and monitoring.
    refuse(
        "enable-pprof",
        true,
        is_false,
        "Go's pprof profiler does not exist in Baton (use /metrics, or perf on the process)",
    ),
    map("metrics", false, |v| match v {
        // Baton always exports etcd's "extensive" set (with grpc_server_handling_seconds);
        // "basic" gets more than it asks for, nothing less.
        "basic" | "extensive" => Ok(vec![]),
        _ => Err(format!("invalid value {v:?}: basic or extensive")),
    }),
    native("listen-metrics-urls", false),
    // Logging.
    map("logger", false, |v| match v {
        // Baton's log lines are its own either way (tracing's format); both are accepted.
        "capnslog" | "zap" => Ok(vec![]),
        _ => Err(format!("invalid value {v:?}: zap or capnslog")),
    }),
    map("log-outputs", false, |v| Ok(vec![("log-outputs", v.to_string())])),
    map("log-output", false, |v| Ok(vec![("log-outputs", v.to_string())])),
    map("log-level", false, |v| {
        let level = match v {
            "debug" => "debug",
            "info" => "info,openraft=warn",
            "warn" => "warn",
            "error" | "panic" | "fatal" => "error",
            // Baton's own: tracing's filter syntax (`baton_raft=debug`).
            other => other,
        };
        Ok(vec![("log-level", level.to_string())])
    }),
    map("debug", true, |v| match go_bool(v) {
        Some(true) => Ok(vec![("log-level", "debug".to_string())]),
        Some(false) => Ok(vec![]),
        None => Err(format!("invalid boolean {v:?}")),
    }),
    refuse(
        "log-package-levels",
        false,
        is_empty,
        "capnslog's package levels do not exist in Baton; give --log-level a tracing filter such as info,baton_raft=debug",
    ),
    // v3 gateway.
    refuse(
        "enable-grpc-gateway",
        true,
        is_true,
        "Baton always serves the JSON gateway (/v3/...) on its client URLs",
    ),
    // Experimental.
    native("experimental-initial-corrupt-check", true),
    native("experimental-corrupt-check-time", false),
    refuse("experimental-enable-v2v3", false, is_empty, "the v2 API is not provided"),
    map("experimental-backend-bbolt-freelist-type", false, |v| match v {
        // etcd's default; Baton's store is not bbolt, so no freelist type can be chosen.
        "array" => Ok(vec![]),
        "map" => Err("Baton's store is not bbolt; only the default, array, is accepted".into()),
        _ => Err(format!("invalid value {v:?}: array or map")),
    }),
    refuse(
        "experimental-enable-lease-checkpoint",
        true,
        is_true,
        "Baton always checkpoints lease TTLs (see --experimental-lease-checkpoint-interval)",
    ),
    refuse(
        "experimental-enable-lease-checkpoint-persist",
        true,
        is_true,
        "Baton always keeps checkpointed lease TTLs in its state",
    ),
    refuse(
        "experimental-compaction-batch-limit",
        false,
        |v| go_uint(v).is_some_and(|n| n == 0 || n == 1000),
        "Baton compacts in memory in one step; there are no batches to size",
    ),
    map("experimental-watch-progress-notify-interval", false, |v| {
        // Baton's flag counts whole seconds.
        match go_duration_ns(v) {
            Some(ns) if ns > 0 => Ok(vec![(
                "watch-progress-notify-interval",
                ns.div_ceil(1_000_000_000).to_string(),
            )]),
            _ => Err(format!("invalid duration {v:?}: a positive duration such as 10m")),
        }
    }),
    refuse(
        "experimental-warning-apply-duration",
        false,
        |v| go_duration_ns(v) == Some(100_000_000),
        "Baton's slow-apply threshold is fixed at etcd's default, 100ms",
    ),
    refuse(
        "unsafe-no-fsync",
        true,
        is_false,
        "Baton always fsyncs its log before acknowledging a write",
    ),
    native("force-new-cluster", true),
    // Ignored by etcd itself (old flags): accepted with a warning.
    ignored("cluster-active-size"),
    ignored("cluster-remove-delay"),
    ignored("cluster-sync-interval"),
    ignored("config"),
    ignored("force"),
    ignored("max-result-buffer"),
    ignored("max-retry-attempts"),
    ignored("peer-heartbeat-interval"),
    ignored("peer-election-timeout"),
    ignored("retry-interval"),
    ignored("snapshot"),
    ignored("v"),
    ignored("vv"),
];

fn uint_no_effect(v: &str) -> Result<Vec<(&'static str, String)>, String> {
    go_uint(v)
        .map(|_| vec![])
        .ok_or_else(|| format!("invalid value {v:?}: milliseconds expected"))
}

fn spec(name: &str) -> Option<&'static Spec> {
    ETCD_FLAGS.iter().find(|s| s.name == name)
}

/// The keys of etcd's config file besides flag names (`embed.configYAML`, `configProxy`).
const TRANSPORT_KEYS: [(&str, &str); 2] = [
    ("client-transport-security", ""),
    ("peer-transport-security", "peer-"),
];

/// Keys of etcd's config file whose Go type is `time.Duration` (YAML numbers are
/// nanoseconds there, as Go's JSON decoding of a Duration takes them).
const DURATION_KEYS: &[&str] = &[
    "backend-batch-interval",
    "grpc-keepalive-min-time",
    "grpc-keepalive-interval",
    "grpc-keepalive-timeout",
    "experimental-corrupt-check-time",
    "experimental-watch-progress-notify-interval",
    "experimental-warning-apply-duration",
];

/// Flags of etcd's flag set that its config file has no key for.
const NOT_IN_ETCD_CONFIG_FILE: &[&str] = &[
    "client-crl-file",
    "client-cert-allowed-hostname",
    "peer-crl-file",
    "peer-cert-allowed-cn",
    "peer-cert-allowed-hostname",
    "experimental-peer-skip-client-san-verification",
];

/// How clap's definition of `baton serve` takes each long flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClapArity {
    /// `--flag` only (clap's `SetTrue`).
    Switch,
    /// `--flag[=value]` (Baton's booleans).
    OptionalValue,
    /// `--flag value`.
    Value,
}

fn clap_flags(cmd: &clap::Command) -> BTreeMap<String, ClapArity> {
    cmd.get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            let arity = if !a.get_action().takes_values() {
                ClapArity::Switch
            } else if a.get_num_args().is_some_and(|n| n.min_values() == 0) {
                ClapArity::OptionalValue
            } else {
                ClapArity::Value
            };
            Some((long.to_string(), arity))
        })
        .collect()
}

/// One setting from the command line, the environment or the config file.
#[derive(Debug, Clone)]
struct Setting {
    name: String,
    /// `None`: a boolean given without a value (true).
    value: Option<String>,
}

/// Turns `baton serve`'s arguments (after `serve`), the process environment and, when named,
/// etcd's config file into clap's argv. `cmd` is clap's `serve` command; `read_file` reads
/// the config file (a parameter, for tests).
pub fn translate(
    args: &[String],
    env: &[(String, String)],
    cmd: &clap::Command,
    read_file: &dyn Fn(&Path) -> std::io::Result<String>,
) -> Result<Outcome, FlagError> {
    let clap = clap_flags(cmd);
    let parsed = parse_go_args(args, &clap)?;
    let mut warnings = Vec::new();
    let given = |name: &str| parsed.iter().rev().find(|s| s.name == name);
    if given("help").is_some() || given("h").is_some() {
        return Ok(Outcome::Serve {
            argv: vec!["baton".into(), "serve".into(), "--help".into()],
            warnings,
        });
    }
    if let Some(s) = given("version") {
        if s.value.as_deref().is_none_or(is_true) {
            return Ok(Outcome::Version);
        }
    }
    let env_value = |key: &str| {
        env.iter()
            .rev()
            .find(|(k, v)| k == key && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let config_file = match given("config-file") {
        Some(s) => s.value.clone().filter(|v| !v.is_empty()),
        None => env_value("ETCD_CONFIG_FILE"),
    };

    let settings: Vec<Setting> = if let Some(path) = config_file {
        // etcd: with a config file, "other configuration command line flags and environment
        // variables will be ignored if provided".
        let others: Vec<String> = parsed
            .iter()
            .filter(|s| s.name != "config-file")
            .map(|s| format!("--{}", s.name))
            .collect();
        if !others.is_empty() {
            warnings.push(format!(
                "a configuration file ({path}) is given: these command-line flags are ignored, as etcd ignores them: {}",
                others.join(" ")
            ));
        }
        let text = read_file(Path::new(&path))
            .map_err(|e| FlagError(format!("--config-file {path}: {e}")))?;
        config_file_settings(&path, &text, &clap)?
    } else {
        let mut settings = parsed;
        let on_command_line: Vec<String> = settings.iter().map(|s| s.name.clone()).collect();
        for s in ETCD_FLAGS.iter().map(|s| s.name).chain(["config-file"]) {
            let key = env_key(s);
            if let Some(v) = env_value(&key) {
                if on_command_line.iter().any(|n| n == s) {
                    return err(format!(
                        "conflicting environment variable {key:?} is shadowed by the command-line flag --{s} (unset one of them; etcd refuses both too)"
                    ));
                }
                settings.push(Setting {
                    name: s.to_string(),
                    value: Some(v),
                });
            }
        }
        for (k, v) in env {
            if k.starts_with("ETCD_")
                && !ETCD_FLAGS.iter().any(|s| env_key(s.name) == *k)
                && k != "ETCD_CONFIG_FILE"
            {
                warnings.push(format!("unrecognized environment variable {k}={v}"));
            }
        }
        settings
    };

    // Last value wins; first appearance keeps its place.
    let mut merged: Vec<Setting> = Vec::new();
    for s in settings {
        match merged.iter_mut().find(|m| m.name == s.name) {
            Some(m) => m.value = s.value,
            None => merged.push(s),
        }
    }

    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for s in merged {
        if s.name == "config-file" {
            continue;
        }
        let resolved: Vec<(String, Option<String>)> = match spec(&s.name) {
            None
            | Some(Spec {
                kind: Kind::Native, ..
            }) => vec![(s.name.clone(), s.value.clone())],
            // A refused flag that `ServeArgs` has come to define is implemented now: clap's.
            Some(Spec {
                kind: Kind::Refuse(..),
                ..
            }) if clap.contains_key(&s.name) => vec![(s.name.clone(), s.value.clone())],
            Some(sp) => {
                let value = match (&s.value, sp.bool) {
                    (Some(v), _) => v.clone(),
                    (None, true) => "true".to_string(),
                    (None, false) => return err(format!("flag needs an argument: --{}", s.name)),
                };
                match sp.kind {
                    Kind::Native => unreachable!("matched above"),
                    Kind::Ignored => {
                        warnings.push(format!(
                            "flag \"-{}\" is no longer supported - ignoring",
                            s.name
                        ));
                        vec![]
                    }
                    Kind::Refuse(ok, why) => {
                        if sp.bool && go_bool(&value).is_none() {
                            return err(format!("--{}: invalid boolean {value:?}", s.name));
                        }
                        if !ok(&value) {
                            return err(format!("--{}: {why}", s.name));
                        }
                        vec![]
                    }
                    Kind::Map(f) => f(&value)
                        .map_err(|why| FlagError(format!("--{}: {why}", s.name)))?
                        .into_iter()
                        .map(|(n, v)| (n.to_string(), Some(v)))
                        .collect(),
                }
            }
        };
        for (name, value) in resolved {
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some(o) => o.1 = value,
                None => out.push((name, value)),
            }
        }
    }

    let mut argv = vec!["baton".to_string(), "serve".to_string()];
    for (name, value) in out {
        let Some(arity) = clap.get(&name) else {
            // What Go's flag package says of a flag it does not know.
            return err(format!("flag provided but not defined: -{name}"));
        };
        match (arity, value) {
            (ClapArity::Switch, None) => argv.push(format!("--{name}")),
            (ClapArity::Switch, Some(v)) => match go_bool(&v) {
                Some(true) => argv.push(format!("--{name}")),
                Some(false) => {}
                None => return err(format!("--{name}: invalid boolean {v:?}")),
            },
            (ClapArity::OptionalValue, None) => argv.push(format!("--{name}=true")),
            (ClapArity::OptionalValue, Some(v)) => {
                // Baton's booleans are clap bools: Go's other spellings become true/false.
                let v = match go_bool(&v) {
                    Some(b) => b.to_string(),
                    None => return err(format!("--{name}: invalid boolean {v:?}")),
                };
                argv.push(format!("--{name}={v}"));
            }
            (ClapArity::Value, None) => return err(format!("flag needs an argument: --{name}")),
            (ClapArity::Value, Some(v)) => argv.push(format!("--{name}={v}")),
        }
    }
    Ok(Outcome::Serve { argv, warnings })
}

/// `ETCD_` + the flag's name in upper snake case (`flags.FlagToEnv`).
fn env_key(flag: &str) -> String {
    format!("ETCD_{}", flag.to_uppercase().replace('-', "_"))
}

/// Go's `flag` package's parse: `-name`, `--name`, `-name=value`, `--name value` (a
/// non-boolean), booleans only `--name` or `--name=value`; `--` or a non-flag argument ends
/// the flags, and etcd refuses anything after as "not a valid flag".
fn parse_go_args(
    args: &[String],
    clap: &BTreeMap<String, ClapArity>,
) -> Result<Vec<Setting>, FlagError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            if let Some(next) = args.get(i) {
                return err(format!("'{next}' is not a valid flag"));
            }
            break;
        }
        let Some(body) = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|b| !b.is_empty() && !b.starts_with('-') && !b.starts_with('='))
        else {
            return match arg.as_str() {
                "gateway" => err("gateway: etcd's `etcd gateway start` is `baton gateway start`"),
                "grpc-proxy" => err("grpc-proxy: etcd's gRPC proxy is not provided (clients can use the members' client URLs, or `baton gateway start` for a TCP proxy)"),
                _ => err(format!("'{arg}' is not a valid flag")),
            };
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (body.to_string(), None),
        };
        if !matches!(name.as_str(), "config-file" | "version" | "help" | "h")
            && spec(&name).is_none()
            && !clap.contains_key(&name)
        {
            return err(format!("flag provided but not defined: -{name}"));
        }
        let is_bool = match spec(&name) {
            Some(s) => s.bool,
            None => match clap.get(&name) {
                Some(ClapArity::Value) => false,
                Some(_) => true,
                None => matches!(name.as_str(), "help" | "h" | "version"),
            },
        } || name == "version";
        let value = match inline {
            Some(v) => Some(v),
            None if is_bool => None,
            None => match args.get(i) {
                Some(v) => {
                    i += 1;
                    Some(v.clone())
                }
                None => return err(format!("flag needs an argument: -{name}")),
            },
        };
        out.push(Setting { name, value });
    }
    Ok(out)
}

/// etcd's YAML config file as settings. Keys are etcd's (`embed.configYAML` and
/// `configProxy`) or Baton's own flags; any other key is an error (etcd ignores unknown keys
/// silently, which turns a misspelt key into a default nobody meant).
fn config_file_settings(
    path: &str,
    text: &str,
    clap: &BTreeMap<String, ClapArity>,
) -> Result<Vec<Setting>, FlagError> {
    let ctx = |msg: String| FlagError(format!("--config-file {path}: {msg}"));
    let docs = YamlLoader::load_from_str(text).map_err(|e| ctx(e.to_string()))?;
    let root = match docs.into_iter().next() {
        None | Some(Yaml::Null) => return Ok(Vec::new()),
        Some(Yaml::Hash(h)) => h,
        Some(_) => return Err(ctx("expected a mapping of etcd's configuration keys".into())),
    };
    let mut out = Vec::new();
    for (k, v) in root {
        let Yaml::String(key) = k else {
            return Err(ctx(format!("key {k:?} is not a string")));
        };
        if let Some((_, prefix)) = TRANSPORT_KEYS.iter().find(|(t, _)| *t == key) {
            let fields = match v {
                Yaml::Null => continue,
                Yaml::Hash(h) => h,
                _ => return Err(ctx(format!("{key}: expected a mapping"))),
            };
            for (fk, fv) in fields {
                let Yaml::String(field) = fk else {
                    return Err(ctx(format!("{key}: key {fk:?} is not a string")));
                };
                let flag = match field.as_str() {
                    "cert-file" | "key-file" | "client-cert-auth" | "trusted-ca-file"
                    | "auto-tls" => format!("{prefix}{field}"),
                    _ => {
                        return Err(ctx(format!(
                            "unknown key {key}.{field} (etcd's are cert-file, key-file, client-cert-auth, trusted-ca-file, auto-tls)"
                        )))
                    }
                };
                if let Some(value) =
                    scalar(&fv, false).map_err(|e| ctx(format!("{key}.{field}: {e}")))?
                {
                    out.push(Setting {
                        name: flag,
                        value: Some(value),
                    });
                }
            }
            continue;
        }
        let etcd_key = (spec(&key).is_some_and(|s| !matches!(s.kind, Kind::Ignored))
            && !NOT_IN_ETCD_CONFIG_FILE.contains(&key.as_str()))
            || key == "proxy";
        if !etcd_key && !clap.contains_key(&key) {
            return Err(ctx(format!("unknown key {key:?}")));
        }
        let duration = DURATION_KEYS.contains(&key.as_str());
        let value = match v {
            Yaml::Array(items) => {
                let mut parts = Vec::new();
                for item in &items {
                    if let Some(p) = scalar(item, false).map_err(|e| ctx(format!("{key}: {e}")))? {
                        parts.push(p);
                    }
                }
                Some(parts.join(","))
            }
            other => scalar(&other, duration).map_err(|e| ctx(format!("{key}: {e}")))?,
        };
        if let Some(value) = value {
            out.push(Setting {
                name: key,
                value: Some(value),
            });
        }
    }
    Ok(out)
}

/// A YAML scalar as a flag value; `None` for null. A duration key's number is nanoseconds.
fn scalar(v: &Yaml, duration: bool) -> Result<Option<String>, String> {
    Ok(Some(match v {
        Yaml::Null => return Ok(None),
        Yaml::String(s) => s.clone(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Integer(i) if duration => format!("{i}ns"),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Real(r) => r.clone(),
        _ => return Err("expected a single value".into()),
    }))
}

/// Go's `strconv.ParseBool`.
pub fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.ParseUint(v, 0, 64)` (decimal, `0x`, `0o`/`0`, `0b`).
fn go_uint(v: &str) -> Option<u64> {
    let v = v.replace('_', "");
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if let Some(b) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        u64::from_str_radix(b, 2).ok()
    } else if let Some(o) = v.strip_prefix("0o").or_else(|| v.strip_prefix("0O")) {
        u64::from_str_radix(o, 8).ok()
    } else if v.len() > 1 && v.starts_with('0') {
        u64::from_str_radix(&v[1..], 8).ok()
    } else {
        v.parse().ok()
    }
}

/// Go's `time.ParseDuration`, in nanoseconds (non-negative only: no etcd flag takes a
/// negative duration).
pub fn go_duration_ns(v: &str) -> Option<u64> {
    let mut s = v.trim().strip_prefix('+').unwrap_or(v.trim());
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !s.is_empty() {
        let num_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, rest) = s.split_at(num_end);
        if num.is_empty() || num == "." {
            return None;
        }
        let n: f64 = num.parse().ok()?;
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_end);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += n * scale;
        s = rest;
    }
    if total > u64::MAX as f64 {
        return None;
    }
    Some(total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd() -> clap::Command {
        use clap::CommandFactory;
        crate::Cli::command()
            .find_subcommand("serve")
            .expect("serve")
            .clone()
    }

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Outcome, FlagError> {
        run_with_file(args, env, "")
    }

    fn run_with_file(
        args: &[&str],
        env: &[(&str, &str)],
        file: &str,
    ) -> Result<Outcome, FlagError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let file = file.to_string();
        translate(&args, &env, &cmd(), &move |_| Ok(file.clone()))
    }

    fn argv(args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
        match run(args, env) {
            Ok(Outcome::Serve { argv, .. }) => argv[2..].to_vec(),
            other => panic!("{args:?}: {other:?}"),
        }
    }

    fn refusal(args: &[&str]) -> String {
        match run(args, &[]) {
            Err(FlagError(m)) => m,
            other => panic!("{args:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn go_syntax_forms_and_last_value_wins() {
        assert_eq!(
            argv(
                &[
                    "-name",
                    "a",
                    "--data-dir=/d",
                    "--name=b",
                    "-client-cert-auth",
                    "--snapshot-count",
                    "5"
                ],
                &[]
            ),
            vec![
                "--name=b",
                "--data-dir=/d",
                "--client-cert-auth=true",
                "--snapshot-count=5"
            ]
        );
        // Go's boolean spellings; a boolean takes no separate value.
        assert_eq!(
            argv(&["--auto-tls=F", "--strict-reconfig-check=0"], &[]),
            vec!["--auto-tls=false", "--strict-reconfig-check=false"]
        );
        assert_eq!(
            refusal(&["--auto-tls", "false"]),
            "'false' is not a valid flag"
        );
        assert_eq!(refusal(&["--name"]), "flag needs an argument: -name");
        assert_eq!(
            refusal(&["--no-such-flag=1"]),
            "flag provided but not defined: -no-such-flag"
        );
        assert_eq!(
            refusal(&["--no-such-flag"]),
            "flag provided but not defined: -no-such-flag"
        );
        assert_eq!(
            refusal(&["--name", "a", "--", "x"]),
            "'x' is not a valid flag"
        );
        // Baton's own flags pass through.
        assert_eq!(
            argv(&["--worker-threads", "2"], &[]),
            vec!["--worker-threads=2"]
        );
    }

    #[test]
    fn refused_flags_name_themselves_and_why_unless_harmless() {
        assert_eq!(
            refusal(&["--enable-v2"]),
            "--enable-v2: the v2 API is not provided"
        );
        assert_eq!(
            refusal(&["--enable-v2=true"]),
            "--enable-v2: the v2 API is not provided"
        );
        assert!(argv(&["--enable-v2=false"], &[]).is_empty());
        assert!(refusal(&["--wal-dir", "/w"])
            .starts_with("--wal-dir: Baton keeps its Raft log inside --data-dir"));
        assert!(argv(&["--wal-dir="], &[]).is_empty());
        assert!(refusal(&["--proxy", "on"]).starts_with("--proxy: etcd's v2 proxy is not provided"));
        assert!(argv(&["--proxy=off", "--proxy-dial-timeout=10"], &[]).is_empty());
        assert!(refusal(&["--discovery=https://discovery.etcd.io/x"]).starts_with("--discovery: "));
        assert!(refusal(&["--max-txn-ops=10"]).starts_with("--max-txn-ops: "));
        assert!(argv(&["--max-txn-ops=128", "--max-request-bytes=1572864"], &[]).is_empty());
        assert!(refusal(&["--enable-pprof"]).starts_with("--enable-pprof: "));
        assert!(refusal(&["--pre-vote=false"]).starts_with("--pre-vote: "));
        assert!(argv(&["--pre-vote"], &[]).is_empty());
        assert!(refusal(&["--unsafe-no-fsync"]).starts_with("--unsafe-no-fsync: "));
        assert!(refusal(&["--enable-v2=maybe"]).contains("invalid boolean"));
        // Every refusal is one line.
        for s in ETCD_FLAGS {
            if let Kind::Refuse(_, why) = s.kind {
                assert!(!why.contains('\n'), "{}", s.name);
            }
        }
    }

    /// A refused flag that a later change defines in `ServeArgs` goes to clap, unrefused.
    #[test]
    fn a_refused_flag_that_serve_comes_to_define_is_passed_on() {
        let extended = cmd().arg(
            clap::Arg::new("corrupt_check_time")
                .long("experimental-corrupt-check-time")
                .num_args(1),
        );
        let out = translate(
            &["--experimental-corrupt-check-time".into(), "5m".into()],
            &[],
            &extended,
            &|_| unreachable!(),
        );
        assert_eq!(
            out,
            Ok(Outcome::Serve {
                argv: vec![
                    "baton".into(),
                    "serve".into(),
                    "--experimental-corrupt-check-time=5m".into()
                ],
                warnings: vec![],
            })
        );
    }

    #[test]
    fn mapped_flags_become_batons() {
        assert_eq!(
            argv(
                &["--experimental-watch-progress-notify-interval=1m30s"],
                &[]
            ),
            vec!["--watch-progress-notify-interval=90"]
        );
        assert_eq!(
            argv(&["--log-level", "fatal"], &[]),
            vec!["--log-level=error"]
        );
        assert_eq!(argv(&["--debug"], &[]), vec!["--log-level=debug"]);
        assert_eq!(
            argv(
                &["--logger=zap", "--metrics=extensive", "--max-snapshots=5"],
                &[]
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            argv(&["--log-output=stdout"], &[]),
            vec!["--log-outputs=stdout"]
        );
        assert!(refusal(&["--logger=glog"]).starts_with("--logger: invalid value"));
    }

    #[test]
    fn ignored_flags_warn() {
        match run(&["-v", "--name=a"], &[]).unwrap() {
            Outcome::Serve { argv, warnings } => {
                assert_eq!(argv[2..], ["--name=a"]);
                assert_eq!(
                    warnings,
                    vec!["flag \"-v\" is no longer supported - ignoring"]
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn environment_fills_what_the_command_line_does_not_give() {
        assert_eq!(
            argv(
                &["--name=a"],
                &[
                    ("ETCD_DATA_DIR", "/d"),
                    ("ETCD_CLIENT_CERT_AUTH", "true"),
                    ("ETCD_ENABLE_V2", "false"),
                    ("ETCD_SNAPSHOT_COUNT", "")
                ]
            ),
            vec!["--name=a", "--data-dir=/d", "--client-cert-auth=true"]
        );
        assert!(run(&["--name=a"], &[("ETCD_NAME", "b")])
            .unwrap_err()
            .0
            .starts_with("conflicting environment variable \"ETCD_NAME\""));
        assert_eq!(
            refusal_env(&[("ETCD_ENABLE_V2", "true")]),
            "--enable-v2: the v2 API is not provided"
        );
        match run(&[], &[("ETCD_NO_SUCH", "x"), ("ETCDCTL_API", "3")]).unwrap() {
            Outcome::Serve { warnings, .. } => assert_eq!(
                warnings,
                vec!["unrecognized environment variable ETCD_NO_SUCH=x"]
            ),
            other => panic!("{other:?}"),
        }
    }

    fn refusal_env(env: &[(&str, &str)]) -> String {
        run(&[], env).unwrap_err().0
    }

    const YAML: &str = "
name: 'm1'
data-dir: /var/lib/etcd
listen-client-urls: http://127.0.0.1:2379
initial-cluster-state: 'new'
enable-v2: false
snapshot-count: 5000
grpc-keepalive-interval: 7200000000000
log-outputs: [stderr]
proxy: 'off'
client-transport-security:
  cert-file: /c.pem
  client-cert-auth: true
peer-transport-security:
  auto-tls: true
";

    #[test]
    fn config_file_replaces_flags_and_environment() {
        match run_with_file(
            &["--config-file=/etc/etcd.yml", "--name=ignored"],
            &[("ETCD_DATA_DIR", "/ignored")],
            YAML,
        )
        .unwrap()
        {
            Outcome::Serve { argv, warnings } => {
                assert_eq!(
                    argv[2..],
                    [
                        "--name=m1",
                        "--data-dir=/var/lib/etcd",
                        "--listen-client-urls=http://127.0.0.1:2379",
                        "--initial-cluster-state=new",
                        "--snapshot-count=5000",
                        "--grpc-keepalive-interval=7200000000000ns",
                        "--log-outputs=stderr",
                        "--cert-file=/c.pem",
                        "--client-cert-auth=true",
                        "--peer-auto-tls=true",
                    ]
                );
                assert_eq!(warnings.len(), 1, "{warnings:?}");
                assert!(warnings[0].contains("--name"), "{warnings:?}");
            }
            other => panic!("{other:?}"),
        }
        // ETCD_CONFIG_FILE names it too.
        assert!(
            matches!(run_with_file(&[], &[("ETCD_CONFIG_FILE", "/f")], "name: x\n"), Ok(Outcome::Serve { argv, .. }) if argv[2..] == ["--name=x"])
        );
        let e = run_with_file(&["--config-file=/f"], &[], "name: x\nnmae: y\n").unwrap_err();
        assert_eq!(e.0, "--config-file /f: unknown key \"nmae\"");
        let e = run_with_file(
            &["--config-file=/f"],
            &[],
            "client-transport-security:\n  crt-file: x\n",
        )
        .unwrap_err();
        assert!(
            e.0.contains("unknown key client-transport-security.crt-file"),
            "{e}"
        );
        let e = run_with_file(&["--config-file=/f"], &[], "enable-v2: true\n").unwrap_err();
        assert_eq!(e.0, "--enable-v2: the v2 API is not provided");
        assert!(run_with_file(&["--config-file=/f"], &[], "name: [\n")
            .unwrap_err()
            .0
            .starts_with("--config-file /f: "));
    }

    #[test]
    fn version_and_help() {
        assert_eq!(run(&["--version"], &[]).unwrap(), Outcome::Version);
        assert_eq!(run(&["-version"], &[]).unwrap(), Outcome::Version);
        assert!(
            matches!(run(&["-h"], &[]).unwrap(), Outcome::Serve { argv, .. } if argv[2..] == ["--help"])
        );
    }

    #[test]
    fn go_durations_and_uints() {
        assert_eq!(go_duration_ns("1h2m3.5s"), Some(3_723_500_000_000));
        assert_eq!(go_duration_ns("100ms"), Some(100_000_000));
        assert_eq!(go_duration_ns("0"), Some(0));
        assert_eq!(go_duration_ns("10"), None);
        assert_eq!(go_duration_ns("5x"), None);
        for bad in ["", "s", "-1s", "1.2.3s"] {
            assert_eq!(go_duration_ns(bad), None, "{bad:?}");
        }
        assert_eq!(go_duration_ns("2.5s"), Some(2_500_000_000));
        assert_eq!(go_uint("0x10"), Some(16));
        assert_eq!(go_uint("010"), Some(8));
        assert_eq!(go_uint("-1"), None);
    }

    /// Every etcd flag the table lets through to clap is one `baton serve` defines.
    #[test]
    fn native_flags_are_clap_flags() {
        let clap = clap_flags(&cmd());
        for s in ETCD_FLAGS {
            if matches!(s.kind, Kind::Native) {
                assert!(clap.contains_key(s.name), "--{} is not a clap flag", s.name);
            }
            if let Kind::Map(f) = s.kind {
                // Mapped flags produce flags clap knows, with a typical value.
                let sample = if s.bool { "true" } else { "" };
                if let Ok(pairs) = f(sample) {
                    for (n, _) in pairs {
                        assert!(clap.contains_key(n), "--{} maps to unknown --{n}", s.name);
                    }
                }
            }
        }
    }
}
