//! io_uring backend (in progress).
