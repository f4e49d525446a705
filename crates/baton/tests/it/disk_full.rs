//! A full disk is an alarm, not a wedge (issue 14): a real `baton serve` on its own small
//! file system (a 200 MB tmpfs mounted by the test, root only) is written until its free
//! space falls below the reserve. Then `NOSPACE` is listed, writes that add data are refused
//! with etcd's message while reads, deletes and compaction are served, nothing acknowledged
//! is lost across a kill -9 and a restart with little space left (which serves reads at
//! once), a clean restart with less room than the values still elects (the value file
//! leaves the reserve to the log and holds the rest in memory), and once space is freed (a
//! filler file deleted) writes succeed again and the held values are written out, without
//! a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    agreed_leader, etcdctl, http_get, lazy_channel, member_status, Baton, Cluster,
};
use etcd_client::{Client, GetOptions};

const MIB: u64 = 1 << 20;
/// The default `--disk-reserve-bytes` (64 MiB), used as is.
const RESERVE: u64 = 64 * MIB;
/// Room left above the reserve before the writes start.
const HEADROOM: u64 = 40 * MIB;
const VALUE_BYTES: usize = 8 << 10;
const WRITERS: usize = 8;
const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";

/// An acknowledged put: key and value.
type Acked = (String, Vec<u8>);

/// A tmpfs mounted on a directory, unmounted when dropped (also on failure).
struct SmallFs {
    path: PathBuf,
    /// The temporary directory it is mounted on, when it made one.
    _dir: Option<tempfile::TempDir>,
}

impl SmallFs {
    /// On a new temporary directory.
    fn mount(size: &str) -> SmallFs {
        let dir = tempfile::tempdir().unwrap();
        let mut fs = SmallFs::mount_at(dir.path().to_path_buf(), size);
        fs._dir = Some(dir);
        fs
    }

    /// On `path` (made if missing). Fails (never skips) without root: CI runs as root, and
    /// a full disk cannot be made any other way here.
    fn mount_at(path: PathBuf, size: &str) -> SmallFs {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test mounts a small tmpfs and needs root"
        );
        std::fs::create_dir_all(&path).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a {size} tmpfs");
        SmallFs { path, _dir: None }
    }

    /// Grows or shrinks the file system in place (tmpfs takes a size below what it holds
    /// as long as what it holds fits): the member on it sees its free space change.
    fn resize(&self, size: &str) {
        let ok = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .unwrap()
            .success();
        assert!(ok, "resize the tmpfs to {size}");
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // Lazy: a server killed a moment ago may still hold files open.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid C string and writable statvfs buffer; checked return code.
    let st = unsafe {
        assert_eq!(libc::statvfs(path.as_ptr(), st.as_mut_ptr()), 0);
        st.assume_init()
    };
    // The field types are narrower on 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    free
}

/// Writes a filler file of `bytes` (real pages: tmpfs counts them).
fn write_filler(path: &PathBuf, bytes: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5au8; MIB as usize];
    for _ in 0..bytes / MIB {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

/// `baton_value_file_held_bytes`: values kept in memory for lack of room on the disk.
fn held_bytes(baton: &Baton) -> u64 {
    let (code, body) = http_get(baton.metrics_port, "/metrics");
    assert_eq!(code, 200);
    body.lines()
        .find_map(|l| l.strip_prefix("baton_value_file_held_bytes "))
        .map(|v| v.trim().parse::<f64>().expect("a number") as u64)
        .expect("baton_value_file_held_bytes exported")
}

fn alarm_list(endpoint: &str) -> String {
    let out = etcdctl(endpoint, &["alarm", "list"], None);
    assert_eq!(out.code, 0, "alarm list: {out:?}");
    out.stdout
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every acknowledged key is there with its value (read in pages: the whole set is bigger
/// than a client's 4 MiB message limit). The member's log is shown if a read fails.
async fn check_all_there(baton: &Baton, acked: &[Acked]) {
    let url = baton.url();
    let mut c = Client::connect([url], None).await.unwrap();
    let mut found = std::collections::HashMap::new();
    let mut from = b"w/".to_vec();
    // Right after a restart the member may serve its port before it has elected itself
    // again: it answers `no leader` (Unavailable), which etcd's clients retry; so does this,
    // for as long as an election may take here.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = loop {
            let read = c
                .get(
                    from.clone(),
                    Some(GetOptions::new().with_range("w0").with_limit(256)),
                )
                .await;
            match read {
                Err(etcd_client::Error::GRpcStatus(st))
                    if st.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                read => {
                    break read.unwrap_or_else(|e| {
                        panic!("a linearizable read is served: {e}; log:\n{}", baton.log())
                    })
                }
            }
        };
        for kv in page.kvs() {
            found.insert(kv.key().to_vec(), kv.value().to_vec());
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    for (k, v) in acked {
        assert_eq!(found.get(k.as_bytes()), Some(v), "acknowledged {k} lost");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_raises_nospace_keeps_reads_and_recovers_by_itself() {
    let fs = SmallFs::mount("200m");
    let data = fs.path().join("data");
    let mut baton = Baton::start(&data);
    let endpoint = baton.endpoint();
    let url = baton.url();
    let mut c = Client::connect([url.clone()], None).await.unwrap();
    c.put("scratch", "to be deleted under the alarm", None)
        .await
        .unwrap();

    // Leave HEADROOM above the reserve, so the writes below reach it quickly.
    let filler = fs.path().join("filler");
    let free = free_bytes(fs.path());
    assert!(free > RESERVE + HEADROOM + 8 * MIB, "free {free}");
    write_filler(&filler, free - RESERVE - HEADROOM);
    eprintln!(
        "free after filler: {} MiB (reserve {} MiB)",
        free_bytes(fs.path()) / MIB,
        RESERVE / MIB
    );

    // Writers until each is refused; every acknowledged (key, value) is recorded.
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let refusals: Arc<Mutex<Vec<String>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (url, acked, refusals) = (url.clone(), acked.clone(), refusals.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect([url], None).await.unwrap();
            for n in 0u64.. {
                let key = format!("w/{w}/{n:08}");
                let value = vec![b'a' + (n % 26) as u8; VALUE_BYTES];
                match c.put(key.clone(), value.clone(), None).await {
                    Ok(_) => acked.lock().unwrap().push((key, value)),
                    Err(e) => {
                        refusals.lock().unwrap().push(e.to_string());
                        return;
                    }
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("writers are refused within 2 minutes")
            .unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let refusals = refusals.lock().unwrap().clone();
    eprintln!(
        "{} writes of {VALUE_BYTES} B acknowledged in {:?} before NOSPACE; free now {} MiB",
        acked.len(),
        started.elapsed(),
        free_bytes(fs.path()) / MIB
    );
    assert!(acked.len() > 1000, "only {} acknowledged", acked.len());
    for r in &refusals {
        assert!(r.contains(NO_SPACE), "refused with something else: {r}");
    }

    // A snapshot may have purged the log meanwhile and given back enough to clear the
    // alarm (as it should); take that away again so the rest sees a disk that stays full.
    let more = fs.path().join("more");
    write_filler(&more, free_bytes(fs.path()).saturating_sub(RESERVE / 2));
    eprintln!("topped up: free {} MiB", free_bytes(fs.path()) / MIB);

    // The alarm is listed (replicated), writes are refused with etcd's message, reads,
    // deletes and compaction are served.
    let member = {
        let s = c.status().await.unwrap();
        s.header().unwrap().member_id()
    };
    let expected_alarm = format!("memberID:{member} alarm:NOSPACE");
    wait_until("NOSPACE listed", Duration::from_secs(10), || {
        alarm_list(&endpoint).contains(&expected_alarm)
    });
    let put = etcdctl(&endpoint, &["put", "refused", "x"], None);
    assert_ne!(put.code, 0);
    assert!(put.stderr.contains(NO_SPACE), "{put:?}");
    let grant = etcdctl(&endpoint, &["lease", "grant", "60"], None);
    assert!(grant.stderr.contains(NO_SPACE), "{grant:?}");
    let (k, v) = &acked[acked.len() / 2];
    let got = c.get(k.as_str(), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), v.as_slice());
    let del = etcdctl(&endpoint, &["del", "scratch"], None);
    assert_eq!((del.code, del.stdout.trim()), (0, "1"), "{del:?}");
    let rev = c.status().await.unwrap().header().unwrap().revision();
    let compact = etcdctl(&endpoint, &["compact", &rev.to_string()], None);
    assert_eq!(compact.code, 0, "{compact:?}");
    let (code, body) = http_get(baton.metrics_port, "/health");
    // etcd 3.4's answer: 503 and Go's http.Error of {"health":"false"}.
    assert_eq!((code, body.as_str()), (503, "{\"health\":\"false\"}\n"));
    let (code, _) = http_get(baton.metrics_port, "/health?exclude=NOSPACE");
    assert_eq!(code, 200, "the alarm excluded");
    check_all_there(&baton, &acked).await;

    // kill -9, then use up most of what is left: a restart with little space serves reads
    // at once (no full snapshot needed first) and still refuses writes.
    drop(c);
    baton.kill9();
    let little = fs.path().join("little");
    let left = free_bytes(fs.path());
    write_filler(&little, left.saturating_sub(8 * MIB));
    eprintln!("restarting with {} MiB free", free_bytes(fs.path()) / MIB);
    let restarted = Instant::now();
    baton.spawn();
    eprintln!(
        "serving again {:?} after the restart; free {} MiB",
        restarted.elapsed(),
        free_bytes(fs.path()) / MIB
    );
    check_all_there(&baton, &acked).await;
    eprintln!(
        "restarted and read all {} keys in {:?}; free {} MiB",
        acked.len(),
        restarted.elapsed(),
        free_bytes(fs.path()) / MIB
    );
    let put = etcdctl(&endpoint, &["put", "refused", "x"], None);
    assert!(put.stderr.contains(NO_SPACE), "{put:?}");
    assert!(alarm_list(&endpoint).contains(&expected_alarm));

    // A clean stop saves the committed index, so the next start applies the whole log
    // before its first election, spilling every value into the value file (scratch, rebuilt
    // at each start) on a disk with less room than the values: the value file must leave
    // the reserve to the log, or the vote cannot be saved and the member stays without a
    // leader until space is freed (seen in CI, after a kill -9 whose log had its committed
    // index saved).
    let status = baton.terminate();
    assert!(status.success(), "clean stop: {status:?}");
    let tight = fs.path().join("tight");
    write_filler(&tight, free_bytes(fs.path()).saturating_sub(8 * MIB));
    eprintln!(
        "clean restart with {} MiB free",
        free_bytes(fs.path()) / MIB
    );
    baton.spawn();
    check_all_there(&baton, &acked).await;
    // The values that did not fit are held in memory (the gauge follows within a tick).
    wait_until("values held in memory", Duration::from_secs(5), || {
        held_bytes(&baton) > 8 * MIB
    });
    eprintln!(
        "read all keys after the clean restart; free {} MiB; {} MiB of values held in memory",
        free_bytes(fs.path()) / MIB,
        held_bytes(&baton) / MIB
    );

    // Space freed: the member clears its own alarm and writes succeed, without a restart.
    for f in [&tight, &little, &more, &filler] {
        std::fs::remove_file(f).unwrap();
    }
    let freed = Instant::now();
    wait_until("NOSPACE cleared", Duration::from_secs(30), || {
        !alarm_list(&endpoint).contains("NOSPACE")
    });
    let mut c = Client::connect([url.clone()], None).await.unwrap();
    c.put("after", "space came back", None)
        .await
        .expect("writes succeed once space is back");
    eprintln!(
        "alarm cleared and writing again {:?} after freeing space",
        freed.elapsed()
    );
    // And the values held in memory are written out, without a write to push them.
    wait_until("held values written out", Duration::from_secs(10), || {
        held_bytes(&baton) == 0
    });
    let (code, _) = http_get(baton.metrics_port, "/health");
    assert_eq!(code, 200);
    check_all_there(&baton, &acked).await;

    // The log stayed quiet: the repeated conditions are rate-limited.
    let log = baton.log();
    let errors = log.lines().filter(|l| l.contains("ERROR")).count();
    assert_eq!(errors, 0, "errors logged:\n{log}");
    let warns = log.lines().filter(|l| l.contains("WARN")).count();
    eprintln!("{warns} warnings logged");
    assert!(warns < 50, "{warns} warnings:\n{log}");
    drop(baton);
}

/// `etcdctl alarm disarm` clears NOSPACE through the Maintenance API; with the disk still
/// low the member raises it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarm_disarm_clears_nospace_and_a_low_disk_raises_it_again() {
    let fs = SmallFs::mount("128m");
    let data = fs.path().join("data");
    // A reserve above the whole file system: low from the first tick.
    let baton = Baton::start_with(&data, &["--disk-reserve-bytes", "1000000000"]);
    let endpoint = baton.endpoint();
    wait_until("NOSPACE listed", Duration::from_secs(10), || {
        alarm_list(&endpoint).contains("alarm:NOSPACE")
    });
    let disarm = etcdctl(&endpoint, &["alarm", "disarm"], None);
    assert_eq!(disarm.code, 0, "{disarm:?}");
    assert!(disarm.stdout.contains("alarm:NOSPACE"), "{disarm:?}");
    // Still low: refused at once by the member's own disk watch, and raised again.
    let put = etcdctl(&endpoint, &["put", "k", "v"], None);
    assert!(put.stderr.contains(NO_SPACE), "{put:?}");
    wait_until("NOSPACE raised again", Duration::from_secs(10), || {
        alarm_list(&endpoint).contains("alarm:NOSPACE")
    });
    let get = etcdctl(&endpoint, &["get", "k"], None);
    assert_eq!(get.code, 0, "reads are served: {get:?}");
    drop(baton);
}

/// A follower's full disk stops the cluster's writes, as etcd's `NOSPACE` does: the follower
/// raises its own alarm through the leader (the one leader duty a member may ask for, and
/// only for itself), so every member lists it and refuses writes that add data with etcd's
/// message while reads are served; when the follower has room again it clears the alarm
/// and writes succeed, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_full_disk_raises_nospace_for_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    // Each member's data directory on a file system of its own, roomy for now.
    let fss: Vec<SmallFs> = ["m1", "m2", "m3"]
        .iter()
        .map(|name| SmallFs::mount_at(dir.path().join(name), "300m"))
        .collect();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let endpoints: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let leader = agreed_leader(&endpoints, Duration::from_secs(20)).await;
    let follower = (leader + 1) % 3;
    let follower_id = member_status(&lazy_channel(&endpoints[follower]))
        .await
        .expect("the follower answers Status")
        .member_id;
    let leader_url = cluster.members[leader].url();
    let follower_url = cluster.members[follower].url();
    let mut via_leader = Client::connect([leader_url], None).await.unwrap();
    let mut via_follower = Client::connect([follower_url], None).await.unwrap();
    via_leader
        .put("before", "the full disk", None)
        .await
        .unwrap();

    // The follower's file system shrinks below the reserve (64 MiB): its disk is "full".
    fss[follower].resize("40m");
    let expected = format!("memberID:{follower_id} alarm:NOSPACE");
    wait_until(
        "the follower's NOSPACE alarm listed by the leader",
        Duration::from_secs(20),
        || alarm_list(&endpoints[leader]).contains(&expected),
    );
    for e in &endpoints {
        assert_eq!(alarm_list(e).trim(), expected, "alarm list on {e}");
    }
    for (who, c) in [("leader", &mut via_leader), ("follower", &mut via_follower)] {
        let err = c
            .put("during", "the full disk", None)
            .await
            .expect_err("a write that adds data is refused under NOSPACE");
        assert!(err.to_string().contains(NO_SPACE), "via the {who}: {err}");
        let got = c.get("before", None).await.expect("reads are served");
        assert_eq!(got.kvs()[0].value(), b"the full disk", "via the {who}");
    }

    // Room again: the follower clears its alarm by itself and writes succeed.
    fss[follower].resize("300m");
    wait_until(
        "the alarm cleared once the follower has room",
        Duration::from_secs(20),
        || alarm_list(&endpoints[leader]).trim().is_empty(),
    );
    via_follower
        .put("after", "space came back", None)
        .await
        .expect("writes succeed again without a restart");
    let got = via_leader.get("after", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"space came back");
    drop(cluster);
}
