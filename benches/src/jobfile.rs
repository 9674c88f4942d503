//! fio-style job files: several jobs in one run.
//!
//! ```ini
//! ; comments start with ; or #
//! [global]
//! dir=./bench-data
//! duration=5
//!
//! [append]
//! batch-size=64k
//! vs-fio
//!
//! [fetch-random]
//! job=fetch
//! pattern=rand
//! ```
//!
//! Each section but `[global]` is one job, run in file order. Its job is
//! `job=` or else the section's name. Keys are the job's long options
//! (`_` and `-` are the same, as in fio); a key without a value, or with
//! `1`/`true`, turns a flag on (`0`/`false` leaves it off). `[global]` keys
//! apply to every job that has the option (a job's own key wins); a global
//! key no job has is an error. Every section is checked before any job runs.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use clap::{CommandFactory, Parser};
use serde_json::{json, Value};

use crate::report::JobReport;
use crate::{fs_err, run_command, BenchError, Cli, OutputFormat};

/// One job's result, from the command line (`section: None`) or a job file.
pub struct Run {
    pub section: Option<String>,
    pub format: OutputFormat,
    pub report: Box<dyn JobReport>,
}

/// `key` or `key=value`, key normalised to the long option's spelling.
type Entry = (String, Option<String>);

#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub name: String,
    pub entries: Vec<Entry>,
}

/// Parses the ini text into the `[global]` entries and the job sections.
pub fn parse(text: &str) -> Result<(Vec<Entry>, Vec<Section>), String> {
    let mut global = Vec::new();
    let mut sections: Vec<Section> = Vec::new();
    let mut in_global = false;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            let name = name
                .strip_suffix(']')
                .ok_or_else(|| format!("line {}: unclosed section header", n + 1))?
                .trim();
            if name.is_empty() {
                return Err(format!("line {}: empty section name", n + 1));
            }
            in_global = name == "global";
            if !in_global {
                if sections.iter().any(|s| s.name == name) {
                    return Err(format!("line {}: section [{name}] appears twice", n + 1));
                }
                sections.push(Section {
                    name: name.to_owned(),
                    entries: Vec::new(),
                });
            }
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim().to_owned())),
            None => (line, None),
        };
        if key.is_empty() {
            return Err(format!("line {}: empty key", n + 1));
        }
        let key = key.replace('_', "-");
        let entries = if in_global {
            &mut global
        } else {
            match sections.last_mut() {
                Some(s) => &mut s.entries,
                None => return Err(format!("line {}: {key} is outside any section", n + 1)),
            }
        };
        // A later key replaces an earlier one.
        entries.retain(|(k, _)| *k != key);
        entries.push((key, value));
    }
    if sections.is_empty() {
        return Err("the job file has no job sections".into());
    }
    Ok((global, sections))
}

/// The long options of subcommand `job` and whether each takes a value;
/// `None` for an unknown job.
fn options_of(job: &str) -> Option<Vec<(String, bool)>> {
    let cmd = Cli::command();
    let sub = cmd.find_subcommand(job)?;
    Some(
        sub.get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                Some((long.to_owned(), a.get_action().takes_values()))
            })
            .collect(),
    )
}

/// The command line of one section's job, global keys merged in.
pub fn argv(global: &[Entry], section: &Section) -> Result<Vec<String>, String> {
    let job = section
        .entries
        .iter()
        .find(|(k, _)| k == "job")
        .map_or(section.name.as_str(), |(_, v)| v.as_deref().unwrap_or(""));
    let options = options_of(job).ok_or_else(|| {
        format!(
            "[{}]: unknown job {job:?} (give job=append|fetch|transfer|produce|consume)",
            section.name
        )
    })?;
    let mut entries: Vec<&Entry> = global
        .iter()
        .filter(|(k, _)| options.iter().any(|(o, _)| o == k))
        .filter(|(k, _)| !section.entries.iter().any(|(s, _)| s == k))
        .collect();
    entries.extend(section.entries.iter().filter(|(k, _)| k != "job"));
    let mut args = vec!["ringlog-bench".to_owned(), job.to_owned()];
    for (key, value) in entries {
        let takes_value = options
            .iter()
            .find(|(o, _)| o == key)
            .map(|(_, v)| *v)
            // Unknown keys are left for clap to reject with its message.
            .unwrap_or(value.is_some());
        match (takes_value, value.as_deref()) {
            (true, Some(v)) => args.push(format!("--{key}={v}")),
            (true, None) => {
                return Err(format!("[{}]: {key} needs a value", section.name));
            }
            (false, None | Some("1" | "true" | "yes" | "on")) => args.push(format!("--{key}")),
            (false, Some("0" | "false" | "no" | "off")) => {}
            (false, Some(v)) => {
                return Err(format!(
                    "[{}]: {key} is a flag, not {key}={v}",
                    section.name
                ))
            }
        }
    }
    Ok(args)
}

/// Checks every section, then runs the jobs in order.
pub fn run_file(path: &Path) -> Result<Vec<Run>, BenchError> {
    let text = fs::read_to_string(path).map_err(fs_err("read", path))?;
    let usage = |e: String| BenchError::Usage(format!("{}: {e}", path.display()));
    let (global, sections) = parse(&text).map_err(usage)?;
    for (key, _) in &global {
        let known = sections.iter().any(|s| {
            argv(&[], s).is_ok()
                && options_of(
                    s.entries
                        .iter()
                        .find(|(k, _)| k == "job")
                        .and_then(|(_, v)| v.as_deref())
                        .unwrap_or(&s.name),
                )
                .is_some_and(|o| o.iter().any(|(name, _)| name == key))
        });
        if !known {
            return Err(usage(format!(
                "[global] {key} is not an option of any job in the file"
            )));
        }
    }
    let mut commands = Vec::with_capacity(sections.len());
    for section in &sections {
        let args = argv(&global, section).map_err(usage)?;
        let cli = Cli::try_parse_from(&args)
            .map_err(|e| usage(format!("[{}]: {}", section.name, e.render())))?;
        let command = cli
            .command
            .ok_or_else(|| usage(format!("[{}]: no job", section.name)))?;
        commands.push((section.name.clone(), command));
    }
    let mut runs = Vec::with_capacity(commands.len());
    for (section, command) in commands {
        eprintln!("ringlog-bench: job [{section}]");
        let (format, report) = run_command(command)?;
        runs.push(Run {
            section: Some(section),
            format,
            report,
        });
    }
    Ok(runs)
}

/// Every run's text report, each under a `[section]` line.
pub fn text(runs: &[Run]) -> String {
    let mut out = String::new();
    for (i, run) in runs.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if let Some(s) = &run.section {
            let _ = writeln!(out, "[{s}]");
        }
        out.push_str(&run.report.text());
    }
    out
}

/// One fio-style document: `jobs` holds every run's jobs (each with its
/// `section`), `reports` each run's settings, notes and ratios.
pub fn json(runs: &[Run]) -> Value {
    let mut jobs = Vec::new();
    let mut reports = Vec::new();
    let mut fio_version = None;
    for run in runs {
        let mut v = run.report.json();
        let section = run.section.clone().unwrap_or_default();
        if let Some(Value::Array(js)) = v.get_mut("jobs").map(Value::take) {
            for mut j in js {
                j["section"] = Value::from(section.as_str());
                jobs.push(j);
            }
        }
        if let Some(obj) = v.as_object_mut() {
            obj.remove("jobs");
            // fio's own version wins over the harness's stand-in.
            match obj.remove("fio version") {
                Some(f)
                    if fio_version.is_none()
                        || f.as_str().is_some_and(|v| v.starts_with("fio-")) =>
                {
                    fio_version = Some(f);
                }
                _ => {}
            }
            obj.remove("ringlog-bench version");
            obj.insert("section".into(), Value::from(section));
        }
        reports.push(v);
    }
    let mut root = json!({
        "ringlog-bench version": env!("CARGO_PKG_VERSION"),
        "jobs": jobs,
        "reports": reports,
    });
    if let Some(f) = fio_version {
        root["fio version"] = f;
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
; two jobs
[global]
duration=1
batch_size=64k
size = 4m

[append]
segment-size=1m
vs-fio=0

[fetch-rand]
job=fetch
pattern=rand
read-size=128k
keep=false
";

    #[test]
    fn sections_become_command_lines() {
        let (global, sections) = parse(FILE).unwrap();
        assert_eq!(global.len(), 3);
        assert_eq!(sections.len(), 2);
        let a = argv(&global, &sections[0]).unwrap();
        assert_eq!(
            a,
            [
                "ringlog-bench",
                "append",
                "--duration=1",
                "--batch-size=64k",
                "--size=4m",
                "--segment-size=1m"
            ]
        );
        let f = argv(&global, &sections[1]).unwrap();
        assert_eq!(f[1], "fetch");
        assert!(f.contains(&"--pattern=rand".to_owned()), "{f:?}");
        assert!(!f.iter().any(|a| a.contains("keep") || a.contains("job")));
        for args in [a, f] {
            Cli::try_parse_from(&args).unwrap();
        }
    }

    #[test]
    fn bad_files_are_rejected() {
        assert!(parse("[global]\nduration=1\n").is_err());
        assert!(parse("duration=1\n[append]\n").is_err());
        assert!(parse("[append\n").is_err());
        assert!(parse("[a]\n[a]\n").is_err());
        let (g, s) = parse("[nosuchjob]\nx=1\n").unwrap();
        assert!(argv(&g, &s[0]).is_err());
        let (g, s) = parse("[append]\nvs-fio=maybe\n").unwrap();
        assert!(argv(&g, &s[0]).is_err());
    }
}
