//! The LRU queue of free blocks: an intrusive doubly linked list over block
//! ids, so a cached block can leave the queue from the middle in O(1) when a
//! prefix hit touches it again.
//!
//! Allocation takes the head (least recently freed); freed blocks join the
//! tail, like vLLM's `FreeKVCacheBlockQueue`.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct FreeList {
    prev: Vec<u32>,
    next: Vec<u32>,
    queued: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

// === impl FreeList ===

impl FreeList {
    /// A list holding every block `0..n`, in id order.
    pub(crate) fn full(n: u32) -> Self {
        let mut list = Self {
            prev: vec![NIL; n as usize],
            next: vec![NIL; n as usize],
            queued: vec![false; n as usize],
            head: NIL,
            tail: NIL,
            len: 0,
        };
        for id in 0..n {
            list.push_back(id);
        }
        list
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.queued[id as usize]
    }

    pub(crate) fn push_back(&mut self, id: u32) {
        debug_assert!(!self.queued[id as usize]);
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.queued[i] = true;
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.remove(id);
        Some(id)
    }

    /// Takes `id` out of the queue; a no-op when it is not queued.
    pub(crate) fn remove(&mut self, id: u32) {
        let i = id as usize;
        if !self.queued[i] {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.queued[i] = false;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(list: &mut FreeList) -> Vec<u32> {
        std::iter::from_fn(|| list.pop_front()).collect()
    }

    #[test]
    fn fifo_order_and_middle_removal() {
        let mut list = FreeList::full(5);
        assert_eq!(list.len(), 5);
        list.remove(2);
        list.remove(0);
        list.remove(4);
        list.remove(4);
        assert_eq!(list.len(), 2);
        list.push_back(0);
        list.push_back(4);
        assert!(list.contains(4) && !list.contains(2));
        assert_eq!(drain(&mut list), vec![1, 3, 0, 4]);
        assert_eq!(list.len(), 0);
        assert_eq!(list.pop_front(), None);
        list.push_back(2);
        assert_eq!(drain(&mut list), vec![2]);
    }
}
