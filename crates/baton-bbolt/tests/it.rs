//! The bbolt writer and reader against each other, against a file etcd 3.4.23 wrote, and
//! against etcd's own tool (`etcdctl snapshot status` opens the file with bbolt's Go code and
//! runs bbolt's integrity check).

use baton_bbolt::{BucketRef, Db, Layout, Writer, DEFAULT_PAGE_SIZE};

type Buckets = Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

/// Writes `buckets` with the two runs the writer needs.
fn write(buckets: &Buckets) -> (Layout, Vec<u8>) {
    let mut plan = Writer::plan(DEFAULT_PAGE_SIZE);
    feed(&mut plan, buckets);
    let (layout, _) = plan.finish().unwrap();
    let mut w = Writer::with_layout(Vec::new(), layout).unwrap();
    feed(&mut w, buckets);
    let (again, bytes) = w.finish().unwrap();
    assert_eq!(layout, again);
    assert_eq!(bytes.len() as u64, layout.file_bytes());
    (layout, bytes)
}

fn feed<W: std::io::Write>(w: &mut Writer<W>, buckets: &Buckets) {
    for (name, entries) in buckets {
        w.begin_bucket(name).unwrap();
        for (k, v) in entries {
            w.put(k, v).unwrap();
        }
        w.end_bucket().unwrap();
    }
}

fn read_all<R: baton_bbolt::ReadAt>(db: &Db<R>) -> Buckets {
    let mut out = Vec::new();
    for (name, bucket) in db.buckets().unwrap() {
        let mut entries = Vec::new();
        db.for_each(&bucket, "b", &mut |k, v, is_bucket| {
            assert!(!is_bucket);
            entries.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        out.push((name, entries));
    }
    out
}

fn sample(keys: usize, value_len: impl Fn(usize) -> usize) -> Buckets {
    let big: Vec<(Vec<u8>, Vec<u8>)> = (0..keys)
        .map(|i| {
            (
                format!("key{i:08}").into_bytes(),
                vec![(i % 251) as u8; value_len(i)],
            )
        })
        .collect();
    vec![
        (b"alarm".to_vec(), Vec::new()),
        (b"data".to_vec(), big),
        (
            b"meta".to_vec(),
            vec![(b"consistent_index".to_vec(), 7u64.to_be_bytes().to_vec())],
        ),
    ]
}

/// Small values (many per leaf, several branch levels), values larger than a page (overflow
/// pages), an empty bucket, no bucket at all.
fn shapes() -> [Buckets; 4] {
    [
        sample(20_000, |i| i % 40),
        sample(300, |i| if i % 7 == 0 { 10_000 + i } else { 30 }),
        sample(0, |_| 0),
        Vec::new(),
    ]
}

#[test]
fn what_is_written_reads_back_with_no_integrity_problem() {
    for buckets in shapes() {
        let (layout, bytes) = write(&buckets);
        let db = Db::open(bytes.clone()).unwrap();
        assert_eq!(db.size(), layout.file_bytes());
        assert_eq!(db.check().unwrap(), Vec::<String>::new());
        assert_eq!(read_all(&db), buckets);
    }
}

/// The page layout, byte for byte, of the smallest file with data: one bucket `b` with
/// `k → v`. Pages: 0 and 1 meta, 2 the empty freelist, 3 the bucket's leaf, 4 the root bucket.
#[test]
fn page_layout_of_a_one_entry_file() {
    let (layout, bytes) = write(&vec![(b"b".to_vec(), vec![(b"k".to_vec(), b"v".to_vec())])]);
    assert_eq!(
        layout,
        Layout {
            page_size: 4096,
            root: 4,
            pages: 5
        }
    );
    let page = |n: usize| &bytes[n * 4096..(n + 1) * 4096];
    let le16 = |b: &[u8]| u16::from_le_bytes(b.try_into().unwrap());
    let le32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
    let le64 = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    for id in 0..2 {
        let p = page(id);
        // header: id, flags = meta (4), count 0, overflow 0
        assert_eq!(le64(&p[0..8]), id as u64);
        assert_eq!(le16(&p[8..10]), 0x04);
        // meta: magic, version 2, page size, flags 0, root {4, seq 0}, freelist 2, pgid 5, txid 1
        assert_eq!(le32(&p[16..20]), 0xED0C_DAED);
        assert_eq!(le32(&p[20..24]), 2);
        assert_eq!(le32(&p[24..28]), 4096);
        assert_eq!(le32(&p[28..32]), 0);
        assert_eq!(le64(&p[32..40]), 4);
        assert_eq!(le64(&p[40..48]), 0);
        assert_eq!(le64(&p[48..56]), 2);
        assert_eq!(le64(&p[56..64]), 5);
        assert_eq!(le64(&p[64..72]), 1);
        // FNV-1a-64 over the 56 meta bytes before the checksum
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in &p[16..72] {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(le64(&p[72..80]), h);
        assert!(p[80..].iter().all(|b| *b == 0));
    }
    // freelist: id 2, flags 0x10, count 0
    assert_eq!(
        &page(2)[..16],
        &[2, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]
    );
    // the bucket's leaf: id 3, flags 2, count 1; element {flags 0, pos 16, ksize 1, vsize 1}
    // at 16, then "kv" right after it (pos counts from the element)
    let leaf = page(3);
    assert_eq!(
        &leaf[..16],
        &[3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        &leaf[16..32],
        &[0, 0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
    );
    assert_eq!(&leaf[32..34], b"kv");
    // the root bucket: element {flags 1 (bucket), pos 16, ksize 1, vsize 16}, then "b" and
    // the bucket header {root 3, sequence 0}
    let root = page(4);
    assert_eq!(
        &root[..16],
        &[4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        &root[16..32],
        &[1, 0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0, 16, 0, 0, 0]
    );
    assert_eq!(&root[32..33], b"b");
    assert_eq!(le64(&root[33..41]), 3);
    assert_eq!(le64(&root[41..49]), 0);
}

/// One run into a seekable output writes the very bytes of the two runs into a stream.
fn write_seekable(buckets: &Buckets) -> (Layout, Vec<u8>) {
    let mut w = Writer::seekable(std::io::Cursor::new(Vec::new()), DEFAULT_PAGE_SIZE).unwrap();
    feed(&mut w, buckets);
    let (layout, out) = w.finish_seekable().unwrap();
    assert_eq!(out.position(), layout.file_bytes(), "left at its end");
    (layout, out.into_inner())
}

#[test]
fn one_seekable_run_writes_what_two_runs_write() {
    for buckets in shapes() {
        let two = write(&buckets);
        let one = write_seekable(&buckets);
        assert_eq!(one.0, two.0);
        assert!(one.1 == two.1, "same bytes");
        let db = Db::open(one.1).unwrap();
        assert_eq!(db.check().unwrap(), Vec::<String>::new());
        assert_eq!(read_all(&db), buckets);
    }
}

#[test]
fn a_placeholder_is_filled_in_place() {
    let mut buckets = sample(5_000, |i| i % 100);
    // `a` precedes `data`; its `sum` value is computed from `data`'s entries.
    let sum = |data: &[(Vec<u8>, Vec<u8>)]| {
        let total: u64 = data.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
        total.to_be_bytes().to_vec()
    };
    let data = buckets[1].1.clone();
    let mut w = Writer::seekable(std::io::Cursor::new(Vec::new()), DEFAULT_PAGE_SIZE).unwrap();
    w.begin_bucket(b"a").unwrap();
    w.put(b"before", b"x").unwrap();
    let placeholder = w.put_placeholder(b"sum", 8).unwrap();
    w.put(b"zafter", b"y").unwrap();
    w.end_bucket().unwrap();
    for (name, entries) in &buckets {
        w.begin_bucket(name).unwrap();
        for (k, v) in entries {
            w.put(k, v).unwrap();
        }
        w.end_bucket().unwrap();
    }
    w.fill(placeholder, &sum(&data)).unwrap();
    let (_, out) = w.finish_seekable().unwrap();
    buckets.insert(
        1,
        (
            b"a".to_vec(),
            vec![
                (b"before".to_vec(), b"x".to_vec()),
                (b"sum".to_vec(), sum(&data)),
                (b"zafter".to_vec(), b"y".to_vec()),
            ],
        ),
    );
    buckets.sort();
    let db = Db::open(out.into_inner()).unwrap();
    assert_eq!(db.check().unwrap(), Vec::<String>::new());
    assert_eq!(read_all(&db), buckets);
}

#[test]
fn placeholders_are_filled_once_written_and_with_their_length() {
    let mut w = Writer::seekable(std::io::Cursor::new(Vec::new()), DEFAULT_PAGE_SIZE).unwrap();
    w.begin_bucket(b"a").unwrap();
    let early = w.put_placeholder(b"k", 4).unwrap();
    assert!(
        w.fill(early, b"1234").is_err(),
        "its page is not written yet"
    );
    let short = w.put_placeholder(b"l", 4).unwrap();
    w.end_bucket().unwrap();
    assert!(w.fill(short, b"123").is_err(), "not its length");
    // A writer for a stream has no seekable finish, and a seekable one no plain finish.
    assert!(w.finish().is_err());
    let (layout, _) = write(&sample(10, |_| 1));
    let planned = Writer::with_layout(std::io::Cursor::new(Vec::new()), layout).unwrap();
    assert!(planned.finish_seekable().is_err());
}

#[test]
fn input_out_of_order_is_refused() {
    let mut w = Writer::plan(DEFAULT_PAGE_SIZE);
    w.begin_bucket(b"b").unwrap();
    w.put(b"k2", b"").unwrap();
    assert!(w.put(b"k1", b"").is_err());
    assert!(w.put(b"k2", b"").is_err());
    assert!(w.put(b"", b"").is_err());
    w.end_bucket().unwrap();
    assert!(w.begin_bucket(b"a").is_err());
}

#[test]
fn damaged_files_are_refused_with_what_is_wrong() {
    let (_, bytes) = write(&sample(5_000, |i| i % 100));
    // truncated
    let short = bytes[..bytes.len() - 4096].to_vec();
    let err = Db::open(short).err().unwrap().to_string();
    assert!(err.contains("truncated"), "{err}");
    // not bbolt
    assert!(Db::open(vec![7u8; 8192])
        .err()
        .unwrap()
        .to_string()
        .contains("not a bbolt"));
    // both metas damaged
    let mut metas = bytes.clone();
    metas[16 + 30] ^= 1;
    metas[4096 + 16 + 30] ^= 1;
    assert!(matches!(
        Db::open(metas),
        Err(baton_bbolt::Error::MetaChecksum)
    ));
    // one meta damaged: the other is used
    let mut one = bytes.clone();
    one[16 + 30] ^= 1;
    assert_eq!(
        read_all(&Db::open(one).unwrap()),
        sample(5_000, |i| i % 100)
    );
    // a torn data page (its header id overwritten) fails the read, not a wrong answer
    let mut torn = bytes.clone();
    let p = 10 * 4096;
    torn[p..p + 8].copy_from_slice(&999u64.to_le_bytes());
    let db = Db::open(torn).unwrap();
    let err = db
        .buckets()
        .and_then(|bs| {
            for (_, b) in bs {
                db.for_each(&b, "key", &mut |_, _, _| Ok(()))?;
            }
            Ok(())
        })
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("page 10"), "{err}");
    // keys swapped inside a leaf: out of order
    let mut swapped = bytes;
    let leaf = 4 * 4096; // page 3 is the empty `alarm` bucket
    let first = 16 + 16 * usize::from(u16::from_le_bytes([swapped[leaf + 10], swapped[leaf + 11]]));
    swapped[leaf + first + 3] = b'9';
    let db = Db::open(swapped).unwrap();
    let key = db.bucket(b"data").unwrap().unwrap();
    let err = db
        .for_each(&key, "key", &mut |_, _, _| Ok(()))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("out of order"), "{err}");
}

/// A snapshot `etcdctl snapshot save` took from a real etcd 3.4.23 (made with
/// `etcdctl put/del/txn/compact`, a lease, users and roles, auth on; `etcdctl snapshot
/// status -w json` said `{"hash":121796997,"revision":110,"totalKey":146,"totalSize":69632}`):
/// every bucket etcd writes reads back, inline buckets included, with no integrity problem.
#[test]
fn a_snapshot_etcd_wrote_reads_back() {
    let raw = std::fs::read("tests/fixtures/etcd-3.4.23-snapshot.db").unwrap();
    let db = Db::open(raw[..raw.len() - 32].to_vec()).unwrap();
    assert_eq!(db.size(), 69632);
    assert_eq!(db.check().unwrap(), Vec::<String>::new());
    let names: Vec<String> = db
        .buckets()
        .unwrap()
        .into_iter()
        .map(|(n, _)| String::from_utf8(n).unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "alarm",
            "auth",
            "authRoles",
            "authUsers",
            "cluster",
            "key",
            "lease",
            "members",
            "members_removed",
            "meta"
        ]
    );
    let mut total = 0;
    let mut inline = 0;
    for (_, bucket) in db.buckets().unwrap() {
        if matches!(bucket, BucketRef::Inline(_)) {
            inline += 1;
        }
        db.for_each(&bucket, "", &mut |_, _, _| {
            total += 1;
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(total, 146);
    assert!(inline > 0, "etcd's small buckets are inline");
}

/// etcd's own tool opens what the writer wrote: `etcdctl snapshot status` (bbolt's Go code,
/// its integrity check, every bucket walked) counts every entry and the file's size.
#[test]
fn etcdctl_reads_what_the_writer_wrote() {
    use sha2::Digest;
    let buckets = sample(30_000, |i| if i % 1000 == 0 { 9000 } else { i % 50 });
    let (layout, mut bytes) = write(&buckets);
    let sha = sha2::Sha256::digest(&bytes);
    bytes.extend_from_slice(&sha);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.db");
    std::fs::write(&path, &bytes).unwrap();
    let out = std::process::Command::new("etcdctl")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&path)
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl (etcd 3.4's client) must be installed: scripts/install-deps");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total: usize = buckets.iter().map(|(_, e)| e.len()).sum();
    assert!(text.contains(&format!("\"totalKey\":{total}")), "{text}");
    assert!(
        text.contains(&format!("\"totalSize\":{}", layout.file_bytes())),
        "{text}"
    );
}
