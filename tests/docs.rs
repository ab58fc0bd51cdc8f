//! The shell examples of docs/SEMANTICS.md and docs/STATS.md, run against a real mount: what the
//! documents promise is what the mount does. Each ```sh block runs on its own with `MNT` (a
//! default mount of `SRC`) and `SRC` set, and `prepfs` first on `PATH` for blocks that start a
//! mount of their own.

mod common;

use std::path::Path;
use std::process::Command;

use common::{TestMount, described};

/// The ```sh blocks of `doc`, each with the line it starts on.
fn sh_blocks(doc: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in doc.lines().enumerate() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some((n + 1, String::new())),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

fn run_examples(doc: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
    let text = std::fs::read_to_string(&path).expect("read the document");
    let blocks = sh_blocks(&text);
    assert!(!blocks.is_empty(), "{doc} has no sh examples");
    let mut t = TestMount::new();
    t.mount(&[]);
    let bin = Path::new(env!("CARGO_BIN_EXE_prepfs"))
        .parent()
        .expect("binary dir")
        .to_path_buf();
    let path_var = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (line, body) in blocks {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&body)
            .env("MNT", &t.mnt)
            .env("SRC", &t.src)
            .env("PATH", &path_var);
        let out = command.output().expect("run sh");
        assert!(
            out.status.success(),
            "{doc}:{line}: example failed:\n{body}\n{}",
            described(&command, &out)
        );
    }
    assert_eq!(t.unmount().map(|s| s.success()), Some(true));
}

#[test]
fn semantics_examples_hold_on_a_real_mount() {
    run_examples("docs/SEMANTICS.md");
}

#[test]
fn stats_examples_hold_on_a_real_mount() {
    run_examples("docs/STATS.md");
}
