//! A status line during a run, as fio prints one: elapsed time, bytes and
//! throughput so far, and the ETA when the run's length is known. On
//! stderr, rewritten in place on a tty; elsewhere only with --status (one
//! line a second). Never in the report.

use std::io::{IsTerminal as _, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::size::Secs;

/// Bytes completed by the running job (every job's Timeline adds to it).
pub static PROGRESS_BYTES: AtomicU64 = AtomicU64::new(0);

/// --status: print the line also when stderr is not a tty.
pub static FORCED: AtomicBool = AtomicBool::new(false);

const INTERVAL: Duration = Duration::from_secs(1);

/// The line for `label` after `elapsed`, `bytes` done, of a run planned to
/// last `planned`.
pub fn line(label: &str, elapsed: Duration, bytes: u64, planned: Option<Duration>) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    let secs = elapsed.as_secs_f64().max(1e-9);
    let eta = planned.map_or(String::new(), |p| {
        let left = p.saturating_sub(elapsed).as_secs_f64().ceil() as u64;
        format!(", eta {}", Secs(Duration::from_secs(left)))
    });
    format!(
        "ringlog-bench: [{label}] {:.1}s elapsed, {mib:.1} MiB, {:.1} MiB/s{eta}",
        elapsed.as_secs_f64(),
        mib / secs
    )
}

/// The status printer of one run; stops (and clears a tty line) on drop.
pub struct Status {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Status {
    /// Starts printing to stderr if it is a tty or --status was given.
    pub fn start(label: String, planned: Option<Duration>) -> Option<Status> {
        let tty = std::io::stderr().is_terminal();
        (tty || FORCED.load(Ordering::Relaxed)).then(|| {
            let out = Box::new(std::io::stderr());
            Status::to(out, tty, &PROGRESS_BYTES, label, planned)
        })
    }

    /// Prints to `out`, in place (`\r`) when `tty`, else a line each time,
    /// the bytes `progress` counts (tests give their own counter: the
    /// global one is fed by every job running in the process).
    pub fn to(
        mut out: Box<dyn Write + Send>,
        tty: bool,
        progress: &'static AtomicU64,
        label: String,
        planned: Option<Duration>,
    ) -> Status {
        progress.store(0, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let started = Instant::now();
        let thread = std::thread::spawn(move || {
            let mut next = started + INTERVAL;
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                if Instant::now() < next {
                    continue;
                }
                next += INTERVAL;
                let bytes = progress.load(Ordering::Relaxed);
                let l = line(&label, started.elapsed(), bytes, planned);
                let _ = match tty {
                    true => write!(out, "\r\x1b[K{l}"),
                    false => writeln!(out, "{l}"),
                };
                let _ = out.flush();
            }
            if tty {
                let _ = write!(out, "\r\x1b[K");
            }
        });
        Status {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn line_has_elapsed_throughput_and_eta() {
        let l = line(
            "ringlog append rep 1/2",
            Duration::from_secs(4),
            512 << 20,
            Some(Duration::from_secs(10)),
        );
        assert_eq!(
            l,
            "ringlog-bench: [ringlog append rep 1/2] 4.0s elapsed, 512.0 MiB, 128.0 MiB/s, eta 6s"
        );
        let l = line(
            "a",
            Duration::from_millis(1010),
            0,
            Some(Duration::from_secs(3)),
        );
        assert!(l.ends_with("eta 2s"), "rounded up: {l}");
        let l = line("consume", Duration::from_millis(500), 0, None);
        assert!(l.ends_with("0.0 MiB/s"), "{l}");
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn prints_progress_each_second_until_dropped() {
        static PROGRESS: AtomicU64 = AtomicU64::new(0);
        let buf = Arc::new(Mutex::new(Vec::new()));
        let status = Status::to(
            Box::new(Sink(buf.clone())),
            false,
            &PROGRESS,
            "x".into(),
            None,
        );
        PROGRESS.fetch_add(3 << 20, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1300));
        drop(status);
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        // The line is printed once a second has passed; on a loaded machine
        // a little later.
        let elapsed: f64 = text
            .strip_prefix("ringlog-bench: [x] ")
            .and_then(|t| t.split_once("s elapsed, 3.0 MiB, "))
            .and_then(|(secs, _)| secs.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert!((1.0..1.3).contains(&elapsed), "{text}");
        let n = text.len();
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(buf.lock().unwrap().len(), n, "stopped when dropped");
    }
}
