//! Nothing acknowledged is ever lost: real `baton serve` processes, concurrent writers,
//! kill -9 at random moments, restart, and every acknowledged put must be there with the
//! revision it was acknowledged at; revisions never go backwards.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::Baton;
use etcd_client::{Client, GetOptions};
use rand::{Rng, SeedableRng};

const WRITERS: usize = 8;
const ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_loses_no_acknowledged_write() {
    let seed: u64 = std::env::var("BATON_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("seed {seed} (rerun with BATON_TEST_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let dir = tempfile::tempdir().unwrap();
    let mut baton = Baton::start(&dir.path().join("b"));
    // (key, value, revision) of every acknowledged put, across all rounds.
    let acked: Arc<Mutex<Vec<(String, String, i64)>>> = Arc::default();
    let mut last_revision = 1i64;

    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let url = baton.url();
            let acked = acked.clone();
            tasks.push(tokio::spawn(async move {
                let Ok(mut c) = Client::connect([url], None).await else {
                    return;
                };
                for n in 0.. {
                    let key = format!("r{round}/w{w}/{n:06}");
                    let value = format!("value-{round}-{w}-{n}");
                    match c.put(key.clone(), value.clone(), None).await {
                        Ok(r) => {
                            acked
                                .lock()
                                .unwrap()
                                .push((key, value, r.header().unwrap().revision()))
                        }
                        Err(_) => return,
                    }
                }
            }));
        }
        let wait = rng.gen_range(150..900);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        baton.kill9();
        for t in tasks {
            let _ = t.await;
        }
        baton.spawn();

        let mut c = Client::connect([baton.url()], None).await.unwrap();
        let all = c
            .get("r", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let current = all.header().unwrap().revision();
        let found: std::collections::HashMap<Vec<u8>, (Vec<u8>, i64)> = all
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), (kv.value().to_vec(), kv.mod_revision())))
            .collect();
        let acked = acked.lock().unwrap();
        let max_acked = acked.iter().map(|a| a.2).max().unwrap_or(1);
        assert!(
            acked.len() > round * 10,
            "round {round}: too few writes acknowledged ({}) to test anything",
            acked.len()
        );
        for (key, value, rev) in acked.iter() {
            let (v, r) = found.get(key.as_bytes()).unwrap_or_else(|| {
                panic!("round {round}: acknowledged {key} (rev {rev}) is lost; seed {seed}")
            });
            assert_eq!(
                v,
                value.as_bytes(),
                "round {round}: {key} has the wrong value"
            );
            assert_eq!(r, rev, "round {round}: {key} has the wrong revision");
        }
        assert!(
            current >= max_acked,
            "revision went backwards: {current} < {max_acked}"
        );
        assert!(
            current >= last_revision,
            "revision went backwards across restarts"
        );
        last_revision = current;
        eprintln!(
            "round {round}: killed after {wait} ms, {} acknowledged so far, revision {current}",
            acked.len()
        );
    }
    // A clean shutdown works too, and the data survives it.
    let st = baton.terminate();
    assert!(st.success(), "SIGTERM exit: {st:?}");
    baton.spawn();
    let mut c = Client::connect([baton.url()], None).await.unwrap();
    let n = c
        .get("r", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .unwrap()
        .count();
    assert!(n as usize >= acked.lock().unwrap().len());
}
