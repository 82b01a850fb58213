//! Sealed blocks waiting to go in place: what a journalled device keeps in memory between a
//! write and the commit that copies it in place.
//!
//! Blocks stay in the buffers their write request was sealed into (a batch only indexes them), so
//! a sequential request is journalled and placed from the same bytes it was sealed in, without
//! a copy per block.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use sectorcrypt_storage::{uncached_start, UNCACHED_ALIGN};

use crate::journal::{Entry, JournalBlock};

/// The sealed blocks of one write request: consecutive blocks from `first`, their ciphertext
/// and their tags.
#[derive(Debug)]
pub(crate) struct Sealed {
    pub(crate) first: u64,
    pub(crate) block_size: usize,
    pub(crate) data: Aligned,
    pub(crate) tags: Vec<u8>,
}

/// Bytes that start on a page ([`UNCACHED_ALIGN`]) of a buffer of their own, so that they can be
/// written past the page cache ([`sectorcrypt_storage::Storage::write_uncached`]).
#[derive(Debug)]
pub(crate) struct Aligned {
    buffer: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    /// `bytes` where they are (aligned or not: a write of them goes through the page cache if not).
    pub(crate) fn unaligned(bytes: Vec<u8>) -> Aligned {
        Aligned {
            len: bytes.len(),
            at: 0,
            buffer: bytes,
        }
    }

    /// A copy of `src` in `buffer` (at least [`UNCACHED_ALIGN`] bytes longer), from its first page.
    fn copy_into(mut buffer: Vec<u8>, src: &[u8]) -> Aligned {
        let at = uncached_start(&buffer);
        let at = if at + src.len() <= buffer.len() {
            at
        } else {
            0
        };
        buffer[at..at + src.len()].copy_from_slice(src);
        Aligned {
            buffer,
            at,
            len: src.len(),
        }
    }
}

impl std::ops::Deref for Aligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buffer[self.at..self.at + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buffer[self.at..self.at + self.len]
    }
}

impl Sealed {
    fn tag_size(&self) -> usize {
        self.tags.len() / (self.data.len() / self.block_size)
    }

    /// Blocks `k..k + n` of the request: their ciphertext and tags.
    fn blocks(&self, k: usize, n: usize) -> (&[u8], &[u8]) {
        let (bs, ts) = (self.block_size, self.tag_size());
        (
            &self.data[k * bs..(k + n) * bs],
            &self.tags[k * ts..(k + n) * ts],
        )
    }
}

/// Buffers of requests in place, for later requests to be sealed in. A fresh buffer the size of
/// a large request is mapped and page-faulted in anew by the allocator for every write: that cost
/// a journalled server more than sealing the request.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    /// Their lengths, summed.
    bytes: usize,
}

/// The most buffers kept (each request takes the first that fits, searched from the newest).
const BUFFERS_KEPT: usize = 64;

impl Buffers {
    /// A copy of `src` on a page, in a kept buffer that fits it (no more than twice the size it
    /// needs) or a new one.
    pub(crate) fn copy_of(&self, src: &[u8]) -> Aligned {
        let need = src.len() + UNCACHED_ALIGN;
        let kept = {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            let fits = |b: &Vec<u8>| (need..=2 * need).contains(&b.len());
            free.buffers.iter().rposition(fits).map(|i| {
                let b = free.buffers.swap_remove(i);
                free.bytes -= b.len();
                b
            })
        };
        Aligned::copy_into(kept.unwrap_or_else(|| vec![0; need]), src)
    }

    /// Keep the buffers of `batch`'s requests that no other batch holds, while the kept ones
    /// come to at most `limit` bytes.
    pub(crate) fn recycle(&self, batch: Batch, limit: usize) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        for request in batch.requests {
            let Ok(sealed) = Arc::try_unwrap(request) else {
                continue;
            };
            let buffer = sealed.data.buffer;
            if free.buffers.len() < BUFFERS_KEPT && free.bytes + buffer.len() <= limit {
                free.bytes += buffer.len();
                free.buffers.push(buffer);
            }
        }
    }
}

/// Blocks written, each once: an index of every block's latest data into the requests that
/// hold it.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    requests: Vec<Arc<Sealed>>,
    /// Block -> (request, block within it).
    index: HashMap<u64, (usize, usize)>,
}

impl Batch {
    /// An empty batch with room for `blocks` blocks (the index is not grown and rehashed as the
    /// batch fills).
    pub(crate) fn with_capacity(blocks: usize) -> Batch {
        Batch {
            requests: Vec::new(),
            index: HashMap::with_capacity(blocks),
        }
    }

    /// The blocks a journal held, in its order (a later entry of a block wins).
    pub(crate) fn from_journal(blocks: Vec<JournalBlock>) -> Batch {
        let mut batch = Batch::default();
        for b in blocks {
            let sealed = Arc::new(Sealed {
                first: b.block,
                block_size: b.data.len(),
                data: Aligned::unaligned(b.data),
                tags: b.tag,
            });
            batch.put(&sealed, 0);
        }
        batch
    }

    /// Distinct blocks.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(crate) fn contains(&self, block: u64) -> bool {
        self.index.contains_key(&block)
    }

    /// The latest ciphertext and tag of `block`.
    pub(crate) fn get(&self, block: u64) -> Option<(&[u8], &[u8])> {
        let &(r, k) = self.index.get(&block)?;
        Some(self.requests[r].blocks(k, 1))
    }

    /// Queue block `k` of `request`, replacing an earlier write of that block.
    pub(crate) fn put(&mut self, request: &Arc<Sealed>, k: usize) {
        let r = match self.requests.last() {
            Some(last) if Arc::ptr_eq(last, request) => self.requests.len() - 1,
            _ => {
                self.requests.push(Arc::clone(request));
                self.requests.len() - 1
            }
        };
        self.index.insert(request.first + k as u64, (r, k));
    }

    /// Every block, in block order, as journal entries.
    pub(crate) fn entries(&self) -> Vec<Entry<'_>> {
        let mut out: Vec<Entry<'_>> = self
            .index
            .iter()
            .map(|(&block, &(r, k))| {
                let (data, tag) = self.requests[r].blocks(k, 1);
                (block, data, tag)
            })
            .collect();
        out.sort_unstable_by_key(|e| e.0);
        out
    }

    /// Runs of consecutive blocks not crossing a multiple of `split` (an area's first block), in
    /// block order: each one's data and tags are contiguous on the device, and are gathered here
    /// from the requests that hold them (a piece per stretch of one request).
    pub(crate) fn runs(&self, split: u64) -> Vec<Run<'_>> {
        let mut blocks: Vec<(u64, usize, usize)> =
            self.index.iter().map(|(&b, &(r, k))| (b, r, k)).collect();
        blocks.sort_unstable_by_key(|b| b.0);
        let mut out: Vec<Run<'_>> = Vec::new();
        let mut i = 0;
        while i < blocks.len() {
            let (first, r, k) = blocks[i];
            // The stretch of request `r` from its block `k`.
            let mut n = 1;
            while let Some(&(b, r2, k2)) = blocks.get(i + n) {
                if b != first + n as u64 || r2 != r || k2 != k + n || b % split == 0 {
                    break;
                }
                n += 1;
            }
            let (data, tags) = self.requests[r].blocks(k, n);
            match out.last_mut() {
                Some(run) if run.first + run.blocks == first && first % split != 0 => {
                    run.blocks += n as u64;
                    run.data.push(data);
                    run.tags.push(tags);
                }
                _ => out.push(Run {
                    first,
                    blocks: n as u64,
                    data: vec![data],
                    tags: vec![tags],
                }),
            }
            i += n;
        }
        out
    }
}

/// Consecutive blocks inside one area: their ciphertext and their tags, each in pieces.
#[derive(Debug)]
pub(crate) struct Run<'a> {
    pub(crate) first: u64,
    pub(crate) blocks: u64,
    pub(crate) data: Vec<&'a [u8]>,
    pub(crate) tags: Vec<&'a [u8]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(first: u64, n: usize, byte: u8) -> Arc<Sealed> {
        Arc::new(Sealed {
            first,
            block_size: 8,
            data: Aligned::unaligned((0..n * 8).map(|i| byte.wrapping_add(i as u8)).collect()),
            tags: vec![byte; n * 2],
        })
    }

    #[test]
    fn later_writes_win_and_runs_gather_the_requests() {
        let mut batch = Batch::default();
        let a = request(10, 6, 0);
        let b = request(12, 2, 100);
        for k in 0..6 {
            batch.put(&a, k);
        }
        for k in 0..2 {
            batch.put(&b, k);
        }
        assert_eq!(batch.len(), 6);
        assert_eq!(batch.get(12), Some((&b.data[..8], &b.tags[..2])));
        assert_eq!(batch.get(15), Some((&a.data[40..48], &a.tags[10..12])));
        assert_eq!(batch.get(16), None);
        // 10-11 from a, 12-13 from b, 14-15 from a; 14 starts an area.
        let runs = batch.runs(14);
        let shape: Vec<(u64, u64, Vec<usize>)> = runs
            .iter()
            .map(|r| {
                (
                    r.first,
                    r.blocks,
                    r.data.iter().map(|d| d.len() / 8).collect(),
                )
            })
            .collect();
        assert_eq!(shape, [(10, 4, vec![2, 2]), (14, 2, vec![2])]);
        assert_eq!(runs[0].data, [&a.data[..16], &b.data[..16]]);
        assert_eq!(runs[0].tags, [&a.tags[..4], &b.tags[..4]]);
        assert_eq!(runs[1].data, [&a.data[32..48]]);
        // A gap ends a run.
        let mut gap = Batch::default();
        gap.put(&a, 0);
        gap.put(&a, 2);
        let firsts: Vec<(u64, u64)> = gap.runs(100).iter().map(|r| (r.first, r.blocks)).collect();
        assert_eq!(firsts, [(10, 1), (12, 1)]);
        let entries: Vec<u64> = batch.entries().iter().map(|e| e.0).collect();
        assert_eq!(entries, [10, 11, 12, 13, 14, 15]);
    }

    #[test]
    fn placed_buffers_take_later_requests_of_their_size() {
        let buffers = Buffers::default();
        let sealed = |first: u64, data: Aligned| {
            Arc::new(Sealed {
                first,
                block_size: 4096,
                tags: vec![0; data.len() / 4096],
                data,
            })
        };
        let (a, b) = (buffers.copy_of(&[1; 4096]), buffers.copy_of(&[2; 4 * 4096]));
        assert_eq!(&a[..], &[1; 4096][..]);
        assert!(
            (a.as_ptr() as usize).is_multiple_of(UNCACHED_ALIGN),
            "on a page"
        );
        let (a_at, b_at) = (a.as_ptr(), b.as_ptr());
        let (a, b, held) = (
            sealed(0, a),
            sealed(1, b),
            sealed(5, buffers.copy_of(&[3; 4096])),
        );
        let mut batch = Batch::default();
        for (r, n) in [(&a, 1), (&b, 4), (&held, 1)] {
            for k in 0..n {
                batch.put(r, k);
            }
        }
        drop((a, b));
        buffers.recycle(batch, 1 << 20);
        // Still held elsewhere (by another batch): not kept.
        assert_eq!(buffers.free.lock().unwrap().buffers.len(), 2);
        // Too big for a's buffer, too small to take b's (more than twice what it needs).
        let other = buffers.copy_of(&[7; 5000]);
        assert!(other.as_ptr() != a_at && other.as_ptr() != b_at);
        let again = buffers.copy_of(&[9; 3 * 4096]);
        assert_eq!((again.as_ptr(), &again[..]), (b_at, &[9u8; 3 * 4096][..]));
        let small = buffers.copy_of(&[5; 4000]);
        assert_eq!((small.as_ptr(), &small[..]), (a_at, &[5u8; 4000][..]));
        assert_eq!(buffers.free.lock().unwrap().bytes, 0);
        // Past the limit: not kept.
        let mut batch = Batch::default();
        let big = sealed(0, buffers.copy_of(&[4; 4096]));
        batch.put(&big, 0);
        drop(big);
        buffers.recycle(batch, 4096);
        assert!(buffers.free.lock().unwrap().buffers.is_empty());
        drop(held);
    }
}
