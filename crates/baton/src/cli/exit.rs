//! The exit statuses the client commands share (sysexits where one fits), so a script can
//! tell "not acquired" and "lost" from a failure.

/// Exit status when the lock (or leadership) was not obtained: `--try` found it held, or
/// `--timeout` passed (sysexits' EX_CANTCREAT: "could not create" — here, the lock).
pub const EXIT_NOT_ACQUIRED: i32 = 73;
/// Exit status when the lock or leadership was lost while held (lease expired or revoked,
/// key force-released). sysexits' EX_TEMPFAIL: the work was interrupted; retrying is
/// reasonable.
pub const EXIT_LOST: i32 = 75;
/// Exit status for every other failure of `baton` itself (cannot connect, server refused).
pub const EXIT_ERROR: i32 = 1;
