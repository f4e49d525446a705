//! `baton lock NAME [-- CMD ARGS...]`: hold a lock while a command runs.
//!
//! Lifecycle, on `baton-client`: a `Session` (a lease kept alive, with the client's
//! pessimistic expiry estimate) → [`Mutex::acquire_with`] (on Baton `baton.v1.Lock/Acquire`,
//! FIFO, the server wakes exactly the next waiter; on etcd etcd's client-side recipe) → run
//! CMD with the key and fencing token in its environment → on CMD's exit
//! [`Guard::release`] (checks the token) and close the session (revoking the lease). If the
//! lock is lost while CMD runs ([`Guard::lost`]: lease expired or revoked, the local
//! estimate passed, the key deleted by an operator) CMD is stopped: SIGTERM to its process
//! group, SIGKILL after `--kill-after`.

use std::time::Duration;

use anyhow::Result;
use baton_client::{Client, Error, Guard, LockOptions, Mutex};
use clap::Args;

use super::args::{parse_duration, EndpointArgs};
use super::child::{exit_code, Child};
use super::client::describe;
use super::exit::{EXIT_ERROR, EXIT_LOST, EXIT_NOT_ACQUIRED};
use super::output::hex;
use super::session::{close, describe_loss};
use super::signals::Signals;

#[derive(Args, Debug)]
#[command(
    about = "Hold a lock while a command runs (or until Ctrl-C), with a fencing token",
    long_about = "Hold a named lock while a command runs, or until Ctrl-C if no command is \
                  given.\n\n\
                  Waiters queue in arrival order. While CMD runs, its environment has \
                  BATON_LOCK_KEY (this holder's key), BATON_FENCING_TOKEN (a number that grows \
                  with every new holder: pass it to whatever you write to, so late writes of \
                  an old holder can be refused), BATON_LOCK_NAME, BATON_LEASE_ID and \
                  BATON_ENDPOINTS; and the token's signature by the cluster's key: \
                  BATON_FENCING_SIGNATURE (128 hex digits), BATON_FENCING_KEY_ID, \
                  BATON_FENCING_REVISION and BATON_FENCING_LEASE (decimal), over the lock name, \
                  token, lease and revision (see `baton fence`), so a resource can refuse \
                  forged tokens.\n\n\
                  The lock lives as long as a lease that `baton lock` keeps alive. If the lease \
                  is lost (this process was paused or cut off for longer than --ttl, or an \
                  operator released the lock), CMD is stopped: SIGTERM to its process group, \
                  then SIGKILL after --kill-after. Stopping CMD is best effort; only the \
                  fencing token protects against a write that is already on its way (see \
                  docs/locks.md).\n\n\
                  Without CMD, prints BATON_LOCK_KEY=… and BATON_FENCING_TOKEN=… on stdout and \
                  holds the lock until Ctrl-C or SIGTERM.\n\n\
                  Exit status: CMD's status (128+N if it died of signal N); 73 if the lock was \
                  not obtained (--try, --timeout); 75 if the lock was lost while held; 1 for \
                  other errors; 130/143 if interrupted while CMD ran.",
    after_help = "Examples:\n  \
                  baton lock nightly-report -- ./report.sh\n  \
                  baton lock --timeout 30s --ttl 5 deploy -- sh -c 'exec ./deploy \"$BATON_FENCING_TOKEN\"'\n  \
                  baton lock --try cron-job -- ./job || echo \"someone else is running it\""
)]
pub struct LockArgs {
    /// Name of the lock; everyone using the same name excludes each other.
    pub name: String,
    /// Lease time-to-live in seconds: how long the lock survives this process being paused,
    /// crashed or cut off before others may take it.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub ttl: i64,
    /// Give up if the lock is not obtained within this time (exit 73). Default: wait forever.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Option<Duration>,
    /// Fail at once (exit 73) if someone else holds the lock.
    #[arg(long = "try")]
    pub try_only: bool,
    /// After a holder's lease *expires* (it crashed or hung; not a clean release), keep the
    /// lock free for this long so its delayed writes drain. Recorded per lock.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub lock_delay: Option<Duration>,
    /// Grace period between SIGTERM and SIGKILL when CMD must be stopped.
    #[arg(long, value_parser = parse_duration, default_value = "5s", value_name = "DURATION")]
    pub kill_after: Duration,
    #[command(flatten)]
    pub endpoints: EndpointArgs,
    /// The command to run while holding the lock (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs `baton lock`; returns the process exit status.
pub async fn run(args: LockArgs) -> i32 {
    match run_inner(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("baton lock: {e:#}");
            EXIT_ERROR
        }
    }
}

const WHO: &str = "baton lock";

async fn run_inner(args: LockArgs) -> Result<i32> {
    let mut signals = Signals::install()?;
    let (client, session) = super::session::start(&args.endpoints, args.ttl).await?;
    let name = args.name.clone();

    let mut options = LockOptions::new();
    if let Some(t) = args.timeout {
        options = options.with_timeout(t);
    }
    if args.try_only {
        options = options.try_only();
    }
    if let Some(d) = args.lock_delay {
        options = options.with_lock_delay(d);
    }
    // Dropping the acquisition (Ctrl-C) cancels it, which on Baton deletes our waiter key
    // on the server; closing the session (revoking the lease) deletes it too, so the queue
    // moves on either way.
    let mutex = Mutex::new(&session);
    let acquired = tokio::select! {
        r = mutex.acquire_with(name.clone(), options) => r,
        sig = signals.recv() => {
            eprintln!("{WHO}: interrupted while waiting for '{name}'; giving up");
            close(&session, WHO, false).await;
            return Ok(128 + sig);
        }
    };
    let guard = match acquired {
        Ok(g) => g,
        Err(e) => {
            let code = not_acquired_code(&e);
            let msg = match e {
                Error::SessionLost(reason) => format!(
                    "lost the lease while waiting for '{name}': {}",
                    describe_loss(reason, &session)
                ),
                e if code == EXIT_NOT_ACQUIRED => {
                    let mut msg = format!("'{name}' was not obtained: {e}");
                    if matches!(e, Error::Timeout(_)) {
                        // "Not within 30 s" cannot name the holder; ask who it is.
                        if let Some(holder) = describe_holder(&client, &name).await {
                            msg.push_str(&format!(" ({holder})"));
                        }
                    }
                    msg
                }
                e => format!("acquiring '{name}': {:#}", describe(e)),
            };
            eprintln!("{WHO}: {msg}");
            close(&session, WHO, false).await;
            return Ok(code);
        }
    };
    let key = String::from_utf8_lossy(guard.key()).into_owned();
    let token = guard.fencing_token();
    // A lock ends either with its session or with its key; `lost` watches both.
    let lost = guard.lost();
    tokio::pin!(lost);

    if args.command.is_empty() {
        println!("BATON_LOCK_KEY={key}");
        println!("BATON_FENCING_TOKEN={token}");
        eprintln!(
            "{WHO}: holding '{name}' (fencing token {token}, lease TTL {} s); Ctrl-C releases it",
            session.ttl().as_secs()
        );
        let lost = tokio::select! {
            _ = signals.recv() => None,
            reason = &mut lost => Some(reason),
        };
        if let Some(reason) = lost {
            eprintln!(
                "{WHO}: LOST the lock '{name}' (token {token}): {}",
                describe_loss(reason, &session)
            );
            close(&session, WHO, false).await;
            return Ok(EXIT_LOST);
        }
        let released = release(guard).await;
        close(&session, WHO, true).await;
        if let Released::NotHolder(why) = released {
            eprintln!("{WHO}: LOST the lock '{name}' before releasing it: {why}");
            return Ok(EXIT_LOST);
        }
        return Ok(0);
    }

    let signed = guard.signed_token();
    let env = [
        ("BATON_LOCK_NAME", name.clone()),
        ("BATON_LOCK_KEY", key.clone()),
        ("BATON_FENCING_TOKEN", token.to_string()),
        ("BATON_LEASE_ID", hex(session.lease())),
        ("BATON_ENDPOINTS", args.endpoints.endpoints.join(",")),
        // What the signature covers, in the forms a verifier reads: the signature and key
        // id, the lease in decimal (BATON_LEASE_ID is etcd's hex) and the grant revision.
        // Empty against a server that signs nothing (etcd).
        (
            "BATON_FENCING_SIGNATURE",
            signed
                .and_then(|s| s.signature.as_ref())
                .map(|s| s.to_hex())
                .unwrap_or_default(),
        ),
        (
            "BATON_FENCING_KEY_ID",
            signed.map(|s| s.key_id.to_string()).unwrap_or_default(),
        ),
        (
            "BATON_FENCING_LEASE",
            signed.map(|s| s.lease.to_string()).unwrap_or_default(),
        ),
        (
            "BATON_FENCING_REVISION",
            signed.map(|s| s.revision.to_string()).unwrap_or_default(),
        ),
    ];
    let mut child = match Child::spawn(&args.command, &env) {
        Ok(c) => c,
        Err(e) => {
            release(guard).await;
            close(&session, WHO, false).await;
            return Err(e);
        }
    };
    enum Event {
        Exited(std::process::ExitStatus),
        Lost(String),
        Signal(i32),
    }
    let event = tokio::select! {
        st = child.wait() => Event::Exited(st),
        reason = &mut lost => Event::Lost(describe_loss(reason, &session)),
        sig = signals.recv() => Event::Signal(sig),
    };
    match event {
        Event::Exited(status) => {
            // The command may have finished after the lock was lost without this process
            // noticing (it was paused, say): the release tells. A lost lock is never reported
            // as success.
            let released = release(guard).await;
            close(&session, WHO, true).await;
            if let Released::NotHolder(why) = released {
                eprintln!(
                    "{WHO}: LOST the lock '{name}' (token {token}) before the command ended \
                     with status {}: {why}; exiting with {EXIT_LOST}",
                    exit_code(status)
                );
                return Ok(EXIT_LOST);
            }
            Ok(exit_code(status))
        }
        Event::Lost(reason) => {
            eprintln!(
                "{WHO}: LOST the lock '{name}' (token {token}): {reason}\n{WHO}: stopping \
                 the command (SIGTERM, SIGKILL after {:.1} s)",
                args.kill_after.as_secs_f64()
            );
            let status = child.stop(args.kill_after).await;
            eprintln!(
                "{WHO}: the command ended with status {}; exiting with {EXIT_LOST} (lock lost)",
                exit_code(status)
            );
            // The lease may still be alive if we only lost contact; give it up.
            drop(guard);
            close(&session, WHO, false).await;
            Ok(EXIT_LOST)
        }
        Event::Signal(sig) => {
            eprintln!(
                "{WHO}: got {}; stopping the command and releasing '{name}'",
                if sig == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                }
            );
            child.stop(args.kill_after).await;
            release(guard).await;
            close(&session, WHO, true).await;
            Ok(128 + sig)
        }
    }
}

/// Which exit status a failed acquisition maps to: "not obtained" (73) for a refused
/// try-lock (held, or in lock-delay) or an expired --timeout, a plain error otherwise
/// (including a lease that died while waiting).
fn not_acquired_code(e: &Error) -> i32 {
    match e {
        Error::WouldBlock { .. } | Error::LockDelayed | Error::Timeout(_) => EXIT_NOT_ACQUIRED,
        _ => EXIT_ERROR,
    }
}

/// "holder KEY, token N, K waiting" for the error message of a lock that was not obtained
/// (Baton only; `None` if the server cannot say).
async fn describe_holder(client: &Client, name: &str) -> Option<String> {
    let resp = tokio::time::timeout(Duration::from_secs(2), client.inspect_lock(name))
        .await
        .ok()?
        .ok()?;
    let holder = resp.holder?;
    Some(format!(
        "holder {}, token {}, {} waiting",
        String::from_utf8_lossy(&holder.key),
        holder.create_revision,
        resp.waiter_count
    ))
}

/// What a release found out about the lock.
enum Released {
    /// The key still held the lock with our token: it was held without a break until now.
    Cleanly,
    /// The server says we no longer held it: it was lost at some point before the release
    /// (for example while this process was paused), whatever the command believed.
    NotHolder(String),
    /// No answer; closing the session right after deletes the key anyway.
    Unknown,
}

/// Releases the lock with its token (a clean release: no lock-delay for the next holder).
async fn release(guard: Guard) -> Released {
    match guard.release().await {
        Ok(()) => Released::Cleanly,
        Err(Error::NotHolder) => Released::NotHolder(
            "releasing the lock: the key no longer holds it with this token".to_string(),
        ),
        Err(Error::SessionLost(reason)) => {
            Released::NotHolder(format!("releasing the lock: {reason}"))
        }
        Err(e) => {
            eprintln!("{WHO}: warning: releasing the lock: {:#}", describe(e));
            Released::Unknown
        }
    }
}
