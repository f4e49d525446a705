//! The reader: a bbolt file through positional reads, one page at a time.
//!
//! Every page is checked as it is read — its id is the one asked for, its type is the one
//! expected, its elements lie inside it, it lies below the high-water mark — and entries must
//! come in strictly increasing key order within a bucket, so a torn or overwritten page is an
//! [`Error`], never a wrong answer. Memory: the pages on the path from a bucket's root to
//! the current leaf (bounded depth), and a copy of the last key for the order check.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::error::Error;
use crate::page::{
    u32_at, u64_at, Meta, PageHeader, BRANCH_ELEMENT, BRANCH_PAGE, BUCKET_HEADER, BUCKET_LEAF_FLAG,
    FREELIST_COUNT_OVERFLOW, FREELIST_PAGE, LEAF_ELEMENT, LEAF_PAGE, MAGIC, META_SIZE, NO_FREELIST,
    PAGE_HEADER, VERSION,
};

/// A B+tree deeper than this is a loop in a damaged file (bbolt's trees of 4 KiB pages are
/// a handful of levels deep for any size that fits a disk).
const MAX_DEPTH: usize = 64;
/// The largest page size accepted: bbolt takes the OS page size, and 64 KiB covers
/// every platform etcd runs on.
const MAX_PAGE_SIZE: u32 = 1 << 16;

/// What [`Db::for_each`] calls for each entry: key, value, whether it is a nested bucket.
pub type EntryFn<'a> = dyn FnMut(&[u8], &[u8], bool) -> Result<(), Error> + 'a;
/// The walk's callback: element flags, key, value.
type ElementFn<'a> = dyn FnMut(u32, &[u8], &[u8]) -> Result<(), Error> + 'a;

/// Positional reads: a file, or bytes in memory (tests).
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn size(&self) -> io::Result<u64>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= self.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(&self[start..end]);
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
}

impl ReadAt for Vec<u8> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.as_slice().read_exact_at(buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
}

/// Where a bucket's tree is: its own root page, or inline in its parent's leaf (the page
/// bytes after the bucket header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketRef {
    Paged(u64),
    Inline(Vec<u8>),
}

/// An open database file. See the module docs.
pub struct Db<R: ReadAt> {
    src: R,
    meta: Meta,
    page_size: usize,
}

impl<R: ReadAt> Db<R> {
    /// Opens a file: picks the valid meta page with the higher transaction id (as bbolt
    /// does), and checks that the file holds every page the meta counts.
    pub fn open(src: R) -> Result<Db<R>, Error> {
        let size = src.size()?;
        let mut first = [0u8; PAGE_HEADER + META_SIZE];
        if size < first.len() as u64 {
            return Err(Error::NotBbolt(format!("{size} bytes is too short")));
        }
        src.read_exact_at(&mut first, 0)?;
        let meta0 = Meta::read(&first[PAGE_HEADER..]);
        if meta0.magic != MAGIC {
            return Err(Error::NotBbolt("no bbolt magic in the first page".into()));
        }
        if meta0.version != VERSION {
            return Err(Error::Version {
                found: meta0.version,
                supported: VERSION,
            });
        }
        if !(1024..=MAX_PAGE_SIZE).contains(&meta0.page_size) || !meta0.page_size.is_power_of_two()
        {
            return Err(Error::NotBbolt(format!("page size {}", meta0.page_size)));
        }
        let page_size = meta0.page_size as usize;
        let mut second = [0u8; PAGE_HEADER + META_SIZE];
        let meta1 = match src.read_exact_at(&mut second, page_size as u64) {
            Ok(()) => Some(Meta::read(&second[PAGE_HEADER..])),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
            Err(e) => return Err(e.into()),
        };
        let valid = |m: &Meta| {
            m.magic == MAGIC
                && m.version == VERSION
                && m.page_size == meta0.page_size
                && m.checksum == m.sum64()
        };
        let meta = match (valid(&meta0), meta1.filter(valid)) {
            (true, Some(m1)) if m1.txid > meta0.txid => m1,
            (true, _) => meta0,
            (false, Some(m1)) => m1,
            (false, None) => return Err(Error::MetaChecksum),
        };
        let needed = meta.pgid.saturating_mul(page_size as u64);
        if size < needed {
            return Err(Error::Truncated {
                needed,
                found: size,
            });
        }
        if meta.root < 2 || meta.root >= meta.pgid {
            return Err(Error::corrupt(
                meta.root,
                "the root bucket's page is out of range",
            ));
        }
        Ok(Db {
            src,
            meta,
            page_size,
        })
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The file's size as bbolt counts it (`tx.Size()`): pages × page size.
    pub fn size(&self) -> u64 {
        self.meta.pgid * self.page_size as u64
    }

    /// The source, for a caller that reads the file further (the snapshot's trailer).
    pub fn source(&self) -> &R {
        &self.src
    }

    /// Reads page `id` whole (with its overflow pages), checked against `expect` flags.
    fn page(&self, id: u64, expect: &[u16]) -> Result<(PageHeader, Vec<u8>), Error> {
        if id < 2 || id >= self.meta.pgid {
            return Err(Error::corrupt(
                id,
                format!("out of bounds (the file has {} pages)", self.meta.pgid),
            ));
        }
        let mut buf = vec![0u8; self.page_size];
        self.src
            .read_exact_at(&mut buf, id * self.page_size as u64)?;
        let header = PageHeader::read(&buf);
        if header.id != id {
            return Err(Error::corrupt(
                id,
                format!("page header says {}", header.id),
            ));
        }
        if !expect.contains(&header.flags) {
            return Err(Error::corrupt(
                id,
                format!("unexpected page type {:#x}", header.flags),
            ));
        }
        if header.overflow > 0 {
            let pages = u64::from(header.overflow) + 1;
            if id + pages > self.meta.pgid {
                return Err(Error::corrupt(id, "overflow past the end of the file"));
            }
            buf.resize(pages as usize * self.page_size, 0);
            self.src
                .read_exact_at(&mut buf[self.page_size..], (id + 1) * self.page_size as u64)?;
        }
        Ok((header, buf))
    }

    /// The buckets at the top level, in name order: `(name, where)`.
    pub fn buckets(&self) -> Result<Vec<(Vec<u8>, BucketRef)>, Error> {
        let mut out = Vec::new();
        self.walk(&BucketRef::Paged(self.meta.root), "", &mut |flags, k, v| {
            if flags & BUCKET_LEAF_FLAG == 0 {
                return Err(Error::corrupt(
                    self.meta.root,
                    format!(
                        "a plain key {:?} at the top level",
                        String::from_utf8_lossy(k)
                    ),
                ));
            }
            out.push((k.to_vec(), bucket_ref(v)?));
            Ok(())
        })?;
        Ok(out)
    }

    /// The top-level bucket `name`, if there is one.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<BucketRef>, Error> {
        Ok(self
            .buckets()?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b))
    }

    /// Calls `f(key, value)` for every entry of `bucket` in key order; a nested bucket is
    /// passed as its header bytes with `is_bucket` true.
    pub fn for_each(
        &self,
        bucket: &BucketRef,
        name: &str,
        f: &mut EntryFn<'_>,
    ) -> Result<(), Error> {
        self.walk(bucket, name, &mut |flags, k, v| {
            f(k, v, flags & BUCKET_LEAF_FLAG != 0)
        })
    }

    fn walk(&self, bucket: &BucketRef, name: &str, f: &mut ElementFn<'_>) -> Result<(), Error> {
        let mut last: Option<Vec<u8>> = None;
        let mut ordered = |flags: u32, k: &[u8], v: &[u8]| -> Result<(), Error> {
            if last.as_deref().is_some_and(|l| l >= k) {
                return Err(Error::Order {
                    bucket: name.to_string(),
                });
            }
            last = Some(k.to_vec());
            f(flags, k, v)
        };
        match bucket {
            BucketRef::Paged(root) => self.walk_page(*root, 0, &mut ordered),
            BucketRef::Inline(page) => {
                let header = PageHeader::read_checked(page)?;
                if header.flags != LEAF_PAGE {
                    return Err(Error::corrupt(0, "an inline bucket that is not a leaf"));
                }
                leaf_elements(0, header, page, &mut ordered)
            }
        }
    }

    fn walk_page(&self, id: u64, depth: usize, f: &mut ElementFn<'_>) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::corrupt(
                id,
                "the tree is deeper than any bbolt file's",
            ));
        }
        let (header, buf) = self.page(id, &[LEAF_PAGE, BRANCH_PAGE])?;
        if header.flags == LEAF_PAGE {
            return leaf_elements(id, header, &buf, f);
        }
        for i in 0..usize::from(header.count) {
            let (_, child) = branch_element(id, &buf, i)?;
            self.walk_page(child, depth + 1, f)?;
        }
        Ok(())
    }

    /// bbolt's `tx.Check`, which etcdctl runs before `snapshot status`: every page below the
    /// high-water mark is reachable exactly once (meta pages, the freelist, every bucket's
    /// pages) or listed free, never both; bucket pages are leaves or branches. Returns the
    /// problems found (empty: the file is whole).
    pub fn check(&self) -> Result<Vec<String>, Error> {
        let pages = usize::try_from(self.meta.pgid)
            .map_err(|_| Error::NotBbolt("too many pages".into()))?;
        let mut problems = Vec::new();
        let mut free = vec![false; pages];
        if self.meta.freelist != NO_FREELIST {
            let (header, buf) = self.page(self.meta.freelist, &[FREELIST_PAGE])?;
            for id in freelist_ids(self.meta.freelist, header, &buf)? {
                match free.get_mut(id as usize) {
                    Some(f) if *f => problems.push(format!("page {id}: already freed")),
                    Some(f) => *f = true,
                    None => problems.push(format!("page {id}: freed page out of bounds")),
                }
            }
        }
        let mut reachable = vec![false; pages];
        reachable[0] = true;
        reachable[1] = true;
        if self.meta.freelist != NO_FREELIST {
            let (header, _) = self.page(self.meta.freelist, &[FREELIST_PAGE])?;
            for i in 0..=u64::from(header.overflow) {
                reachable[(self.meta.freelist + i) as usize] = true;
            }
        }
        self.check_tree(self.meta.root, 0, &mut reachable, &free, &mut problems)?;
        // Without a persisted freelist (etcd's default, `NoFreelistSync`) bbolt takes every
        // unreachable page as free, so only a file with a freelist can leak one.
        if self.meta.freelist != NO_FREELIST {
            for (id, (r, f)) in reachable.iter().zip(&free).enumerate() {
                if !r && !f {
                    problems.push(format!("page {id}: unreachable unfreed"));
                }
            }
        }
        Ok(problems)
    }

    fn check_tree(
        &self,
        id: u64,
        depth: usize,
        reachable: &mut [bool],
        free: &[bool],
        problems: &mut Vec<String>,
    ) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::corrupt(
                id,
                "the tree is deeper than any bbolt file's",
            ));
        }
        let (header, buf) = self.page(id, &[LEAF_PAGE, BRANCH_PAGE])?;
        for i in 0..=u64::from(header.overflow) {
            let page = (id + i) as usize;
            if reachable[page] {
                problems.push(format!("page {page}: multiple references"));
            }
            reachable[page] = true;
            if free[page] {
                problems.push(format!("page {page}: reachable freed"));
            }
        }
        if header.flags == BRANCH_PAGE {
            for i in 0..usize::from(header.count) {
                let (_, child) = branch_element(id, &buf, i)?;
                self.check_tree(child, depth + 1, reachable, free, problems)?;
            }
            return Ok(());
        }
        let mut children = Vec::new();
        leaf_elements(id, header, &buf, &mut |flags, _, v| {
            if flags & BUCKET_LEAF_FLAG != 0 {
                if let BucketRef::Paged(root) = bucket_ref(v)? {
                    children.push(root);
                }
            }
            Ok(())
        })?;
        for root in children {
            self.check_tree(root, depth + 1, reachable, free, problems)?;
        }
        Ok(())
    }
}

impl PageHeader {
    fn read_checked(page: &[u8]) -> Result<PageHeader, Error> {
        if page.len() < PAGE_HEADER {
            return Err(Error::corrupt(
                0,
                "an inline bucket shorter than a page header",
            ));
        }
        Ok(PageHeader::read(page))
    }
}

fn bucket_ref(value: &[u8]) -> Result<BucketRef, Error> {
    if value.len() < BUCKET_HEADER {
        return Err(Error::corrupt(0, "a bucket header shorter than 16 bytes"));
    }
    match u64_at(value, 0) {
        0 => Ok(BucketRef::Inline(value[BUCKET_HEADER..].to_vec())),
        root => Ok(BucketRef::Paged(root)),
    }
}

/// Calls `f(flags, key, value)` for each element of a leaf page, checking that each lies
/// inside the page.
fn leaf_elements(
    id: u64,
    header: PageHeader,
    buf: &[u8],
    f: &mut ElementFn<'_>,
) -> Result<(), Error> {
    let count = usize::from(header.count);
    if PAGE_HEADER + count * LEAF_ELEMENT > buf.len() {
        return Err(Error::corrupt(id, "more elements than fit the page"));
    }
    for i in 0..count {
        let at = PAGE_HEADER + i * LEAF_ELEMENT;
        let flags = u32_at(buf, at);
        let pos = u32_at(buf, at + 4) as usize;
        let ksize = u32_at(buf, at + 8) as usize;
        let vsize = u32_at(buf, at + 12) as usize;
        let start = at + pos;
        let end = start
            .checked_add(ksize)
            .and_then(|e| e.checked_add(vsize))
            .filter(|&e| e <= buf.len());
        let Some(end) = end else {
            return Err(Error::corrupt(
                id,
                format!("element {i} lies outside the page"),
            ));
        };
        if ksize == 0 {
            return Err(Error::corrupt(id, format!("element {i} has an empty key")));
        }
        f(flags, &buf[start..start + ksize], &buf[start + ksize..end])?;
    }
    Ok(())
}

/// The key and child page of a branch page's element `i`.
fn branch_element(id: u64, buf: &[u8], i: usize) -> Result<(&[u8], u64), Error> {
    let at = PAGE_HEADER + i * BRANCH_ELEMENT;
    if at + BRANCH_ELEMENT > buf.len() {
        return Err(Error::corrupt(id, "more elements than fit the page"));
    }
    let pos = u32_at(buf, at) as usize;
    let ksize = u32_at(buf, at + 4) as usize;
    let child = u64_at(buf, at + 8);
    let start = at + pos;
    let key = start
        .checked_add(ksize)
        .filter(|&e| e <= buf.len())
        .map(|e| &buf[start..e])
        .ok_or_else(|| Error::corrupt(id, format!("element {i} lies outside the page")))?;
    if child == id {
        return Err(Error::corrupt(id, "a branch names itself"));
    }
    Ok((key, child))
}

/// The page ids a freelist page lists.
fn freelist_ids(id: u64, header: PageHeader, buf: &[u8]) -> Result<Vec<u64>, Error> {
    let (count, first) = if header.count == FREELIST_COUNT_OVERFLOW {
        if buf.len() < PAGE_HEADER + 8 {
            return Err(Error::corrupt(id, "a freelist without its count"));
        }
        (u64_at(buf, PAGE_HEADER) as usize, PAGE_HEADER + 8)
    } else {
        (usize::from(header.count), PAGE_HEADER)
    };
    if count
        .checked_mul(8)
        .and_then(|b| b.checked_add(first))
        .is_none_or(|end| end > buf.len())
    {
        return Err(Error::corrupt(id, "a freelist longer than its pages"));
    }
    Ok((0..count).map(|i| u64_at(buf, first + 8 * i)).collect())
}
