//! The one shape of every job: a [`Job`] says its settings and notes, how
//! to run ours and the comparison run; [`run`] does the rest (setup and
//! teardown, the A/B repetitions, cleanup of the data directory) and builds
//! the generic [`Report`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::report::{Comparison, Measured, Rep, Report};
use crate::size::Bytes;
use crate::{fio, interrupt};
use crate::{fs_err, BenchError, FioLayout};

/// Which repetition is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepNo {
    /// 1-based.
    pub n: u32,
    pub of: u32,
}

impl RepNo {
    pub fn last(self) -> bool {
        self.n == self.of
    }
}

/// The header of a report: settings, fio's version, notes.
pub struct Header {
    pub settings: Vec<(&'static str, String)>,
    pub fio_version: Option<String>,
    pub notes: Vec<String>,
}

/// One benchmark job.
pub trait Job {
    type Ours: Measured;
    type Theirs: Measured;
    /// `ringlog-bench <NAME>`.
    const NAME: &'static str;
    /// Text labels of our run and theirs.
    const LABELS: [&'static str; 2];
    /// What the comparison run compares, when the job has one.
    const COMPARISON: Option<Comparison> = None;
    /// How long our run is planned to take, for the status line's ETA.
    fn planned(&self) -> Option<std::time::Duration> {
        None
    }
    /// Un-timed setup before the first rep (fill a store, start a server).
    fn start(&mut self) -> Result<(), BenchError> {
        Ok(())
    }
    fn ours(&mut self, rep: RepNo) -> Result<Self::Ours, BenchError>;
    /// The comparison run, after ours of the same rep (called only for a
    /// job with a [`Job::COMPARISON`], when asked for).
    fn theirs(&mut self, _rep: RepNo, _ours: &Self::Ours) -> Result<Self::Theirs, BenchError> {
        Err(BenchError::Usage(format!(
            "{} has no comparison run",
            Self::NAME
        )))
    }
    /// Undoes [`Job::start`], also after a failed start or rep.
    fn stop(&mut self) -> Result<(), BenchError> {
        Ok(())
    }
    /// Asked after the reps, so notes can tell about the setup.
    fn header(&self) -> Header;
}

/// Runs `job` `reps` times, with the comparison run when `compare` (and
/// the job has one), in `ws` (cleaned up whatever happens; the first error
/// wins), to its report.
pub fn run<J: Job>(
    mut job: J,
    ws: Workspace,
    reps: u32,
    compare: bool,
) -> Result<Report<J::Ours, J::Theirs>, BenchError> {
    let compare = compare && J::COMPARISON.is_some();
    let reps = job.start().and_then(|()| ab_reps(&mut job, reps, compare));
    let stopped = job.stop();
    let cleaned = ws.finish();
    let reps = reps?;
    stopped?;
    cleaned?;
    let h = job.header();
    Ok(Report {
        job: J::NAME,
        settings: h.settings,
        fio_version: h.fio_version,
        notes: h.notes,
        labels: J::LABELS,
        comparison: J::COMPARISON,
        reps,
    })
}

type JobRep<J> = Rep<<J as Job>::Ours, <J as Job>::Theirs>;

/// The repetitions: ours, theirs, ours, theirs, ... so that a drift of the
/// machine (page cache, device state) hits both sides alike.
fn ab_reps<J: Job>(job: &mut J, of: u32, compare: bool) -> Result<Vec<JobRep<J>>, BenchError> {
    let mut reps = Vec::with_capacity(of as usize);
    for n in 1..=of {
        let rep = RepNo { n, of };
        eprintln!("ringlog-bench: rep {n}/{of}: {}", J::LABELS[0]);
        let label = format!("{} rep {n}/{of}", J::LABELS[0]);
        let status = crate::status::Status::start(label, job.planned());
        let ours = job.ours(rep);
        drop(status);
        let ours = ours?;
        let theirs = if compare {
            eprintln!("ringlog-bench: rep {n}/{of}: {}", J::LABELS[1]);
            Some(job.theirs(rep, &ours)?)
        } else {
            None
        };
        reps.push(Rep { ours, theirs });
    }
    Ok(reps)
}

/// A job's data directory and what the job puts in it.
pub struct Workspace {
    dir: PathBuf,
    /// Whether this run created `dir` (then it removes it, once empty).
    created: bool,
    keep: bool,
    /// Files and directories removed at the end unless `keep`.
    paths: Vec<PathBuf>,
    /// Its registration for removal on Ctrl-C (none with `keep`).
    interrupt_id: Option<u64>,
}

impl Workspace {
    /// Refuses `paths` that exist (left by an earlier --keep run), then
    /// creates `dir`.
    pub fn create(dir: &Path, keep: bool, paths: Vec<PathBuf>) -> Result<Workspace, BenchError> {
        if let Some(p) = paths.iter().find(|p| p.exists()) {
            return Err(BenchError::Usage(format!(
                "{} already exists (left by an earlier --keep run?); remove it or pick another --dir",
                p.display()
            )));
        }
        let created = !dir.exists();
        fs::create_dir_all(dir).map_err(fs_err("create", dir))?;
        let interrupt_id = (!keep)
            .then(|| interrupt::register_workspace(paths.clone(), created.then(|| dir.to_owned())));
        Ok(Workspace {
            dir: dir.to_owned(),
            created,
            keep,
            paths,
            interrupt_id,
        })
    }

    /// Removes the paths and the directory if this run created it and it is
    /// empty now; nothing with --keep.
    pub fn finish(self) -> Result<(), BenchError> {
        if self.keep {
            return Ok(());
        }
        for p in &self.paths {
            remove_if_exists(p)?;
        }
        if self.created {
            match fs::remove_dir(&self.dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(fs_err("remove", &self.dir)(e));
                }
                _ => {}
            }
        }
        if let Some(id) = self.interrupt_id {
            interrupt::unregister_workspace(id);
        }
        Ok(())
    }
}

/// Removes a file or a directory tree; a missing one is fine.
pub fn remove_if_exists(path: &Path) -> Result<(), BenchError> {
    let removed = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(fs_err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// A file fio runs on, prepared before each fio run as its layout says.
pub struct FioFile {
    pub path: PathBuf,
    laid_out_bytes: u64,
}

impl FioFile {
    pub fn new(path: PathBuf) -> FioFile {
        FioFile {
            path,
            laid_out_bytes: 0,
        }
    }

    /// Prewritten: written once (un-timed) up to `need` bytes, so fio
    /// overwrites written blocks; Fresh: deleted, so fio writes new space.
    pub fn prepare(&mut self, layout: FioLayout, need: u64) -> Result<(), BenchError> {
        match layout {
            FioLayout::Prewritten if self.laid_out_bytes < need => {
                eprintln!(
                    "ringlog-bench: laying out {} of {} for fio (un-timed)",
                    Bytes(fio::layout_size_bytes(need)),
                    self.path.display()
                );
                self.laid_out_bytes = fio::layout(&self.path, need)?;
            }
            FioLayout::Prewritten => {}
            FioLayout::Fresh => {
                remove_if_exists(&self.path)?;
                self.laid_out_bytes = 0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_refuses_leftovers_and_removes_only_what_it_created() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = tmp.path().join("data");
        let store = dir.join("store");
        let ws = Workspace::create(&dir, false, vec![store.clone(), dir.join("f")]).unwrap();
        fs::create_dir_all(store.join("p0")).unwrap();
        fs::write(dir.join("f"), b"x").unwrap();
        ws.finish().unwrap();
        assert!(!dir.exists(), "created here, emptied, so removed");

        fs::create_dir_all(&store).unwrap();
        let err = Workspace::create(&dir, false, vec![store.clone()]).err();
        assert!(matches!(err, Some(BenchError::Usage(_))), "{err:?}");
        fs::remove_dir(&store).unwrap();
        fs::write(dir.join("other"), b"y").unwrap();
        let ws = Workspace::create(&dir, false, vec![store.clone()]).unwrap();
        fs::create_dir(&store).unwrap();
        ws.finish().unwrap();
        assert!(!store.exists() && dir.join("other").exists(), "not ours");
        let ws = Workspace::create(&dir, true, vec![store.clone()]).unwrap();
        fs::create_dir(&store).unwrap();
        ws.finish().unwrap();
        assert!(store.exists(), "--keep keeps");
    }
}
