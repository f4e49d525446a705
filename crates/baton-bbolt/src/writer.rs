//! The bulk writer: a fresh, compact bbolt file from buckets in key order.
//!
//! Pages are written in page-id order, so the output can be a stream:
//!
//! ```text
//! 0, 1   meta pages (root page id and page count: from the plan)
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
//! Memory: one leaf page's elements (a page, or one value larger than a page), and per
//! bucket the first key and id of every page of the level below the one being built, written
//! out when the bucket ends (for etcd's `key` bucket, 17-byte keys: about 33 bytes per 4 KiB
//! of data).

use std::io::Write;

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

/// One element of a page being filled.
struct Element {
    flags: u32,
    key: Vec<u8>,
    /// A leaf's value; empty for a branch element.
    value: Vec<u8>,
    /// A branch element's child page.
    child: u64,
}

/// Elements waiting to become a page, with the bytes they take.
#[derive(Default)]
struct PageFill {
    elements: Vec<Element>,
    bytes: usize,
}

impl PageFill {
    fn clear(&mut self) {
        self.elements.clear();
        self.bytes = PAGE_HEADER;
    }
}

/// A bucket being written.
struct OpenBucket {
    name: Vec<u8>,
    leaf: PageFill,
    /// `(first key, page id)` of every leaf page written so far.
    leaves: Vec<(Vec<u8>, u64)>,
    last_key: Option<Vec<u8>>,
}

/// See the module docs.
pub struct Writer<W: Write> {
    out: W,
    page_size: usize,
    /// `None` in the dry run: meta pages are written as zeros, and nothing is asserted.
    layout: Option<Layout>,
    next_pgid: u64,
    /// The root bucket's entries: `(name, root page id)`.
    buckets: Vec<(Vec<u8>, u64)>,
    open: Option<OpenBucket>,
    /// A page's bytes, reused.
    page: Vec<u8>,
    written: u64,
}

impl Writer<std::io::Sink> {
    /// The dry run: a writer whose output is dropped; [`Writer::finish`] gives the layout.
    pub fn plan(page_size: usize) -> Writer<std::io::Sink> {
        Writer::start(std::io::sink(), page_size, None)
    }
}

impl<W: Write> Writer<W> {
    /// The real run, for the layout the dry run of the same input gave.
    pub fn with_layout(out: W, layout: Layout) -> Result<Writer<W>, Error> {
        let mut w = Writer::start(out, layout.page_size, Some(layout));
        w.write_head()?;
        Ok(w)
    }

    fn start(out: W, page_size: usize, layout: Option<Layout>) -> Writer<W> {
        assert!(
            page_size >= 1024 && page_size.is_power_of_two(),
            "page size {page_size}"
        );
        Writer {
            out,
            page_size,
            layout,
            next_pgid: 0,
            buckets: Vec::new(),
            open: None,
            page: vec![0; page_size],
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Meta pages and the empty freelist. In the dry run the metas are zeros (nobody sees
    /// them); only the page count matters.
    fn write_head(&mut self) -> Result<(), Error> {
        for id in 0..2u64 {
            self.page.fill(0);
            if let Some(l) = self.layout {
                PageHeader {
                    id,
                    flags: META_PAGE,
                    count: 0,
                    overflow: 0,
                }
                .write(&mut self.page);
                Meta::new(l.page_size, l.root, l.pages, TXID).write(&mut self.page[PAGE_HEADER..]);
            }
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
        let mut leaf = PageFill::default();
        leaf.clear();
        self.open = Some(OpenBucket {
            name: name.to_vec(),
            leaf,
            leaves: Vec::new(),
            last_key: None,
        });
        Ok(())
    }

    /// Adds an entry to the open bucket. Keys must come in strictly increasing byte order
    /// and be non-empty (bbolt's rules).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let page_size = self.page_size;
        let open = self
            .open
            .as_mut()
            .ok_or_else(|| Error::Input("put outside a bucket".into()))?;
        if key.is_empty() {
            return Err(Error::Input("empty key".into()));
        }
        if open.last_key.as_deref().is_some_and(|last| last >= key) {
            return Err(Error::Order {
                bucket: String::from_utf8_lossy(&open.name).into_owned(),
            });
        }
        open.last_key = Some(key.to_vec());
        let size = LEAF_ELEMENT + key.len() + value.len();
        let full = !open.leaf.elements.is_empty()
            && (open.leaf.bytes + size > page_size || open.leaf.elements.len() >= MAX_ELEMENTS);
        if full {
            self.flush_leaf()?;
        }
        let open = self.open.as_mut().expect("open bucket");
        open.leaf.elements.push(Element {
            flags: 0,
            key: key.to_vec(),
            value: value.to_vec(),
            child: 0,
        });
        open.leaf.bytes += size;
        Ok(())
    }

    fn flush_leaf(&mut self) -> Result<(), Error> {
        let mut open = self.open.take().expect("open bucket");
        let id = self.write_page(LEAF_PAGE, &open.leaf)?;
        let first = open.leaf.elements[0].key.clone();
        open.leaves.push((first, id));
        open.leaf.clear();
        self.open = Some(open);
        Ok(())
    }

    /// Closes the open bucket: its last leaf, then its branch levels.
    pub fn end_bucket(&mut self) -> Result<(), Error> {
        if self
            .open
            .as_ref()
            .is_some_and(|o| !o.leaf.elements.is_empty())
        {
            self.flush_leaf()?;
        }
        let open = self
            .open
            .take()
            .ok_or_else(|| Error::Input("no bucket is open".into()))?;
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
        while children.len() > 1 {
            let mut parents = Vec::new();
            let mut fill = PageFill::default();
            fill.clear();
            for (key, child) in children {
                let size = BRANCH_ELEMENT + key.len();
                if !fill.elements.is_empty()
                    && (fill.bytes + size > self.page_size || fill.elements.len() >= MAX_ELEMENTS)
                {
                    let id = self.write_page(BRANCH_PAGE, &fill)?;
                    parents.push((fill.elements[0].key.clone(), id));
                    fill.clear();
                }
                fill.bytes += size;
                fill.elements.push(Element {
                    flags: 0,
                    key,
                    value: Vec::new(),
                    child,
                });
            }
            let id = self.write_page(BRANCH_PAGE, &fill)?;
            parents.push((fill.elements[0].key.clone(), id));
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
        for (i, e) in fill.elements.iter().enumerate() {
            let at = PAGE_HEADER + element_size * i;
            let pos = (data - at) as u32;
            if flags == LEAF_PAGE {
                buf[at..at + 4].copy_from_slice(&e.flags.to_le_bytes());
                buf[at + 4..at + 8].copy_from_slice(&pos.to_le_bytes());
                buf[at + 8..at + 12].copy_from_slice(&(e.key.len() as u32).to_le_bytes());
                buf[at + 12..at + 16].copy_from_slice(&(e.value.len() as u32).to_le_bytes());
            } else {
                buf[at..at + 4].copy_from_slice(&pos.to_le_bytes());
                buf[at + 4..at + 8].copy_from_slice(&(e.key.len() as u32).to_le_bytes());
                buf[at + 8..at + 16].copy_from_slice(&e.child.to_le_bytes());
            }
            buf[data..data + e.key.len()].copy_from_slice(&e.key);
            data += e.key.len();
            buf[data..data + e.value.len()].copy_from_slice(&e.value);
            data += e.value.len();
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

    /// Writes the root bucket and returns the layout. In the real run, asserts that it is the
    /// layout the dry run gave: the same input must give the same file.
    pub fn finish(mut self) -> Result<(Layout, W), Error> {
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
                leaves.push((fill.elements[0].key.clone(), id));
                fill.clear();
            }
            fill.bytes += size;
            fill.elements.push(Element {
                flags: BUCKET_LEAF_FLAG,
                key: name,
                value: bucket_header(root, 0).to_vec(),
                child: 0,
            });
        }
        let id = self.write_page(LEAF_PAGE, &fill)?;
        leaves.push((
            fill.elements
                .first()
                .map(|e| e.key.clone())
                .unwrap_or_default(),
            id,
        ));
        let root = self.write_branches(leaves)?;
        let layout = Layout {
            page_size: self.page_size,
            root,
            pages: self.next_pgid,
        };
        if let Some(planned) = self.layout {
            assert_eq!(
                planned, layout,
                "the file ended where its dry run said (the input changed between the runs?)"
            );
        }
        assert_eq!(self.written, layout.file_bytes());
        self.out.flush()?;
        Ok((layout, self.out))
    }
}
