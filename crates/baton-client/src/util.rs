//! Small internal helpers shared by the modules.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Aborts a background task when dropped, so a handle's task never outlives the handle.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Jittered exponential backoff ("equal jitter"): half of `min(cap, base * 2^attempt)` plus a
/// random part of the other half, so that many clients retrying after the same failure
/// spread out instead of arriving together.
pub(crate) fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    let half = exp / 2;
    let jitter = rand::thread_rng().gen_range(0..=half.as_micros().max(1) as u64);
    half + Duration::from_micros(jitter)
}

/// Runs `fut` until `until` (if any); `Err(())` if the deadline passed first.
pub(crate) async fn until<F: Future>(until: Option<Instant>, fut: F) -> Result<F::Output, ()> {
    match until {
        Some(d) => tokio::time::timeout_at(d, fut).await.map_err(|_| ()),
        None => Ok(fut.await),
    }
}

/// etcd's `GetPrefixRangeEnd`: the smallest key greater than every key starting with `p`
/// (`\0` — "to the end of the key space" — if there is none).
pub fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("non-empty") += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

/// A lease id as etcd's clients print it in keys: Go's `%x` of an `int64` (a negative id
/// gets a minus sign, not two's complement), so keys match what etcd's recipes compute.
pub(crate) fn lease_hex(lease: i64) -> String {
    if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    }
}

/// `name/suffix` as bytes.
pub(crate) fn join(name: &[u8], suffix: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 1 + suffix.len());
    k.extend_from_slice(name);
    k.push(b'/');
    k.extend_from_slice(suffix.as_bytes());
    k
}

/// Bytes for messages and errors.
pub(crate) fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_etcds() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn lease_hex_matches_go() {
        assert_eq!(lease_hex(0x694d), "694d");
        assert_eq!(lease_hex(-255), "-ff");
    }

    #[test]
    fn backoff_is_bounded() {
        for a in 0..40 {
            let d = backoff(a, Duration::from_millis(10), Duration::from_millis(500));
            assert!(d <= Duration::from_millis(500), "{d:?}");
        }
    }
}
