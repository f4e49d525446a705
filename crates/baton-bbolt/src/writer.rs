//! The bulk writer: a fresh, compact bbolt file from buckets in key order.
//!
//! Pages are written in page-id order, so the output can be a stream:
//!
//! ```text
//! 0, 1   meta pages (root page id and page count: from the plan, or written over at the end)
//! 2      the freelist (empty: every page is in use)
//! 3..    each bucket in name order: its leaf pages in key order (a leaf holding a value
//!        larger than a page continues on overflow pages), then its branch levels bottom-up,
//!        the bucket's root page last
//! last   the root bucket: one entry per bucket (flag 1, value = bucket header), its own
//!        branch levels if it needs any; its root is the meta's `root`
//! ```
//!
//! No bucket is written inline (bbolt reads a bucket on its own pages whatever its size,
//! and inlines small ones itself when it next rewrites them). Leaves and branches are filled
//! up to the page size, at least one element each: bbolt reads any fill, and splits or
//! merges pages by its own fill rules only when a later transaction changes them.
//!
//! The meta pages name the root page and the page count, known only at the end. Into a plain
//! `Write` (a stream) a file is therefore written twice from the same input: the dry run
//! ([`Writer::plan`]) gives the [`Layout`], the real run ([`Writer::with_layout`]) writes the
//! bytes and asserts it ended there. Into a `Write + Seek` (a file) one run does
//! ([`Writer::seekable`]): the metas are written as zeros first and over when it finishes,
//! and a value computed from what follows it can be reserved and filled in later
//! ([`Writer::put_placeholder`], [`Writer::fill`]).
//!
//! Memory: one leaf page's elements (a page, or one value larger than a page), and per
//! bucket the first key and id of every page of the level below the one being built, written
//! out when the bucket ends (for etcd's `key` bucket, 17-byte keys: about 33 bytes per 4 KiB
//! of data).

use std::io::{Seek, SeekFrom, Write};

use crate::error::Error;
use crate::page::{
    bucket_header, Meta, PageHeader, BRANCH_ELEMENT, BRANCH_PAGE, BUCKET_LEAF_FLAG, FREELIST_PAGE,
    FREELIST_PGID, LEAF_ELEMENT, LEAF_PAGE, META_PAGE, PAGE_HEADER,
};

/// The first page id after the two meta pages and the freelist.
const FIRST_DATA_PGID: u64 = 3;
/// The transaction id both meta pages carry (bbolt picks the valid meta with the higher id;
/// etcd's own snapshot copies write the same meta on both pages too).
const TXID: u64 = 1;
/// Elements a page may hold: its header's count is a u16.
const MAX_ELEMENTS: usize = 0xFFFF - 1;

/// Where a file ends up: what its meta pages say. The dry run computes it; the real run
/// writes it and asserts it ended there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub page_size: usize,
    /// The root bucket's root page.
    pub root: u64,
    /// Pages in the file (bbolt's high-water mark `pgid`).
    pub pages: u64,
}

impl Layout {
    /// The file's size in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.pages * self.page_size as u64
    }
}

/// One element of a page being filled; its key and value are in [`PageFill::data`].
struct Element {
    flags: u32,
    key_len: usize,
    /// A leaf's value length; 0 for a branch element.
    value_len: usize,
    /// A branch element's child page.
    child: u64,
    /// The placeholder its value is (see [`Writer::put_placeholder`]).
    placeholder: Option<usize>,
}

/// Elements waiting to become a page, with the bytes they take. Keys and values go back to
/// back into one buffer, reused from page to page: no allocation per entry.
#[derive(Default)]
struct PageFill {
    elements: Vec<Element>,
    data: Vec<u8>,
    bytes: usize,
}

impl PageFill {
    fn clear(&mut self) {
        self.elements.clear();
        self.data.clear();
        self.bytes = PAGE_HEADER;
    }

    fn push(&mut self, element: Element, key: &[u8], value: &[u8], element_size: usize) {
        debug_assert_eq!(
            (element.key_len, element.value_len),
            (key.len(), value.len())
        );
        self.bytes += element_size + key.len() + value.len();
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
        self.elements.push(element);
    }

    fn first_key(&self) -> Vec<u8> {
        self.elements
            .first()
            .map(|e| self.data[..e.key_len].to_vec())
            .unwrap_or_default()
    }
}

/// Where the meta pages' contents come from.
#[derive(Debug, Clone, Copy)]
enum Metas {
    /// The dry run: written as zeros (the output is dropped); only the page count matters.
    Plan,
    /// The real run of a plan: written first, and the end asserted to be the plan's.
    Planned(Layout),
    /// One run into a seekable output: zeros first, written over by
    /// [`Writer::finish_seekable`].
    AtEnd,
}

/// A value reserved by [`Writer::put_placeholder`], to be given by [`Writer::fill`].
#[derive(Debug)]
#[must_use = "a placeholder left unfilled stays zeros in the file"]
pub struct Placeholder {
    index: usize,
    len: usize,
}

/// A bucket being written.
struct OpenBucket {
    name: Vec<u8>,
    /// `(first key, page id)` of every leaf page written so far.
    leaves: Vec<(Vec<u8>, u64)>,
    /// Whether the bucket has an entry yet (then `last_key` is its last key).
    has_entries: bool,
}

/// See the module docs.
pub struct Writer<W: Write> {
    out: W,
    page_size: usize,
    metas: Metas,
    next_pgid: u64,
    /// The root bucket's entries: `(name, root page id)`.
    buckets: Vec<(Vec<u8>, u64)>,
    open: Option<OpenBucket>,
    /// The open bucket's leaf page being filled (reused from bucket to bucket).
    leaf: PageFill,
    /// The last key put into the open bucket (reused).
    last_key: Vec<u8>,
    /// A page's bytes, reused.
    page: Vec<u8>,
    written: u64,
    /// Each placeholder's file offset, once its page is written.
    placeholders: Vec<Option<u64>>,
}

impl Writer<std::io::Sink> {
    /// The dry run: a writer whose output is dropped; [`Writer::finish`] gives the layout.
    pub fn plan(page_size: usize) -> Writer<std::io::Sink> {
        Writer::start(std::io::sink(), page_size, Metas::Plan)
    }
}

impl<W: Write + Seek> Writer<W> {
    /// The one run into a seekable output, which must be empty and positioned at its start
    /// (a fresh file): finish it with [`Writer::finish_seekable`].
    pub fn seekable(out: W, page_size: usize) -> Result<Writer<W>, Error> {
        let mut w = Writer::start(out, page_size, Metas::AtEnd);
        w.write_head()?;
        Ok(w)
    }

    /// Gives the value of `placeholder`, whose bucket must have ended (its page is written).
    pub fn fill(&mut self, placeholder: Placeholder, value: &[u8]) -> Result<(), Error> {
        if value.len() != placeholder.len {
            return Err(Error::Input(format!(
                "a placeholder of {} bytes filled with {}",
                placeholder.len,
                value.len()
            )));
        }
        let at = match self.placeholders.get(placeholder.index) {
            Some(Some(at)) => *at,
            Some(None) => {
                return Err(Error::Input(
                    "a placeholder filled before its page was written".into(),
                ))
            }
            None => return Err(Error::Input("a placeholder of another writer".into())),
        };
        self.out.seek(SeekFrom::Start(at))?;
        self.out.write_all(value)?;
        self.out.seek(SeekFrom::Start(self.written))?;
        Ok(())
    }

    /// Writes the root bucket, then the meta pages over the zeros at the start; returns the
    /// layout and the output (flushed, positioned at its end).
    pub fn finish_seekable(self) -> Result<(Layout, W), Error> {
        if !matches!(self.metas, Metas::AtEnd) {
            return Err(Error::Input(
                "finish_seekable of a writer made by seekable only".into(),
            ));
        }
        let (layout, mut w) = self.finish_pages()?;
        w.out.seek(SeekFrom::Start(0))?;
        for id in 0..2u64 {
            w.meta_page(id, Some(layout));
            w.out.write_all(&w.page[..w.page_size])?;
        }
        w.out.seek(SeekFrom::Start(w.written))?;
        w.out.flush()?;
        Ok((layout, w.out))
    }
}

impl<W: Write> Writer<W> {
    /// The real run, for the layout the dry run of the same input gave.
    pub fn with_layout(out: W, layout: Layout) -> Result<Writer<W>, Error> {
        let mut w = Writer::start(out, layout.page_size, Metas::Planned(layout));
        w.write_head()?;
        Ok(w)
    }

    fn start(out: W, page_size: usize, metas: Metas) -> Writer<W> {
        assert!(
            page_size >= 1024 && page_size.is_power_of_two(),
            "page size {page_size}"
        );
        Writer {
            out,
            page_size,
            metas,
            next_pgid: 0,
            buckets: Vec::new(),
            open: None,
            leaf: PageFill::default(),
            last_key: Vec::new(),
            page: vec![0; page_size],
            written: 0,
            placeholders: Vec::new(),
        }
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Meta pages and the empty freelist. The metas are zeros unless the layout is known
    /// (the real run of a plan); nobody reads a dry run's, and a seekable run's are written
    /// over at the end.
    fn write_head(&mut self) -> Result<(), Error> {
        let layout = match self.metas {
            Metas::Planned(l) => Some(l),
            Metas::Plan | Metas::AtEnd => None,
        };
        for id in 0..2u64 {
            self.meta_page(id, layout);
            self.emit_page_buf(1)?;
        }
        self.page.fill(0);
        PageHeader {
            id: FREELIST_PGID,
            flags: FREELIST_PAGE,
            count: 0,
            overflow: 0,
        }
        .write(&mut self.page);
        self.emit_page_buf(1)?;
        debug_assert_eq!(self.next_pgid, FIRST_DATA_PGID);
        Ok(())
    }

    /// Meta page `id` for `layout` (zeros for `None`) into the page buffer.
    fn meta_page(&mut self, id: u64, layout: Option<Layout>) {
        self.page.fill(0);
        if let Some(l) = layout {
            PageHeader {
                id,
                flags: META_PAGE,
                count: 0,
                overflow: 0,
            }
            .write(&mut self.page);
            Meta::new(l.page_size, l.root, l.pages, TXID).write(&mut self.page[PAGE_HEADER..]);
        }
    }

    fn emit_page_buf(&mut self, pages: usize) -> Result<(), Error> {
        self.out.write_all(&self.page[..pages * self.page_size])?;
        self.written += (pages * self.page_size) as u64;
        self.next_pgid += pages as u64;
        Ok(())
    }

    /// Starts the next bucket. Names must come in strictly increasing byte order.
    pub fn begin_bucket(&mut self, name: &[u8]) -> Result<(), Error> {
        if self.next_pgid == 0 {
            self.write_head()?;
        }
        if self.open.is_some() {
            return Err(Error::Input("a bucket is already open".into()));
        }
        if name.is_empty() {
            return Err(Error::Input("empty bucket name".into()));
        }
        if self
            .buckets
            .last()
            .is_some_and(|(last, _)| last.as_slice() >= name)
        {
            return Err(Error::Order {
                bucket: String::from_utf8_lossy(name).into_owned(),
            });
        }
        self.leaf.clear();
        self.open = Some(OpenBucket {
            name: name.to_vec(),
            leaves: Vec::new(),
            has_entries: false,
        });
        Ok(())
    }

    /// Adds an entry to the open bucket. Keys must come in strictly increasing byte order
    /// and be non-empty (bbolt's rules).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.put_element(key, value, None)
    }

    /// [`Writer::put`] of `len` zero bytes, to be replaced by [`Writer::fill`] once the bucket
    /// has ended (for a value computed from entries that come after it).
    pub fn put_placeholder(&mut self, key: &[u8], len: usize) -> Result<Placeholder, Error> {
        let index = self.placeholders.len();
        self.put_element(key, &vec![0; len], Some(index))?;
        self.placeholders.push(None);
        Ok(Placeholder { index, len })
    }

    fn put_element(
        &mut self,
        key: &[u8],
        value: &[u8],
        placeholder: Option<usize>,
    ) -> Result<(), Error> {
        let open = self
            .open
            .as_mut()
            .ok_or_else(|| Error::Input("put outside a bucket".into()))?;
        if key.is_empty() {
            return Err(Error::Input("empty key".into()));
        }
        if open.has_entries && self.last_key.as_slice() >= key {
            return Err(Error::Order {
                bucket: String::from_utf8_lossy(&open.name).into_owned(),
            });
        }
        open.has_entries = true;
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        let size = LEAF_ELEMENT + key.len() + value.len();
        let full = !self.leaf.elements.is_empty()
            && (self.leaf.bytes + size > self.page_size
                || self.leaf.elements.len() >= MAX_ELEMENTS);
        if full {
            self.flush_leaf()?;
        }
        self.leaf.push(
            Element {
                flags: 0,
                key_len: key.len(),
                value_len: value.len(),
                child: 0,
                placeholder,
            },
            key,
            value,
            LEAF_ELEMENT,
        );
        Ok(())
    }

    fn flush_leaf(&mut self) -> Result<(), Error> {
        let leaf = std::mem::take(&mut self.leaf);
        let written = self.write_page(LEAF_PAGE, &leaf);
        self.leaf = leaf;
        let id = written?;
        let first = self.leaf.first_key();
        self.open
            .as_mut()
            .expect("open bucket")
            .leaves
            .push((first, id));
        self.leaf.clear();
        Ok(())
    }

    /// Closes the open bucket: its last leaf, then its branch levels.
    pub fn end_bucket(&mut self) -> Result<(), Error> {
        if self.open.is_none() {
            return Err(Error::Input("no bucket is open".into()));
        }
        if !self.leaf.elements.is_empty() {
            self.flush_leaf()?;
        }
        let open = self.open.take().expect("checked above");
        let root = if open.leaves.is_empty() {
            // An empty bucket: one empty leaf page.
            let mut empty = PageFill::default();
            empty.clear();
            self.write_page(LEAF_PAGE, &empty)?
        } else {
            self.write_branches(open.leaves)?
        };
        self.buckets.push((open.name, root));
        Ok(())
    }

    /// Writes branch levels over `children` until one page is left; returns its id.
    fn write_branches(&mut self, mut children: Vec<(Vec<u8>, u64)>) -> Result<u64, Error> {
        let mut fill = PageFill::default();
        while children.len() > 1 {
            let mut parents = Vec::new();
            fill.clear();
            for (key, child) in children {
                let size = BRANCH_ELEMENT + key.len();
                if !fill.elements.is_empty()
                    && (fill.bytes + size > self.page_size || fill.elements.len() >= MAX_ELEMENTS)
                {
                    let id = self.write_page(BRANCH_PAGE, &fill)?;
                    parents.push((fill.first_key(), id));
                    fill.clear();
                }
                fill.push(
                    Element {
                        flags: 0,
                        key_len: key.len(),
                        value_len: 0,
                        child,
                        placeholder: None,
                    },
                    &key,
                    &[],
                    BRANCH_ELEMENT,
                );
            }
            let id = self.write_page(BRANCH_PAGE, &fill)?;
            parents.push((fill.first_key(), id));
            children = parents;
        }
        Ok(children[0].1)
    }

    /// Writes one page (with overflow pages if its elements need them); returns its id.
    fn write_page(&mut self, flags: u16, fill: &PageFill) -> Result<u64, Error> {
        let id = self.next_pgid;
        let pages = fill.bytes.div_ceil(self.page_size).max(1);
        if self.page.len() < pages * self.page_size {
            self.page.resize(pages * self.page_size, 0);
        }
        let buf = &mut self.page[..pages * self.page_size];
        buf.fill(0);
        PageHeader {
            id,
            flags,
            count: fill.elements.len() as u16,
            overflow: (pages - 1) as u32,
        }
        .write(buf);
        let element_size = if flags == LEAF_PAGE {
            LEAF_ELEMENT
        } else {
            BRANCH_ELEMENT
        };
        let mut data = PAGE_HEADER + element_size * fill.elements.len();
        let mut from = 0;
        for (i, e) in fill.elements.iter().enumerate() {
            let at = PAGE_HEADER + element_size * i;
            let pos = (data - at) as u32;
            if flags == LEAF_PAGE {
                buf[at..at + 4].copy_from_slice(&e.flags.to_le_bytes());
                buf[at + 4..at + 8].copy_from_slice(&pos.to_le_bytes());
                buf[at + 8..at + 12].copy_from_slice(&(e.key_len as u32).to_le_bytes());
                buf[at + 12..at + 16].copy_from_slice(&(e.value_len as u32).to_le_bytes());
            } else {
                buf[at..at + 4].copy_from_slice(&pos.to_le_bytes());
                buf[at + 4..at + 8].copy_from_slice(&(e.key_len as u32).to_le_bytes());
                buf[at + 8..at + 16].copy_from_slice(&e.child.to_le_bytes());
            }
            let len = e.key_len + e.value_len;
            buf[data..data + len].copy_from_slice(&fill.data[from..from + len]);
            if let Some(p) = e.placeholder {
                let value_at = id * self.page_size as u64 + (data + e.key_len) as u64;
                self.placeholders[p] = Some(value_at);
            }
            data += len;
            from += len;
        }
        assert_eq!(
            data, fill.bytes,
            "a page's elements and their byte count agree"
        );
        self.emit_page_buf(pages)?;
        if self.page.len() > self.page_size {
            // A large value's buffer is not kept for the rest of the file.
            self.page.truncate(self.page_size);
            self.page.shrink_to_fit();
        }
        Ok(id)
    }

    /// Writes the root bucket and returns the layout and the output. The real run of a plan
    /// asserts that it is the layout the dry run gave: the same input must give the same
    /// file. A [`Writer::seekable`] is finished by [`Writer::finish_seekable`] instead.
    pub fn finish(self) -> Result<(Layout, W), Error> {
        if matches!(self.metas, Metas::AtEnd) {
            return Err(Error::Input(
                "a seekable writer is finished by finish_seekable (its metas are still zeros)"
                    .into(),
            ));
        }
        let (layout, mut w) = self.finish_pages()?;
        w.out.flush()?;
        Ok((layout, w.out))
    }

    /// Writes the root bucket; returns the layout.
    fn finish_pages(mut self) -> Result<(Layout, Self), Error> {
        if self.open.is_some() {
            return Err(Error::Input("a bucket is still open".into()));
        }
        if self.next_pgid == 0 {
            self.write_head()?;
        }
        let buckets = std::mem::take(&mut self.buckets);
        let mut leaves = Vec::new();
        let mut fill = PageFill::default();
        fill.clear();
        for (name, root) in buckets {
            let size = LEAF_ELEMENT + name.len() + 16;
            if !fill.elements.is_empty() && fill.bytes + size > self.page_size {
                let id = self.write_page(LEAF_PAGE, &fill)?;
                leaves.push((fill.first_key(), id));
                fill.clear();
            }
            let header = bucket_header(root, 0);
            fill.push(
                Element {
                    flags: BUCKET_LEAF_FLAG,
                    key_len: name.len(),
                    value_len: header.len(),
                    child: 0,
                    placeholder: None,
                },
                &name,
                &header,
                LEAF_ELEMENT,
            );
        }
        let id = self.write_page(LEAF_PAGE, &fill)?;
        leaves.push((fill.first_key(), id));
        let root = self.write_branches(leaves)?;
        let layout = Layout {
            page_size: self.page_size,
            root,
            pages: self.next_pgid,
        };
        if let Metas::Planned(planned) = self.metas {
            assert_eq!(
                planned, layout,
                "the file ended where its dry run said (the input changed between the runs?)"
            );
        }
        assert_eq!(self.written, layout.file_bytes());
        Ok((layout, self))
    }
}
