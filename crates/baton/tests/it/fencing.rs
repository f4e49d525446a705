//! Fencing tokens end to end: the seed's "paused holder" scenario with real processes, and
//! mutual exclusion under contention, both against a resource kept *outside* Baton.
//!
//! The resource is [`Store`]: one integer ("stock", "counter") that serializes its
//! operations. With fencing on, it asks Baton's fence gate (`baton.v1.Fence/Check`) about
//! the token of every fenced request — the gate atomically remembers the highest token seen
//! for the resource and refuses lower ones — and refuses the request if the gate does. That
//! is what a resource that cannot compare tokens itself would do (docs/locks.md); a
//! database would instead write `… WHERE fence <= $token`.
//!
//! A token alone is a number anyone can make up: a third client that writes with a huge
//! one raises the gate's highest token and locks every honest holder out. So the store can
//! also verify signed tokens (issue 16): `baton lock` exports the grant's signature
//! (`BATON_FENCING_SIGNATURE`, `BATON_FENCING_KEY_ID`, `BATON_FENCING_LEASE`,
//! `BATON_FENCING_REVISION`), the store checks it against the cluster's public keys from
//! `baton fence public-key` and refuses a forgery before it asks the gate.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{baton_cmd, descendants, kill, Baton, Proc};
use baton_client::{KeyId, PublicKeys, Signature, SignedToken};
use baton_proto::baton::v1::{fence_client::FenceClient, FenceCheckRequest};
use std::sync::atomic::{AtomicUsize, Ordering};
use tonic::transport::Channel;

const T: Duration = Duration::from_secs(20);

/// One fenced operation as the store saw it.
#[derive(Debug, Clone)]
struct Op {
    who: String,
    write: bool,
    token: i64,
    value: i64,
    /// `None` if accepted, else the highest token the gate had seen (`-1`: refused by the
    /// signature check, before the gate was asked).
    rejected: Option<i64>,
}

/// Why the store refused a request.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    /// The gate has seen this higher token.
    Gate(i64),
    /// The token's signature does not verify (the gate was not asked).
    Forged(String),
}

impl Refusal {
    fn highest(&self) -> i64 {
        match self {
            Refusal::Gate(h) => *h,
            Refusal::Forged(_) => -1,
        }
    }
}

/// What a request carries besides the token: the grant's signature and what it covers.
#[derive(Debug, Clone, Default)]
struct Proof {
    signature: String,
    key_id: String,
    lease: String,
    revision: String,
}

/// A resource outside Baton holding one integer.
struct Store {
    resource: Vec<u8>,
    fence: Option<FenceClient<Channel>>,
    /// The cluster's public keys: when set, only validly signed tokens reach the gate.
    keys: Option<PublicKeys>,
    /// Calls made to Baton's fence gate.
    gate_calls: AtomicUsize,
    value: tokio::sync::Mutex<i64>,
    started: Instant,
    timeline: Mutex<Vec<String>>,
    ops: Mutex<Vec<Op>>,
    gates: tokio::sync::watch::Sender<HashSet<String>>,
}

impl Store {
    fn new(initial: i64, resource: &str, fence: Option<FenceClient<Channel>>) -> Store {
        Store {
            resource: resource.as_bytes().to_vec(),
            fence,
            keys: None,
            gate_calls: AtomicUsize::new(0),
            value: tokio::sync::Mutex::new(initial),
            started: Instant::now(),
            timeline: Mutex::new(Vec::new()),
            ops: Mutex::new(Vec::new()),
            gates: tokio::sync::watch::channel(HashSet::new()).0,
        }
    }

    /// Adds a line to the printed timeline, stamped with the time since the store started.
    fn note(&self, text: impl AsRef<str>) {
        let t = self.started.elapsed().as_secs_f64();
        self.timeline
            .lock()
            .unwrap()
            .push(format!("t={t:5.2}s  {}", text.as_ref()));
    }

    fn timeline(&self) -> String {
        self.timeline.lock().unwrap().join("\n")
    }

    /// With public keys: `Ok` iff `proof` is the cluster's signature of this token for the
    /// lock named like the resource. Checked by the store itself, before the gate.
    fn verify(&self, token: i64, proof: &Proof) -> Result<(), Refusal> {
        let Some(keys) = &self.keys else {
            return Ok(());
        };
        let forged = |why: String| Refusal::Forged(why);
        let signed = SignedToken {
            name: self.resource.clone(),
            token: baton_client::FencingToken::new(token),
            lease: proof.lease.parse().map_err(|_| forged("no lease".into()))?,
            revision: proof
                .revision
                .parse()
                .map_err(|_| forged("no revision".into()))?,
            key_id: KeyId::new(
                proof
                    .key_id
                    .parse()
                    .map_err(|_| forged("no key id".into()))?,
            ),
            signature: Signature::from_hex(&proof.signature).ok(),
        };
        signed
            .verify(keys)
            .map_err(|e| forged(e.to_string().replace(' ', "_")))
    }

    /// The verdict on `token`: the signature (if the store verifies them), then the gate's.
    async fn check(&self, token: i64, proof: &Proof) -> Result<(), Refusal> {
        self.verify(token, proof)?;
        let Some(fence) = &self.fence else {
            return Ok(());
        };
        self.gate_calls.fetch_add(1, Ordering::SeqCst);
        let resp = fence
            .clone()
            .check(FenceCheckRequest {
                resource: self.resource.clone(),
                fencing_token: token,
            })
            .await
            .unwrap_or_else(|s| panic!("Fence.Check: {s:?}"))
            .into_inner();
        if resp.accepted {
            Ok(())
        } else {
            Err(Refusal::Gate(resp.highest_token))
        }
    }

    /// Reads the value. With a token the read also registers it at the gate, so an older
    /// holder's late write is refused even before this holder writes (the seed's third
    /// condition).
    async fn read(
        &self,
        who: &str,
        token: Option<(i64, &Proof)>,
        log: bool,
    ) -> Result<i64, Refusal> {
        let value = self.value.lock().await;
        if let Some((token, proof)) = token {
            self.check(token, proof).await?;
        }
        if log {
            self.note(format!("{who} reads stock={}", *value));
        }
        Ok(*value)
    }

    /// Writes `new` if the gate accepts `token`. The store's lock is held across the check
    /// and the write, so no other write can slip in between them.
    async fn write(
        &self,
        who: &str,
        token: i64,
        proof: &Proof,
        new: i64,
        log: bool,
    ) -> Result<(), Refusal> {
        let mut value = self.value.lock().await;
        let verdict = self.check(token, proof).await;
        if verdict.is_ok() {
            *value = new;
        }
        if log {
            self.note(match &verdict {
                Ok(()) => format!("{who} writes stock={new} with token {token} -> ok"),
                Err(Refusal::Gate(h)) => {
                    format!("{who} writes stock={new} with token {token} -> REJECTED (seen {h})")
                }
                Err(Refusal::Forged(why)) => format!(
                    "{who} writes stock={new} with token {token} -> FORGED ({why}; gate not asked)"
                ),
            });
            self.ops.lock().unwrap().push(Op {
                who: who.to_string(),
                write: true,
                token,
                value: new,
                rejected: verdict.as_ref().err().map(Refusal::highest),
            });
        }
        verdict
    }

    fn open_gate(&self, who: &str) {
        self.gates.send_modify(|g| {
            g.insert(who.to_string());
        });
    }

    /// One request line of the store's text protocol; returns the reply line.
    ///
    /// `LOG who text…` → `OK`; `READ who token [proof]` → value or `REJECTED highest`;
    /// `WRITE who token value [proof]` → `OK` or `REJECTED highest`; `WAIT who` → `GO` once
    /// the test opens `who`'s gate. `proof` is `signature key_id lease revision` (a
    /// refused signature answers `FORGED why`).
    async fn handle(&self, line: &str) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> i64 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("bad request {line:?}"))
        };
        let proof = |from: usize| {
            let w = |i: usize| words.get(from + i).map_or(String::new(), |s| s.to_string());
            Proof {
                signature: w(0),
                key_id: w(1),
                lease: w(2),
                revision: w(3),
            }
        };
        let reply = |r: Refusal| match r {
            Refusal::Gate(h) => format!("REJECTED {h}"),
            Refusal::Forged(why) => format!("FORGED {why}"),
        };
        match words.first().copied() {
            Some("LOG") => {
                self.note(words[1..].join(" "));
                "OK".into()
            }
            Some("READ") => match self.read(words[1], Some((num(2), &proof(3))), true).await {
                Ok(v) => v.to_string(),
                Err(r) => reply(r),
            },
            Some("WRITE") => match self.write(words[1], num(2), &proof(4), num(3), true).await {
                Ok(()) => "OK".into(),
                Err(r) => reply(r),
            },
            Some("WAIT") => {
                let who = words[1].to_string();
                let mut rx = self.gates.subscribe();
                let _ = rx.wait_for(|g| g.contains(&who)).await;
                "GO".into()
            }
            _ => format!("ERROR unknown request {line:?}"),
        }
    }
}

/// Serves `store` on a loopback port from a thread of its own; returns the port.
fn serve(store: Arc<Store>, rt: &tokio::runtime::Runtime) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let store = store.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
                let (r, mut w) = sock.into_split();
                let mut lines = tokio::io::BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply = store.handle(&line).await;
                    if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// The client script of the scenario, run by `baton lock` as its command. It talks to the
/// store over bash's /dev/tcp with the token from BATON_FENCING_TOKEN.
///
/// `PAUSE=1` makes the client stop right after its read at a gate the test opens later: the
/// gate only pins down *where* the pause happens; the pause itself is a real SIGSTOP of the
/// client's processes. `IGNORE_TERM=1` stands for a write that is already on its way when the
/// client learns its lease is gone: a SIGTERM cannot recall it (and `baton lock` would
/// otherwise race the write to stop it, making the run nondeterministic).
const CLIENT: &str = r#"
set -u
[ "${IGNORE_TERM:-0}" = 1 ] && trap '' TERM
req() {
  exec 3<>"/dev/tcp/127.0.0.1/$STORE_PORT" || exit 90
  printf '%s\n' "$*" >&3
  IFS= read -r REPLY <&3
  exec 3>&-
}
req LOG "$WHO" "gets lock, token $BATON_FENCING_TOKEN"
proof="$BATON_FENCING_SIGNATURE $BATON_FENCING_KEY_ID $BATON_FENCING_LEASE $BATON_FENCING_REVISION"
req READ "$WHO" "$BATON_FENCING_TOKEN" $proof
case $REPLY in REJECTED*|FORGED*) exit 3;; esac
stock=$REPLY
[ "${PAUSE:-0}" = 1 ] && req WAIT "$WHO"
req WRITE "$WHO" "$BATON_FENCING_TOKEN" $((stock - SELL)) $proof
[ "$REPLY" = OK ] || exit 3
"#;

/// `baton lock LOCK --ttl 2 -- bash -c CLIENT` for client `who` selling `sell` items.
fn client(b: &Baton, lock: &str, port: u16, who: &str, sell: i64, pause: bool) -> Command {
    let mut cmd = baton_cmd();
    cmd.args(["lock", lock, "--ttl", "2", "--kill-after", "5"])
        .args(["--endpoints", &b.endpoint()])
        .args(["--", "bash", "-c", CLIENT])
        .env("STORE_PORT", port.to_string())
        .env("WHO", who)
        .env("SELL", sell.to_string())
        .env("PAUSE", if pause { "1" } else { "0" })
        .env("IGNORE_TERM", if pause { "1" } else { "0" });
    cmd
}

/// How the store guards itself, and whether a third client forges a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No fence at all.
    Unfenced,
    /// The fence gate on bare tokens.
    Fenced,
    /// The fence gate on bare tokens, and a third client writes with a huge made-up token.
    ForgerUnsigned,
    /// The store verifies signed tokens before the gate, and the same forger writes.
    ForgerSigned,
}

/// The forger's made-up token: far above any real one.
const FORGED_BOOST: i64 = 1_000_000;

struct Run {
    final_stock: i64,
    /// The store's answer to the forger's write and the gate calls made for it.
    forger: Option<(String, usize)>,
    /// The exit status of A's second attempt, if it made one.
    a_again: Option<i32>,
    timeline: String,
    ops: Vec<Op>,
    tokens: BTreeMap<String, Vec<i64>>,
    /// How long after A's pause began B got the lock.
    b_waited: Duration,
}

/// The seed's scenario: stock 10; A sells 1, B sells 2; A pauses past its lease after
/// reading. Returns what happened.
fn run_scenario(b: &Baton, mode: Mode) -> Run {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let name = match mode {
        Mode::Unfenced => "stock-unfenced",
        Mode::Fenced => "stock",
        Mode::ForgerUnsigned => "stock-forger-unsigned",
        Mode::ForgerSigned => "stock-forger-signed",
    };
    let (lock, resource) = (name, name);
    let fence = (mode != Mode::Unfenced)
        .then(|| FenceClient::new(rt.block_on(common::channel(&b.endpoint()))));
    let mut store = Store::new(10, resource, fence);
    if mode == Mode::ForgerSigned {
        store.keys = Some(public_keys(b));
    }
    let store = Arc::new(store);
    let port = serve(store.clone(), &rt);
    let wait_for = |needle: &str| {
        let deadline = Instant::now() + T;
        while !store.timeline().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} did not happen\n{}",
                store.timeline()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // A acquires and reads.
    let mut a = Proc::spawn("A", client(b, lock, port, "A", 1, true));
    wait_for("A reads");

    // A pauses: SIGSTOP to `baton lock` (its keep-alives stop) and to its command.
    let a_pids: Vec<i32> = std::iter::once(a.pid())
        .chain(descendants(a.pid()))
        .collect();
    for &p in &a_pids {
        kill(p, libc::SIGSTOP);
    }
    let paused = Instant::now();
    store.note("A: paused (SIGSTOP of `baton lock` and its command) past its 2 s lease");

    // B queues for the lock; it gets it only when A's lease has expired.
    let mut bp = Proc::spawn("B", client(b, lock, port, "B", 2, false));
    wait_for("B gets lock");
    let b_waited = paused.elapsed();
    assert_eq!(bp.wait_exit(T), 0, "B\n{}\n{}", bp.said(), store.timeline());
    store.note("B releases");

    // A third client C, which never held the lock, writes stock=0 with a token far above
    // B's and a made-up signature of key 1.
    let forger = matches!(mode, Mode::ForgerUnsigned | Mode::ForgerSigned).then(|| {
        let token_b: i64 = store
            .timeline()
            .lines()
            .find_map(|l| {
                l.split_once("B gets lock, token ")
                    .map(|(_, t)| t.to_string())
            })
            .expect("B's token")
            .parse()
            .unwrap();
        let before = store.gate_calls.load(Ordering::SeqCst);
        let line = format!(
            "WRITE C {} 0 {} 1 7 {}",
            token_b + FORGED_BOOST,
            "00".repeat(64),
            token_b
        );
        let reply = rt.block_on(store.handle(&line));
        (reply, store.gate_calls.load(Ordering::SeqCst) - before)
    });

    // A resumes where it stopped: its write goes out with its old token.
    store.open_gate("A");
    for &p in a_pids.iter().rev() {
        kill(p, libc::SIGCONT);
    }
    store.note("A: resumed (SIGCONT)");
    let a_code = a.wait_exit(T);
    let lost_line = a
        .stderr()
        .lines()
        .find(|l| l.contains("LOST"))
        .unwrap_or("")
        .to_string();
    store.note(format!("A: `baton lock` exits {a_code}: {lost_line}"));
    assert_eq!(
        a_code,
        75,
        "A's baton lock notices that it lost the lock\n{}\n{}",
        a.said(),
        store.timeline()
    );

    // Refused? Then A does what a fenced client should: acquire again and redo the work.
    let a_rejected = store
        .ops
        .lock()
        .unwrap()
        .iter()
        .any(|op| op.who == "A" && op.rejected.is_some());
    let mut a_again = None;
    if a_rejected {
        let mut again = Proc::spawn("A again", client(b, lock, port, "A", 1, false));
        let code = again.wait_exit(T);
        // With a forged token at the gate every honest holder is refused from now on.
        if mode != Mode::ForgerUnsigned {
            assert_eq!(code, 0, "{}\n{}", again.said(), store.timeline());
        }
        a_again = Some(code);
    }

    let final_stock = rt.block_on(async { *store.value.lock().await });
    let timeline = store.timeline();
    let mut tokens: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for line in timeline.lines() {
        if let Some((who, token)) = line
            .split_once("  ")
            .and_then(|(_, e)| e.split_once(" gets lock, token "))
        {
            tokens
                .entry(who.to_string())
                .or_default()
                .push(token.parse().unwrap());
        }
    }
    let ops = store.ops.lock().unwrap().clone();
    Run {
        final_stock,
        forger,
        a_again,
        timeline,
        ops,
        tokens,
        b_waited,
    }
}

#[test]
fn seed_scenario_paused_holder_is_fenced_off_and_unfenced_loses_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));

    let unfenced = run_scenario(&b, Mode::Unfenced);
    eprintln!(
        "NO fencing\n{}\nfinal stock={} (correct: 10 - 1 - 2 = 7)\n",
        unfenced.timeline, unfenced.final_stock
    );
    let fenced = run_scenario(&b, Mode::Fenced);
    eprintln!(
        "WITH fencing\n{}\nfinal stock={} (correct: 10 - 1 - 2 = 7)\n",
        fenced.timeline, fenced.final_stock
    );

    for run in [&unfenced, &fenced] {
        // B got the lock only after A's lease ran out (A renewed every 0.67 s, so at
        // least 2 s − 0.67 s after the pause began), never while A's lease was valid.
        assert!(
            run.b_waited >= Duration::from_millis(1300),
            "B got the lock {:?} into A's pause\n{}",
            run.b_waited,
            run.timeline
        );
        let (a, b_) = (&run.tokens["A"], &run.tokens["B"]);
        assert!(
            a[0] < b_[0],
            "B's token is larger than A's\n{}",
            run.timeline
        );
    }

    // Without the fence A's late write of 9 overwrites B's 8: one sale is lost.
    assert_eq!(unfenced.final_stock, 9, "{}", unfenced.timeline);
    let a_write = unfenced
        .ops
        .iter()
        .find(|o| o.who == "A" && o.write)
        .unwrap();
    assert_eq!((a_write.value, a_write.rejected), (9, None));

    // With the fence A's write of 9 with its old token is REJECTED; A re-acquires with a
    // newer token, reads 8 and writes 7.
    assert_eq!(fenced.final_stock, 7, "{}", fenced.timeline);
    let a_writes: Vec<&Op> = fenced
        .ops
        .iter()
        .filter(|o| o.who == "A" && o.write)
        .collect();
    let tokens_a = &fenced.tokens["A"];
    let token_b = fenced.tokens["B"][0];
    assert_eq!(a_writes.len(), 2, "{}", fenced.timeline);
    assert_eq!(
        (a_writes[0].value, a_writes[0].token, a_writes[0].rejected),
        (9, tokens_a[0], Some(token_b)),
        "{}",
        fenced.timeline
    );
    assert_eq!((a_writes[1].value, a_writes[1].rejected), (7, None));
    assert!(tokens_a[1] > token_b, "{}", fenced.timeline);
    assert!(
        fenced.timeline.contains("A reads stock=8"),
        "{}",
        fenced.timeline
    );
}

/// The cluster's public keys as `baton fence public-key` prints them (waiting for the
/// leader's bootstrap key).
fn public_keys(b: &Baton) -> PublicKeys {
    let deadline = Instant::now() + T;
    loop {
        let out = baton_cmd()
            .args(["fence", "public-key", "--endpoints", &b.endpoint()])
            .output()
            .unwrap();
        if out.status.success() {
            let text = String::from_utf8(out.stdout).unwrap();
            return PublicKeys::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        }
        assert!(
            Instant::now() < deadline,
            "baton fence public-key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The seed's scenario with a third client C that never holds the lock and writes stock=0
/// with a token far above every real one (and a made-up signature). Against the gate on
/// bare tokens the forgery is accepted: C's write lands and every honest holder is refused
/// from then on (A cannot redo its sale: the stock ends wrong). A store that verifies
/// signed tokens refuses C before it asks Baton's gate, and the stock ends at 7.
#[test]
fn seed_scenario_with_a_forged_token_signed_tokens_keep_stock_7_bare_tokens_break() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));

    let unsigned = run_scenario(&b, Mode::ForgerUnsigned);
    eprintln!(
        "FORGER, bare tokens\n{}\nfinal stock={} (correct: 7)\n",
        unsigned.timeline, unsigned.final_stock
    );
    let signed = run_scenario(&b, Mode::ForgerSigned);
    eprintln!(
        "FORGER, signed tokens\n{}\nfinal stock={} (correct: 7)\n",
        signed.timeline, signed.final_stock
    );

    // Bare tokens: the gate took C's made-up token; A's late write and its retry are both
    // refused (C's token is the highest forever), and C's 0 stands.
    let (reply, gate_calls) = unsigned.forger.clone().unwrap();
    assert_eq!(
        (reply.as_str(), gate_calls),
        ("OK", 1),
        "{}",
        unsigned.timeline
    );
    assert_eq!(unsigned.a_again, Some(3), "{}", unsigned.timeline);
    assert_eq!(unsigned.final_stock, 0, "{}", unsigned.timeline);
    assert_ne!(unsigned.final_stock, 7);

    // Signed tokens: C is refused by the signature check, without a call to the gate; A's
    // stale write is refused by the gate, A redoes its sale with a new signed token.
    let (reply, gate_calls) = signed.forger.clone().unwrap();
    assert!(reply.starts_with("FORGED"), "{reply}\n{}", signed.timeline);
    assert_eq!(gate_calls, 0, "the forged token reached Baton");
    assert!(
        signed.timeline.contains("C writes stock=0") && signed.timeline.contains("FORGED"),
        "{}",
        signed.timeline
    );
    assert_eq!(signed.a_again, Some(0), "{}", signed.timeline);
    assert_eq!(signed.final_stock, 7, "{}", signed.timeline);
    let a_writes: Vec<&Op> = signed
        .ops
        .iter()
        .filter(|o| o.who == "A" && o.write)
        .collect();
    assert_eq!(a_writes.len(), 2, "{}", signed.timeline);
    assert_eq!((a_writes[1].value, a_writes[1].rejected), (7, None));
    // Every honest write carried a valid signature: none was refused as forged.
    assert!(signed
        .ops
        .iter()
        .filter(|o| o.who != "C")
        .all(|o| o.rejected != Some(-1)));
}

/// 20 clients, each with its own connection and lease, 200 critical sections each on one
/// lock. Each critical section reads the counter and writes it + 1 through the fence; a
/// second holder at any moment would lose increments or be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_20_clients_200_sections_each() {
    use baton_proto::baton::v1::{lock_client::LockClient, AcquireRequest, ReleaseRequest};
    use baton_proto::etcdserverpb::{lease_client::LeaseClient, LeaseGrantRequest};

    const CLIENTS: usize = 20;
    const SECTIONS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let fence = FenceClient::new(common::channel(&b.endpoint()).await);
    let store = Arc::new(Store::new(0, "counter", Some(fence)));
    let started = Instant::now();

    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let endpoint = b.endpoint();
        let store = store.clone();
        tasks.spawn(async move {
            let ch = common::channel(&endpoint).await;
            let lease = LeaseClient::new(ch.clone())
                .lease_grant(LeaseGrantRequest { ttl: 300, id: 0 })
                .await
                .unwrap()
                .into_inner()
                .id;
            let mut locks = LockClient::new(ch);
            let mut sections = Vec::with_capacity(SECTIONS);
            let mut rejections = 0;
            let mut acquire_time = Duration::ZERO;
            for _ in 0..SECTIONS {
                let asked = Instant::now();
                let held = locks
                    .acquire(AcquireRequest {
                        name: b"counter".to_vec(),
                        lease,
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_else(|s| panic!("client {c}: Acquire: {s:?}"))
                    .into_inner();
                let enter = Instant::now();
                acquire_time += enter - asked;
                let v = store.read("", None, false).await.unwrap();
                if store
                    .write("", held.fencing_token, &Proof::default(), v + 1, false)
                    .await
                    .is_err()
                {
                    rejections += 1;
                }
                let exit = Instant::now();
                locks
                    .release(ReleaseRequest {
                        key: held.key,
                        fencing_token: held.fencing_token,
                    })
                    .await
                    .unwrap_or_else(|s| panic!("client {c}: Release: {s:?}"));
                sections.push((held.fencing_token, enter, exit, c));
            }
            (sections, rejections, acquire_time)
        });
    }
    let mut sections = Vec::new();
    let mut rejections = 0;
    let mut acquire_time = Duration::ZERO;
    while let Some(r) = tasks.join_next().await {
        let (s, r, a) = r.unwrap();
        sections.extend(s);
        rejections += r;
        acquire_time += a;
    }
    let elapsed = started.elapsed();
    let count = *store.value.lock().await;

    assert_eq!(sections.len(), CLIENTS * SECTIONS);
    assert_eq!(rejections, 0, "honest holders were refused by the fence");
    assert_eq!(count, (CLIENTS * SECTIONS) as i64, "lost increments");
    // In the order they were entered, each section ends before the next begins, and the
    // tokens strictly increase.
    sections.sort_by_key(|s| s.1);
    for w in sections.windows(2) {
        let ((t1, _, exit1, c1), (t2, enter2, _, c2)) = (w[0], w[1]);
        assert!(
            exit1 <= enter2,
            "overlap: client {c1} (token {t1}) still inside when client {c2} (token {t2}) \
             entered"
        );
        assert!(t2 > t1, "tokens out of order: {t1} then {t2}");
    }
    eprintln!(
        "{} critical sections by {CLIENTS} clients in {elapsed:.1?} ({:.0}/s), mean acquire \
         wait {:.1?}",
        CLIENTS * SECTIONS,
        (CLIENTS * SECTIONS) as f64 / elapsed.as_secs_f64(),
        acquire_time / (CLIENTS * SECTIONS) as u32
    );
}

/// The store's text protocol works from a plain socket too (what the bash client speaks).
#[test]
fn store_protocol_round_trip() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(Store::new(10, "x", None));
    let port = serve(store.clone(), &rt);
    let ask = |line: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        BufReader::new(s).read_line(&mut reply).unwrap();
        reply.trim().to_string()
    };
    assert_eq!(ask("READ A 5"), "10");
    assert_eq!(ask("WRITE A 5 9"), "OK");
    assert_eq!(ask("READ B 6"), "9");
    assert_eq!(ask("LOG A hello"), "OK");
    store.open_gate("A");
    assert_eq!(ask("WAIT A"), "GO");
    assert!(store
        .timeline()
        .contains("A writes stock=9 with token 5 -> ok"));
}
