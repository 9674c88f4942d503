//! README.md stays true: its first lines are the title and the two
//! commands, every repository file it cites exists, and its quick start runs
//! as written against the real binary (issue 13 item 8).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_bounded, BIN};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bin/ has a parent")
        .to_path_buf()
}

fn readme() -> String {
    std::fs::read_to_string(repo_root().join("README.md")).expect("README.md")
}

/// Every file under `dir` (not target/ or .git/) by file name.
fn file_names(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "target" || name == ".git" {
            continue;
        }
        let path = e.path();
        if path.is_dir() {
            file_names(&path, out);
        } else {
            out.push(name);
        }
    }
}

/// Path-like words of the README that name repository files: with a `/`
/// and a first component that is a top-level directory of the repository,
/// or a bare `*.rs` / `*.md` / `*.toml` name.
fn cited_paths(text: &str, root: &Path) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut out = Vec::new();
    for word in text.split(|c: char| !path_char(c)) {
        let word = word.trim_end_matches('.');
        if word.is_empty() || word.starts_with("./") {
            continue;
        }
        let first = word.split('/').next().unwrap_or("");
        let top_dir = !first.is_empty() && first != "target" && root.join(first).is_dir();
        let bare_file = !word.contains('/')
            && [".rs", ".md", ".toml"]
                .iter()
                .any(|ext| word.ends_with(ext));
        if (word.contains('/') && top_dir) || bare_file {
            out.push(word.to_string());
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn readme_starts_with_the_title_then_the_two_commands() {
    let text = readme();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# ringlog", "the title comes first");
    let block: Vec<&str> = lines
        .iter()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .copied()
        .collect();
    assert_eq!(
        block.len(),
        2,
        "the first block is the two commands: {block:?}"
    );
    assert!(
        block[0].contains(" server"),
        "first: build and run a node: {block:?}"
    );
    assert!(block[1].starts_with("ci/test"), "{block:?}");
    let before_block = &lines[1..lines.iter().position(|l| l.starts_with("```")).unwrap()];
    assert!(
        before_block.iter().all(|l| l.trim().is_empty()),
        "{before_block:?}"
    );
}

#[test]
fn readme_cites_only_files_that_exist_and_names_both_modes() {
    let root = repo_root();
    let text = readme();
    let mut names = Vec::new();
    file_names(&root, &mut names);
    let cited = cited_paths(&text, &root);
    assert!(
        cited.len() > 10,
        "the extraction found too little: {cited:?}"
    );
    let missing: Vec<&String> = cited
        .iter()
        .filter(|p| {
            if p.contains('/') {
                !root.join(p.as_str()).exists()
            } else {
                !names.iter().any(|n| n == *p)
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "README.md cites missing files: {missing:?}"
    );
    // The intro says what runs: a single node by default, a cluster of
    // replicated partitions, and where the cluster is shown.
    let first_paragraphs: String = text
        .lines()
        .take(30)
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
        .replace('*', "");
    for said in [
        "single node",
        "cluster of nodes",
        "quorum",
        "\"Cluster\" below",
    ] {
        assert!(
            first_paragraphs.contains(said),
            "{said:?} not in {first_paragraphs}"
        );
    }
    assert!(
        text.contains("#### Cluster\n"),
        "the README shows the cluster"
    );
}

#[test]
fn readme_extraction_finds_paths_and_skips_the_rest() {
    let root = repo_root();
    let got = cited_paths(
        "see `shard/src/vsr/` and (`table_sim.rs`), ./target/x, data_dir/topics.json, nope/x.",
        &root,
    );
    assert_eq!(got, ["shard/src/vsr/", "table_sim.rs"]);
}

/// The quick start's shell block, run as written (with the built binary for
/// `./target/release/ringlog`; `cargo build` is what built this test).
#[test]
fn readme_quick_start_runs_as_written() {
    let text = readme();
    let start = text.find("## Quick start").expect("a Quick start section");
    let section = &text[start..];
    let body_start = section.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let body = &section[body_start..];
    let body = &body[..body.find("```").expect("closed block")];
    let mut script = String::from("set -eu\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    for line in body.lines() {
        if line.trim_start().starts_with("cargo build") {
            continue;
        }
        script.push_str(&line.replace("./target/release/ringlog", BIN));
        script.push('\n');
    }
    script.push_str("wait\n");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env_remove("RINGLOG_LISTEN")
        .env_remove("RINGLOG_DATA_DIR")
        .env_remove("RINGLOG_CONTROL_SOCKET")
        .env("XDG_RUNTIME_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(60));
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.success(),
        "script:\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("uptime"), "ctl status printed: {stdout}");
    assert!(
        stdout.contains("hello\nworld\n"),
        "consume printed: {stdout}"
    );
}
