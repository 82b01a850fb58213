//! Sealed blocks waiting to go in place: what a journalled device keeps in memory between a
//! write and the commit that copies it in place.
//!
//! Blocks stay in the buffers their write request was sealed into (a batch only indexes them), so
//! a sequential request is journalled and placed from the same bytes it was sealed in, without
//! a copy per block.

use std::collections::HashMap;
use std::sync::Arc;

use crate::journal::{Entry, JournalBlock};

/// The sealed blocks of one write request: consecutive blocks from `first`, their ciphertext
/// and their tags.
#[derive(Debug)]
pub(crate) struct Sealed {
    pub(crate) first: u64,
    pub(crate) block_size: usize,
    pub(crate) data: Vec<u8>,
    pub(crate) tags: Vec<u8>,
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
                data: b.data,
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

    /// Runs of consecutive blocks held consecutively by one request and not crossing a
    /// multiple of `split` (an area's first block), in block order: the first block and the
    /// run's ciphertext and tags.
    pub(crate) fn runs(&self, split: u64) -> Vec<(u64, &[u8], &[u8])> {
        let mut blocks: Vec<(u64, usize, usize)> =
            self.index.iter().map(|(&b, &(r, k))| (b, r, k)).collect();
        blocks.sort_unstable_by_key(|b| b.0);
        let mut out = Vec::new();
        let mut i = 0;
        while i < blocks.len() {
            let (first, r, k) = blocks[i];
            let mut n = 1;
            while let Some(&(b, r2, k2)) = blocks.get(i + n) {
                if b != first + n as u64 || r2 != r || k2 != k + n || b % split == 0 {
                    break;
                }
                n += 1;
            }
            let (data, tags) = self.requests[r].blocks(k, n);
            out.push((first, data, tags));
            i += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(first: u64, n: usize, byte: u8) -> Arc<Sealed> {
        Arc::new(Sealed {
            first,
            block_size: 8,
            data: (0..n * 8).map(|i| byte.wrapping_add(i as u8)).collect(),
            tags: vec![byte; n * 2],
        })
    }

    #[test]
    fn later_writes_win_and_runs_follow_the_requests() {
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
        let runs: Vec<(u64, usize)> = batch
            .runs(14)
            .iter()
            .map(|(first, data, _)| (*first, data.len() / 8))
            .collect();
        assert_eq!(runs, [(10, 2), (12, 2), (14, 2)]);
        let entries: Vec<u64> = batch.entries().iter().map(|e| e.0).collect();
        assert_eq!(entries, [10, 11, 12, 13, 14, 15]);
    }
}
