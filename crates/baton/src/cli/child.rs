//! The command `baton lock` runs while holding the lock.
//!
//! The command gets its own process group so that "stop the command" reaches everything it
//! started: `sh -c 'a | b'` or a script that forks workers would otherwise leave children
//! running — and writing — after the lock is gone. If `baton lock` runs in the foreground of
//! a terminal, the command's group is made the terminal's foreground group (as a shell does
//! for a job), so interactive commands can still read the terminal and Ctrl-C reaches them.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// A running command in its own process group.
pub struct Child {
    child: tokio::process::Child,
    /// The process group id (= the command's pid).
    pgid: i32,
    /// Whether we handed the terminal to the command and must take it back.
    took_terminal: bool,
    status: Option<ExitStatus>,
}

impl Child {
    /// Starts `argv` with `env` added to this process's environment.
    pub fn spawn(argv: &[String], env: &[(&str, String)]) -> Result<Child> {
        let Some((program, args)) = argv.split_first() else {
            bail!("no command given");
        };
        let foreground = we_own_the_terminal();
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).envs(env.iter().map(|(k, v)| (*k, v)));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if foreground {
                    // A background group calling tcsetpgrp gets SIGTTOU; ignore it for the
                    // call and restore the default so the command starts with clean
                    // dispositions.
                    libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(0, libc::getpid());
                    libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start `{program}`"))?;
        let pgid = child.id().context("the command exited before it started")? as i32;
        Ok(Child {
            child,
            pgid,
            took_terminal: foreground,
            status: None,
        })
    }

    /// Sends `signal` to the command's whole process group.
    pub fn signal(&self, signal: i32) {
        // SAFETY: plain syscall. ESRCH (group already gone) is fine to ignore.
        unsafe {
            libc::kill(-self.pgid, signal);
        }
    }

    /// Waits for the command to exit (cancel-safe: can be used in `select!`).
    pub async fn wait(&mut self) -> ExitStatus {
        if let Some(st) = self.status {
            return st;
        }
        let st = match self.child.wait().await {
            Ok(st) => st,
            // Only fails if the child was already reaped elsewhere; treat as killed.
            Err(_) => ExitStatus::from_raw(libc::SIGKILL),
        };
        self.status = Some(st);
        self.reclaim_terminal();
        st
    }

    /// SIGTERM to the group, then SIGKILL to the group after `kill_after` if the command has
    /// not exited. Returns the command's status.
    ///
    /// The SIGKILL goes to the group even if the command itself exited in time, so that no
    /// straggler it started keeps working without the lock.
    pub async fn stop(&mut self, kill_after: Duration) -> ExitStatus {
        if self.status.is_none() {
            self.signal(libc::SIGTERM);
        }
        let st = match tokio::time::timeout(kill_after, self.wait()).await {
            Ok(st) => st,
            Err(_) => {
                eprintln!(
                    "baton lock: the command did not exit within {:.1} s of SIGTERM; sending \
                     SIGKILL",
                    kill_after.as_secs_f64()
                );
                self.signal(libc::SIGKILL);
                self.wait().await
            }
        };
        self.signal(libc::SIGKILL);
        st
    }

    /// Gives the terminal back to our own process group after the command exited.
    fn reclaim_terminal(&mut self) {
        if !self.took_terminal {
            return;
        }
        self.took_terminal = false;
        // SAFETY: plain syscalls; SIGTTOU is ignored around tcsetpgrp because we are a
        // background group at this moment.
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, libc::getpgrp());
            libc::signal(libc::SIGTTOU, old);
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Never leave a command running unsupervised: if `baton lock` unwinds for any
        // reason, the lock is about to be gone too.
        if self.status.is_none() {
            self.signal(libc::SIGKILL);
        }
        self.reclaim_terminal();
    }
}

/// True if stdin is a terminal whose foreground process group is ours.
fn we_own_the_terminal() -> bool {
    // SAFETY: plain syscalls on fd 0.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// The shell convention for an exit status: the code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
