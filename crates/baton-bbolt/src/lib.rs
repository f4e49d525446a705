//! # baton-bbolt
//!
//! The bbolt file format (the B+tree database etcd keeps its backend in, `go.etcd.io/bbolt`
//! 1.3), written and read without bbolt's code: what etcd's tools read from a snapshot and
//! what they write into one.
//!
//! - [`Writer`] builds a *fresh, compact* file from buckets given in key order, page by
//!   page, bottom-up, into any `std::io::Write`: it holds one leaf page being filled and the
//!   first keys of the pages below the branch levels still to write, never the data. The
//!   file's two meta pages come first and name the root page and the page count, which are
//!   only known at the end; so into a stream a file is written twice from the same input: a
//!   dry run ([`Writer::plan`]) gives the [`Layout`], the real run ([`Writer::with_layout`])
//!   writes the bytes and asserts it ended where the plan said. Into a file (`Write + Seek`)
//!   one run does ([`Writer::seekable`]): the metas are written over at the end.
//! - [`Db`] reads a file through positional reads ([`ReadAt`]), one page at a time: bucket
//!   by bucket, entries in key order, inline buckets included. Every page it reads is
//!   checked (id, type, element bounds, key order), and [`Db::check`] is bbolt's `tx.Check`
//!   (every page below the high-water mark reachable exactly once or free), which etcdctl
//!   runs before `snapshot status`.
//!
//! The layout facts (`page.rs`): pages of `page_size` bytes (4096 here); page 0 and 1 are
//! meta pages (magic `0xED0CDAED`, version 2, FNV-1a-64 checksum over the meta before its
//! checksum field), page 2 the freelist; every structure little-endian; a leaf element is
//! `flags, pos, ksize, vsize` (u32 each) and a branch element `pos, ksize` (u32) and a child
//! page id (u64), `pos` counting from the element itself; a bucket is a leaf entry with flag
//! 1 whose value is the bucket header (root page id, sequence), followed by the bucket's own
//! page when the root is 0 (inline).

mod error;
mod page;
mod reader;
mod writer;

pub use error::Error;
pub use page::{DEFAULT_PAGE_SIZE, MAGIC, VERSION};
pub use reader::{BucketRef, Db, EntryFn, ReadAt};
pub use writer::{Layout, Placeholder, Writer};
