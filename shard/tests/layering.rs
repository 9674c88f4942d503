//! The crate's module layering, as code: every `crate::<module>` reference
//! in `shard/src` (in `use` lines and inline paths alike) must be one of the
//! edges declared in [`ALLOWED`], and the declared edges must form no cycle.
//! A new dependency between modules is a deliberate change to this table,
//! and one that closes a cycle (say net or controller reaching back into
//! shard, which they reach only through `handle::ShardHandle`) fails here.
//! Also checked: the shard's turn and the replica read no clock and make
//! no blocking filesystem call (that is the runtime layer's).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the crate and the modules it may use.
/// Pure modules (vsr) use none; the runtime (shard, server) sits on top.
const ALLOWED: &[(&str, &[&str])] = &[
    ("catalog", &[]),
    ("client", &[]),
    ("config", &[]),
    ("eventfd", &[]),
    ("oneshot", &[]),
    ("placement", &[]),
    ("meta", &["placement", "vsr"]),
    ("meta_hosted", &["meta"]),
    ("vsr", &[]),
    ("replica_io", &["vsr"]),
    ("sim", &["meta", "replica_io", "transfer", "vsr"]),
    ("transfer", &["vsr"]),
    ("peer_buf", &[]),
    ("ops", &["peer_buf", "vsr"]),
    ("reply_pool", &[]),
    ("mailbox", &["eventfd", "ops"]),
    ("metrics", &["mailbox", "ops"]),
    ("meta_io", &["catalog", "eventfd"]),
    (
        "partition",
        &[
            "client",
            "config",
            "meta",
            "meta_hosted",
            "ops",
            "peer_buf",
            "replica_io",
            "transfer",
            "trash",
            "vsr",
        ],
    ),
    (
        "peer_route",
        &[
            "catalog",
            "mailbox",
            "meta_hosted",
            "metrics",
            "net",
            "ops",
            "placement",
        ],
    ),
    ("trash", &[]),
    (
        "handle",
        &[
            "catalog",
            "config",
            "meta",
            "meta_hosted",
            "meta_io",
            "metrics",
            "oneshot",
            "ops",
            "reply_pool",
        ],
    ),
    (
        "net",
        &[
            "catalog",
            "config",
            "handle",
            "metrics",
            "oneshot",
            "ops",
            "peer_buf",
            "placement",
            "reply_pool",
        ],
    ),
    (
        "controller",
        &[
            "catalog",
            "handle",
            "meta",
            "meta_hosted",
            "meta_io",
            "ops",
            "placement",
            "vsr",
        ],
    ),
    (
        "shard",
        &[
            "catalog",
            "config",
            "controller",
            "eventfd",
            "handle",
            "mailbox",
            "meta",
            "meta_hosted",
            "meta_io",
            "metrics",
            "net",
            "oneshot",
            "ops",
            "partition",
            "peer_buf",
            "placement",
            "reply_pool",
            "transfer",
            "trash",
            "vsr",
        ],
    ),
    (
        "control",
        &[
            "catalog",
            // `partitions` asks each peer over the client protocol.
            "client",
            "config",
            "mailbox",
            "metrics",
            "net",
            "ops",
            "placement",
            "shard",
        ],
    ),
    (
        "server",
        &[
            "catalog",
            "config",
            "control",
            "mailbox",
            "meta_io",
            "metrics",
            "net",
            "peer_route",
            "reply_pool",
            "shard",
            "trash",
        ],
    ),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file under src belongs to (`net/conn.rs` ->
/// `net`, `shard.rs` -> `shard`); None for the crate root.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_string())
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The modules `code` names through `crate::`: `crate::a::b`, and each
/// first segment of a `crate::{a::x, b}` group. Comment lines are skipped
/// (a doc link is no dependency).
fn referenced(code: &str) -> BTreeSet<String> {
    let text: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        let preceded = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
        rest = &rest[i + "crate::".len()..];
        if preceded {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level entries of the group, up to its closing brace.
            let mut depth = 0usize;
            let mut at_entry = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_entry = true,
                    c if at_entry && (c.is_ascii_alphabetic() || c == '_') => {
                        out.insert(ident_at(&group[j..]).to_string());
                        at_entry = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident_at(rest);
            if !name.is_empty() {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// module -> modules it references, from the sources.
fn actual_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in files {
        let rel = path.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(rel) else {
            continue;
        };
        let code = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let used = edges.entry(module.clone()).or_default();
        used.extend(referenced(&code).into_iter().filter(|m| *m != module));
    }
    edges
}

fn allowed_edges() -> BTreeMap<String, BTreeSet<String>> {
    ALLOWED
        .iter()
        .map(|(m, deps)| (m.to_string(), deps.iter().map(|d| d.to_string()).collect()))
        .collect()
}

/// A cycle in `edges`, if there is one (depth-first search).
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn module_dependencies_follow_the_declared_layering() {
    let allowed = allowed_edges();
    let actual = actual_edges();
    let mut errors = Vec::new();
    for (module, used) in &actual {
        let Some(ok) = allowed.get(module) else {
            errors.push(format!(
                "module `{module}` (uses {used:?}) is not in ALLOWED: declare its layer"
            ));
            continue;
        };
        for dep in used.difference(ok) {
            errors.push(format!(
                "`{module}` uses `crate::{dep}`, not a declared edge"
            ));
        }
        // A declared edge nothing uses would let a later change add it
        // unnoticed: the table says exactly what is there.
        for dep in ok.difference(used) {
            errors.push(format!(
                "`{module}` -> `{dep}` is declared but unused: remove it"
            ));
        }
    }
    for module in allowed.keys().filter(|m| !actual.contains_key(*m)) {
        errors.push(format!("`{module}` is declared but has no source file"));
    }
    assert!(errors.is_empty(), "layering:\n  {}", errors.join("\n  "));
    assert_eq!(
        find_cycle(&allowed),
        None,
        "the declared layering has a cycle"
    );
}

/// The checker itself: it sees inline paths and brace groups, skips
/// comments, and finds a cycle.
#[test]
fn the_checker_sees_inline_paths_groups_and_cycles() {
    let code = "use crate::{a::X, b::{Y, Z}, c};\n\
                // crate::commented\n\
                /// [`crate::doc`]\n\
                fn f() { crate::d::run(); ringlog_crate::e(); }\n";
    let got: Vec<String> = referenced(code).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "d"]);
    let mut edges = allowed_edges();
    edges
        .get_mut("net")
        .expect("net declared")
        .insert("shard".into());
    let cycle = find_cycle(&edges).expect("net -> shard -> net is a cycle");
    assert!(cycle.contains(&"net".to_string()) && cycle.contains(&"shard".to_string()));
}

/// What the runtime layer alone may touch: clocks, threads, the monoio
/// runtime, blocking filesystem calls.
const RUNTIME_ONLY: &[&str] = &[
    "Instant::now",
    "SystemTime",
    ".elapsed()",
    "now_ms()",
    "std::fs",
    "std::thread",
    "monoio::",
];

/// The runtime tokens `code` holds, with `std::{fs, thread, ..}` groups
/// spelt out. Textual: an alias (`use std::time::Instant as C`) hides a
/// clock from it; review still has to catch those.
fn runtime_uses(code: &str) -> Vec<&'static str> {
    let mut code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut spelt = String::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("std::{") {
        rest = &rest[i + "std::{".len()..];
        let group = &rest[..rest.find('}').unwrap_or(rest.len())];
        for entry in group.split(',') {
            spelt.push_str(&format!("\nstd::{}", entry.trim()));
        }
    }
    code.push_str(&spelt);
    RUNTIME_ONLY
        .iter()
        .copied()
        .filter(|t| code.contains(t))
        .collect()
}

#[test]
fn the_runtime_check_sees_std_groups() {
    assert_eq!(runtime_uses("use std::{fs, io};"), ["std::fs"]);
    assert_eq!(
        runtime_uses("use std::{io, thread::spawn};"),
        ["std::thread"]
    );
    assert_eq!(runtime_uses("// std::fs in a comment"), Vec::<&str>::new());
    assert_eq!(runtime_uses("let t = Instant::now();"), ["Instant::now"]);
}

/// The shard's turn (applying work, group commit and its completions)
/// gets the time as data from the runtime loops in shard.rs and does file
/// I/O only on the storage ring.
#[test]
fn the_shard_turn_reads_no_clock_and_blocks_on_no_filesystem() {
    let path = src_dir().join("shard/turn.rs");
    let code = std::fs::read_to_string(&path).expect("shard/turn.rs");
    for f in ["fn run_turn(", "fn apply(", "fn on_storage_completions("] {
        assert!(code.contains(f), "{f} is no longer in shard/turn.rs");
    }
    let used = runtime_uses(&code);
    assert!(used.is_empty(), "shard/turn.rs uses {used:?}");
}

/// The replica, the transfer machines, their storage executors and the
/// metadata table (meta) are pure: the runtime's tokens
/// appear in none of their files (tests included).
#[test]
fn the_replica_and_its_executor_use_no_runtime() {
    let src = src_dir();
    let mut files = vec![src.join("replica_io.rs")];
    rust_files(&src.join("vsr"), &mut files);
    rust_files(&src.join("replica_io"), &mut files);
    rust_files(&src.join("transfer"), &mut files);
    rust_files(&src.join("meta"), &mut files);
    for path in files {
        let code = std::fs::read_to_string(&path).expect("source");
        let used = runtime_uses(&code);
        assert!(used.is_empty(), "{} uses {used:?}", path.display());
    }
}

/// The shard thread touches files only through its storage ring: the
/// directories it needs (recycle root, trash) are made by the server before
/// it starts, and stale ones go through the trash.
#[test]
fn the_shard_thread_makes_no_blocking_filesystem_call() {
    let code = std::fs::read_to_string(src_dir().join("shard.rs")).expect("shard.rs");
    assert!(
        !runtime_uses(&code).contains(&"std::fs"),
        "shard.rs calls std::fs"
    );
}

/// The controller runs on shard 0's thread: its file work goes to the meta
/// I/O thread (`meta_io`), never through a blocking call of its own.
#[test]
fn the_controller_makes_no_blocking_filesystem_call() {
    let code = std::fs::read_to_string(src_dir().join("controller.rs")).expect("controller.rs");
    for f in ["fn create(", "fn delete(", "meta_io().run("] {
        assert!(code.contains(f), "{f} is no longer in controller.rs");
    }
    let used = runtime_uses(&code);
    for banned in ["std::fs", "std::thread"] {
        assert!(!used.contains(&banned), "controller.rs uses {banned}");
    }
    for call in [".store(&", "sync_dir(", "remove_dir("] {
        assert!(!code.contains(call), "controller.rs calls {call}");
    }
}
