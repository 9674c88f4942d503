//! `ringlog sim`: one seed replays to the same summary and trace hash.

use std::process::Command;

fn sim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringlog"))
        .arg("sim")
        .args(args)
        .output()
        .expect("runs ringlog");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// Guards against: a seed that does not replay (the printed trace hash of
/// two runs differs), or a summary without its seed and hash.
#[test]
fn same_seed_prints_same_summary_and_trace_hash() {
    let args = [
        "--seed",
        "7",
        "--replicas",
        "3",
        "--ticks",
        "200",
        "--no-faults",
    ];
    let (code, first, err) = sim(&args);
    assert_eq!(code, 0, "{err}");
    assert!(first.contains("seed 7 replicas 3 ticks 200"), "{first}");
    assert!(first.contains("trace hash "), "{first}");
    let (_, second, _) = sim(&args);
    assert_eq!(first, second);
    let (_, other, _) = sim(&[
        "--seed",
        "8",
        "--replicas",
        "3",
        "--ticks",
        "200",
        "--no-faults",
    ]);
    assert_ne!(first, other);
}

/// Guards against: a replica count the simulator does not model accepted.
#[test]
fn even_replica_count_is_refused() {
    let (code, _, err) = sim(&["--seed", "1", "--replicas", "4"]);
    assert_ne!(code, 0);
    assert!(err.contains("replicas must be 1, 3 or 5"), "{err}");
}
