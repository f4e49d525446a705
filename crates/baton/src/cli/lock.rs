//! `baton lock NAME [-- CMD ARGS...]`: hold a lock while a command runs.
//!
//! Lifecycle: grant a lease and keep it alive → `baton.v1.Lock/Acquire` (FIFO, the server
//! wakes exactly the next waiter) → run CMD with the key and fencing token in its
//! environment → on CMD's exit `Release(key, token)` and revoke the lease. If the lock is
//! lost while CMD runs (lease expired or revoked, key deleted by an operator) CMD is
//! stopped: SIGTERM to its process group, SIGKILL after `--kill-after`.

use std::time::Duration;

use anyhow::Result;
use baton_proto::baton::v1::{
    lock_client::LockClient, AcquireRequest, AcquireResponse, InspectRequest, ReleaseRequest,
};
use clap::Args;
use tonic::transport::Channel;

use super::child::{exit_code, Child};
use super::connect::connect;
use super::session::Session;
use super::{
    describe_status, parse_duration, EndpointArgs, Signals, EXIT_ERROR, EXIT_LOST,
    EXIT_NOT_ACQUIRED,
};

#[derive(Args, Debug)]
#[command(
    about = "Hold a lock while a command runs (or until Ctrl-C), with a fencing token",
    long_about = "Hold a named lock while a command runs, or until Ctrl-C if no command is \
                  given.\n\n\
                  Waiters queue in arrival order. While CMD runs, its environment has \
                  BATON_LOCK_KEY (this holder's key), BATON_FENCING_TOKEN (a number that grows \
                  with every new holder: pass it to whatever you write to, so late writes of \
                  an old holder can be refused), BATON_LOCK_NAME, BATON_LEASE_ID and \
                  BATON_ENDPOINTS.\n\n\
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

async fn run_inner(args: LockArgs) -> Result<i32> {
    let mut signals = Signals::install()?;
    let (channel, _endpoint) = connect(&args.endpoints.endpoints).await?;
    let mut session = Session::grant(channel.clone(), args.ttl).await?;
    let name = args.name.clone();

    let mut locks = LockClient::new(channel.clone());
    let request = AcquireRequest {
        name: name.clone().into_bytes(),
        lease: session.lease_id,
        timeout_ms: args.timeout.map_or(0, |d| d.as_millis().max(1) as i64),
        try_only: args.try_only,
        lock_delay_ms: args.lock_delay.map_or(0, |d| d.as_millis() as i64),
    };
    // Cancelling the Acquire (Ctrl-C, lost lease) deletes our waiter key on the server; the
    // lease revoke below deletes it too, so the queue moves on either way.
    let acquired = tokio::select! {
        r = locks.acquire(request) => r,
        reason = session.lost() => {
            eprintln!("baton lock: lost the lease while waiting for '{name}': {reason}");
            let _ = session.revoke().await;
            return Ok(EXIT_ERROR);
        }
        sig = signals.recv() => {
            eprintln!("baton lock: interrupted while waiting for '{name}'; giving up");
            let _ = session.revoke().await;
            return Ok(128 + sig);
        }
    };
    let held = match acquired {
        Ok(r) => r.into_inner(),
        Err(status) => {
            let code = not_acquired_code(&args, &status);
            let mut msg = if code == EXIT_NOT_ACQUIRED {
                format!("'{name}' was not obtained: {}", status.message())
            } else {
                describe_status(&format!("acquiring '{name}'"), &status)
            };
            if code == EXIT_NOT_ACQUIRED && !args.try_only {
                // The timeout message cannot name the holder; ask who it is.
                if let Some(holder) = describe_holder(&mut locks, &name).await {
                    msg.push_str(&format!(" ({holder})"));
                }
            }
            eprintln!("baton lock: {msg}");
            let _ = session.revoke().await;
            return Ok(code);
        }
    };
    let key = String::from_utf8_lossy(&held.key).into_owned();

    // A lock ends either with its lease or with its key; watch both.
    let key_gone = super::watch::key_deleted(channel.clone(), held.key.clone(), held.fencing_token);
    tokio::pin!(key_gone);

    if args.command.is_empty() {
        println!("BATON_LOCK_KEY={key}");
        println!("BATON_FENCING_TOKEN={}", held.fencing_token);
        eprintln!(
            "baton lock: holding '{name}' (fencing token {}, lease TTL {} s); Ctrl-C releases it",
            held.fencing_token,
            session.ttl.as_secs()
        );
        let lost = tokio::select! {
            _ = signals.recv() => None,
            reason = session.lost() => Some(reason),
            reason = &mut key_gone => Some(reason),
        };
        if let Some(reason) = lost {
            eprintln!(
                "baton lock: LOST the lock '{name}' (token {}): {reason}",
                held.fencing_token
            );
            let _ = session.revoke().await;
            return Ok(EXIT_LOST);
        }
        let released = release(&mut locks, &held).await;
        session.revoke().await.unwrap_or_else(warn);
        if let Released::NotHolder(why) = released {
            eprintln!("baton lock: LOST the lock '{name}' before releasing it: {why}");
            return Ok(EXIT_LOST);
        }
        return Ok(0);
    }

    let env = [
        ("BATON_LOCK_NAME", name.clone()),
        ("BATON_LOCK_KEY", key.clone()),
        ("BATON_FENCING_TOKEN", held.fencing_token.to_string()),
        ("BATON_LEASE_ID", format!("{:x}", held.lease)),
        ("BATON_ENDPOINTS", args.endpoints.endpoints.join(",")),
    ];
    let mut child = match Child::spawn(&args.command, &env) {
        Ok(c) => c,
        Err(e) => {
            release(&mut locks, &held).await;
            let _ = session.revoke().await;
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
        reason = session.lost() => Event::Lost(reason),
        reason = &mut key_gone => Event::Lost(reason),
        sig = signals.recv() => Event::Signal(sig),
    };
    match event {
        Event::Exited(status) => {
            // The command may have finished after the lock was lost without this process
            // noticing (it was paused, say): the release tells. A lost lock is never reported
            // as success.
            let released = release(&mut locks, &held).await;
            session.revoke().await.unwrap_or_else(warn);
            if let Released::NotHolder(why) = released {
                eprintln!(
                    "baton lock: LOST the lock '{name}' (token {}) before the command ended                      with status {}: {why}; exiting with {EXIT_LOST}",
                    held.fencing_token,
                    exit_code(status)
                );
                return Ok(EXIT_LOST);
            }
            Ok(exit_code(status))
        }
        Event::Lost(reason) => {
            eprintln!(
                "baton lock: LOST the lock '{name}' (token {}): {reason}\nbaton lock: stopping \
                 the command (SIGTERM, SIGKILL after {:.1} s)",
                held.fencing_token,
                args.kill_after.as_secs_f64()
            );
            let status = child.stop(args.kill_after).await;
            eprintln!(
                "baton lock: the command ended with status {}; exiting with {EXIT_LOST} (lock \
                 lost)",
                exit_code(status)
            );
            // The lease may still be alive if we only lost contact; give it up.
            let _ = session.revoke().await;
            Ok(EXIT_LOST)
        }
        Event::Signal(sig) => {
            eprintln!(
                "baton lock: got {}; stopping the command and releasing '{name}'",
                if sig == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                }
            );
            child.stop(args.kill_after).await;
            release(&mut locks, &held).await;
            session.revoke().await.unwrap_or_else(warn);
            Ok(128 + sig)
        }
    }
}

/// Which exit status a failed Acquire maps to: "not obtained" (73) for a refused try-lock
/// (held, or in lock-delay) or an expired --timeout, a plain error otherwise (including a
/// lease that died while waiting).
fn not_acquired_code(args: &LockArgs, status: &tonic::Status) -> i32 {
    use tonic::Code;
    match status.code() {
        Code::FailedPrecondition
            if args.try_only
                && (status.message().contains("is held by")
                    || status.message().contains("lock-delay")) =>
        {
            EXIT_NOT_ACQUIRED
        }
        Code::DeadlineExceeded if args.timeout.is_some() => EXIT_NOT_ACQUIRED,
        _ => EXIT_ERROR,
    }
}

/// "held by KEY (token N)" for the error message of a lock that was not obtained.
async fn describe_holder(locks: &mut LockClient<Channel>, name: &str) -> Option<String> {
    let call = locks.inspect(InspectRequest {
        name: name.as_bytes().to_vec(),
    });
    let resp = tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .ok()?
        .ok()?
        .into_inner();
    let holder = resp.holder?;
    Some(format!(
        "holder {}, token {}, {} waiting",
        String::from_utf8_lossy(&holder.key),
        holder.create_revision,
        resp.waiters.len()
    ))
}

/// What a release found out about the lock.
enum Released {
    /// The key still held the lock with our token: it was held without a break until now.
    Cleanly,
    /// The server says we no longer held it: it was lost at some point before the release
    /// (for example while this process was paused), whatever the command believed.
    NotHolder(String),
    /// No answer; revoking the lease right after deletes the key anyway.
    Unknown,
}

/// Releases the lock with its token (a clean release: no lock-delay for the next holder).
async fn release(locks: &mut LockClient<Channel>, held: &AcquireResponse) -> Released {
    let call = locks.release(ReleaseRequest {
        key: held.key.clone(),
        fencing_token: held.fencing_token,
    });
    match tokio::time::timeout(Duration::from_secs(3), call).await {
        Ok(Ok(_)) => Released::Cleanly,
        Ok(Err(s)) if s.code() == tonic::Code::FailedPrecondition => {
            Released::NotHolder(describe_status("releasing the lock", &s))
        }
        Ok(Err(s)) => {
            warn(anyhow::anyhow!(describe_status("releasing the lock", &s)));
            Released::Unknown
        }
        Err(_) => {
            warn(anyhow::anyhow!("releasing the lock: no answer within 3 s"));
            Released::Unknown
        }
    }
}

fn warn(e: anyhow::Error) {
    eprintln!("baton lock: warning: {e:#}");
}
