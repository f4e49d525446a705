//! The on-disk structures of a bbolt file (bbolt 1.3's `page.go`, `db.go` meta, `bucket.go`
//! header) as byte offsets: encoded and decoded here only, little-endian as bbolt writes
//! them on every platform etcd runs on.

use std::hash::Hasher;

/// bbolt's magic number, first field of a meta page.
pub const MAGIC: u32 = 0xED0C_DAED;
/// The data file format version bbolt 1.3 writes and reads.
pub const VERSION: u32 = 2;
/// The page size Baton writes: the OS page size on every platform etcd supports, and what
/// etcd's own files use there. (A reader takes the size from the file's meta.)
pub const DEFAULT_PAGE_SIZE: usize = 4096;

/// `id u64, flags u16, count u16, overflow u32`.
pub(crate) const PAGE_HEADER: usize = 16;
/// `flags, pos, ksize, vsize`, u32 each.
pub(crate) const LEAF_ELEMENT: usize = 16;
/// `pos u32, ksize u32, pgid u64`.
pub(crate) const BRANCH_ELEMENT: usize = 16;
/// `root pgid u64, sequence u64`: a bucket's value in its parent.
pub(crate) const BUCKET_HEADER: usize = 16;
/// The meta fields before `checksum`: the bytes the FNV-1a-64 checksum covers.
pub(crate) const META_SUMMED: usize = 56;
/// `magic, version, page_size, flags` (u32), `root` (bucket header), `freelist, pgid, txid,
/// checksum` (u64).
pub(crate) const META_SIZE: usize = META_SUMMED + 8;

pub(crate) const BRANCH_PAGE: u16 = 0x01;
pub(crate) const LEAF_PAGE: u16 = 0x02;
pub(crate) const META_PAGE: u16 = 0x04;
pub(crate) const FREELIST_PAGE: u16 = 0x10;
/// A leaf element that is a nested bucket.
pub(crate) const BUCKET_LEAF_FLAG: u32 = 0x01;
/// The page the freelist lives on in a file Baton writes.
pub(crate) const FREELIST_PGID: u64 = 2;
/// A freelist page whose count field holds this has its real count in its first element.
pub(crate) const FREELIST_COUNT_OVERFLOW: u16 = 0xFFFF;
/// bbolt's marker for "the freelist is not persisted" (`NoFreelistSync`).
pub(crate) const NO_FREELIST: u64 = u64::MAX;

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A page header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageHeader {
    pub(crate) id: u64,
    pub(crate) flags: u16,
    pub(crate) count: u16,
    pub(crate) overflow: u32,
}

impl PageHeader {
    pub(crate) fn write(&self, page: &mut [u8]) {
        page[0..8].copy_from_slice(&self.id.to_le_bytes());
        page[8..10].copy_from_slice(&self.flags.to_le_bytes());
        page[10..12].copy_from_slice(&self.count.to_le_bytes());
        page[12..16].copy_from_slice(&self.overflow.to_le_bytes());
    }

    pub(crate) fn read(page: &[u8]) -> PageHeader {
        PageHeader {
            id: u64_at(page, 0),
            flags: u16_at(page, 8),
            count: u16_at(page, 10),
            overflow: u32_at(page, 12),
        }
    }
}

/// A meta page's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) magic: u32,
    pub(crate) version: u32,
    pub(crate) page_size: u32,
    pub(crate) flags: u32,
    pub(crate) root: u64,
    pub(crate) sequence: u64,
    pub(crate) freelist: u64,
    pub(crate) pgid: u64,
    pub(crate) txid: u64,
    pub(crate) checksum: u64,
}

impl Meta {
    /// The meta of a file Baton writes: root page `root`, `pages` pages in all.
    pub(crate) fn new(page_size: usize, root: u64, pages: u64, txid: u64) -> Meta {
        let mut m = Meta {
            magic: MAGIC,
            version: VERSION,
            page_size: page_size as u32,
            flags: 0,
            root,
            sequence: 0,
            freelist: FREELIST_PGID,
            pgid: pages,
            txid,
            checksum: 0,
        };
        m.checksum = m.sum64();
        m
    }

    fn summed_bytes(&self) -> [u8; META_SUMMED] {
        let mut b = [0u8; META_SUMMED];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.root.to_le_bytes());
        b[24..32].copy_from_slice(&self.sequence.to_le_bytes());
        b[32..40].copy_from_slice(&self.freelist.to_le_bytes());
        b[40..48].copy_from_slice(&self.pgid.to_le_bytes());
        b[48..56].copy_from_slice(&self.txid.to_le_bytes());
        b
    }

    /// bbolt's `meta.sum64`: FNV-1a-64 over the fields before `checksum`.
    pub(crate) fn sum64(&self) -> u64 {
        let mut h = fnv::FnvHasher::default();
        h.write(&self.summed_bytes());
        h.finish()
    }

    pub(crate) fn write(&self, out: &mut [u8]) {
        out[..META_SUMMED].copy_from_slice(&self.summed_bytes());
        out[META_SUMMED..META_SIZE].copy_from_slice(&self.checksum.to_le_bytes());
    }

    pub(crate) fn read(b: &[u8]) -> Meta {
        Meta {
            magic: u32_at(b, 0),
            version: u32_at(b, 4),
            page_size: u32_at(b, 8),
            flags: u32_at(b, 12),
            root: u64_at(b, 16),
            sequence: u64_at(b, 24),
            freelist: u64_at(b, 32),
            pgid: u64_at(b, 40),
            txid: u64_at(b, 48),
            checksum: u64_at(b, 56),
        }
    }
}

/// Encodes a bucket header (the value of a bucket's entry in its parent).
pub(crate) fn bucket_header(root: u64, sequence: u64) -> [u8; BUCKET_HEADER] {
    let mut b = [0u8; BUCKET_HEADER];
    b[0..8].copy_from_slice(&root.to_le_bytes());
    b[8..16].copy_from_slice(&sequence.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum is FNV-1a-64 (offset basis and prime applied by hand here) over the 56
    /// bytes before it; a file written by etcd itself is read back and checked in
    /// `tests/etcd_file.rs`.
    #[test]
    fn meta_checksum_is_fnv1a_over_the_first_56_bytes() {
        let m = Meta::new(4096, 3, 4, 0);
        let mut h = fnv::FnvHasher::default();
        h.write(&m.summed_bytes());
        assert_eq!(m.checksum, h.finish());
        let mut page = [0u8; META_SIZE];
        m.write(&mut page);
        assert_eq!(Meta::read(&page), m);
        assert_eq!(u32_at(&page, 0), MAGIC);
        // FNV-1a's offset basis and prime, applied by hand, give the same value.
        let mut manual: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in &page[..META_SUMMED] {
            manual ^= u64::from(*byte);
            manual = manual.wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(manual, m.checksum);
    }
}
