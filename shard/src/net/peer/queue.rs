//! The bounded send queue of one peer: encoded frames waiting for the
//! connector to write them. Bounded by frames and by bytes; a frame that
//! does not fit is dropped and counted (replication retransmits what is not
//! acknowledged, so a drop costs a retry, never data).

use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) struct SendQueue {
    frames: VecDeque<Vec<u8>>,
    queued_bytes: usize,
    frames_max: usize,
    bytes_max: usize,
}

/// Why a frame was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QueueFull {
    Frames { max: usize },
    Bytes { max: usize },
}

impl SendQueue {
    pub(crate) fn new(frames_max: usize, bytes_max: usize) -> SendQueue {
        assert!(
            frames_max > 0 && bytes_max > 0,
            "queue bounds must be positive"
        );
        SendQueue {
            frames: VecDeque::new(),
            queued_bytes: 0,
            frames_max,
            bytes_max,
        }
    }

    /// Queues an encoded frame if it fits both bounds.
    pub(crate) fn push(&mut self, frame: Vec<u8>) -> Result<(), QueueFull> {
        if self.frames.len() >= self.frames_max {
            return Err(QueueFull::Frames {
                max: self.frames_max,
            });
        }
        if self.queued_bytes + frame.len() > self.bytes_max {
            return Err(QueueFull::Bytes {
                max: self.bytes_max,
            });
        }
        self.queued_bytes += frame.len();
        self.frames.push_back(frame);
        Ok(())
    }

    /// The first frame, if it is at least `bytes_min` long: written as it
    /// is rather than copied into a batch.
    pub(crate) fn pop_whole(&mut self, bytes_min: usize) -> Option<Vec<u8>> {
        if self.frames.front()?.len() < bytes_min {
            return None;
        }
        let frame = self.frames.pop_front()?;
        self.queued_bytes -= frame.len();
        debug_assert!(self.frames.is_empty() == (self.queued_bytes == 0));
        Some(frame)
    }

    /// Moves whole frames into `out` while it stays within `batch_bytes`
    /// (always at least one frame if any is queued; none of at least
    /// `batch_bytes` after the first: [`SendQueue::pop_whole`] takes
    /// those); returns how many.
    pub(crate) fn drain_into(&mut self, out: &mut Vec<u8>, batch_bytes: usize) -> u64 {
        let mut n = 0;
        while let Some(front) = self.frames.front() {
            if n > 0 && (out.len() + front.len() > batch_bytes || front.len() >= batch_bytes) {
                break;
            }
            let Some(frame) = self.frames.pop_front() else {
                break;
            };
            self.queued_bytes -= frame.len();
            out.extend_from_slice(&frame);
            n += 1;
        }
        debug_assert!(self.frames.is_empty() == (self.queued_bytes == 0));
        n
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.frames.len()
    }

    #[cfg(test)]
    fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_bounds_drop_and_draining_frees_room() {
        let mut q = SendQueue::new(3, 250);
        q.push(vec![1; 100]).unwrap();
        q.push(vec![2; 100]).unwrap();
        assert_eq!(q.push(vec![3; 51]), Err(QueueFull::Bytes { max: 250 }));
        q.push(vec![4; 50]).unwrap();
        assert_eq!(q.push(vec![5; 1]), Err(QueueFull::Frames { max: 3 }));
        assert_eq!((q.len(), q.queued_bytes()), (3, 250));
        let mut out = Vec::new();
        // Whole frames only: 100 + 100 > 150, so one frame.
        assert_eq!(q.drain_into(&mut out, 150), 1);
        assert_eq!(out, vec![1; 100]);
        q.push(vec![6; 100]).unwrap();
        out.clear();
        assert_eq!(
            q.drain_into(&mut out, 10),
            1,
            "a frame larger than the batch still goes"
        );
        assert_eq!(q.drain_into(&mut out, 1 << 20), 2);
        assert_eq!((q.len(), q.queued_bytes()), (0, 0));
        assert_eq!(out.len(), 250);
    }

    /// A frame of a batch's size is popped whole (moved, not copied), and a
    /// batch of small frames stops before one.
    #[test]
    fn a_large_frame_is_popped_whole_and_ends_a_batch() {
        let mut q = SendQueue::new(8, 1000);
        q.push(vec![1; 10]).unwrap();
        q.push(vec![2; 100]).unwrap();
        q.push(vec![3; 10]).unwrap();
        assert_eq!(q.pop_whole(100), None, "the first frame is small");
        let mut out = Vec::new();
        assert_eq!(q.drain_into(&mut out, 100), 1, "stops before the large one");
        assert_eq!(out, vec![1; 10]);
        let big = q.pop_whole(100).expect("the large frame");
        assert_eq!(big, vec![2; 100]);
        assert_eq!((q.len(), q.queued_bytes()), (1, 10));
        assert_eq!(q.pop_whole(100), None);
        assert_eq!(SendQueue::new(1, 1).pop_whole(0), None, "nothing queued");
    }
}
