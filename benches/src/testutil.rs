//! Test helpers: job arguments from one command line, a data directory on
//! the repo's filesystem, text checks.

use std::path::PathBuf;

use clap::Parser;

use crate::{
    AppendArgs, Cli, Command, ConsumeArgs, FetchArgs, PartitionsArgs, ProduceArgs, TransferArgs,
};

/// The job of `ringlog-bench <line>` (split at white space).
pub fn cli(line: &str) -> Command {
    let argv = std::iter::once("ringlog-bench").chain(line.split_whitespace());
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Some(c), ..
        }) => c,
        other => panic!("{line}: {other:?}"),
    }
}

macro_rules! args_of {
    ($($name:ident: $variant:ident => $args:ty),* $(,)?) => {$(
        /// The arguments of `ringlog-bench <line>`, which must be this job.
        pub fn $name(line: &str) -> $args {
            match cli(line) {
                Command::$variant(a) => a,
                other => panic!("{line}: {other:?}"),
            }
        }
    )*};
}

args_of!(
    append: Append => AppendArgs,
    transfer: Transfer => TransferArgs,
    fetch: Fetch => FetchArgs,
    produce: Produce => ProduceArgs,
    consume: Consume => ConsumeArgs,
    partitions: Partitions => PartitionsArgs,
);

/// A temporary directory in the crate directory (on the repo's filesystem,
/// which supports O_DIRECT, as a tmpfs /tmp would not; and a short path for
/// the server's control socket), and `data` in it (not created).
pub fn data_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let dir = tmp.path().join("data");
    (tmp, dir)
}

/// Fails with the whole text unless it holds every one of `wants`.
pub fn assert_has(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
}
