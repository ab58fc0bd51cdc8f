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

/// The text of `doc`, a path from the repository root.
fn read_doc(doc: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc))
        .unwrap_or_else(|e| panic!("read {doc}: {e}"))
}

/// The names of Cargo.toml's `[[bench]]` targets and of its features.
fn bench_targets_and_features() -> (Vec<String>, Vec<String>) {
    let manifest: toml::Table = read_doc("Cargo.toml").parse().expect("Cargo.toml parses");
    let benches = manifest["bench"]
        .as_array()
        .expect("[[bench]] targets")
        .iter()
        .filter_map(|b| b["name"].as_str().map(str::to_owned))
        .collect();
    let features = manifest["features"]
        .as_table()
        .expect("[features]")
        .keys()
        .cloned()
        .collect();
    (benches, features)
}

#[test]
fn every_headline_benchmark_names_its_date_commit_and_a_command_that_exists() {
    let text = read_doc("BENCHMARKS.md");
    let first_row = text
        .lines()
        .position(|l| l.starts_with('|'))
        .expect("a table");
    assert!(first_row < 15, "the headline table starts the first screen");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(first_row)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let column = |name: &str| {
        rows[0]
            .iter()
            .position(|c| *c == name)
            .unwrap_or_else(|| panic!("no {name} column in {:?}", rows[0]))
    };
    let (date, commit, command) = (column("date"), column("commit"), column("command"));
    let (benches, features) = bench_targets_and_features();
    assert!(rows.len() > 7, "a row per headline result");
    for row in &rows[2..] {
        let is_date = |d: &str| {
            d.len() == 10
                && d.split('-').map(str::len).eq([4, 2, 2])
                && d.replace('-', "").bytes().all(|b| b.is_ascii_digit())
        };
        assert!(is_date(row[date]), "date of {row:?}");
        assert!(
            row[commit].len() >= 7 && row[commit].bytes().all(|b| b.is_ascii_hexdigit()),
            "commit of {row:?}"
        );
        let cmd = row[command].trim_matches('`');
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let after = |flag: &str| {
            words
                .iter()
                .position(|w| *w == flag)
                .and_then(|i| words.get(i + 1))
        };
        if !cmd.contains("cargo bench ") {
            // A harness that is not a cargo bench (the GPU checks run where no Rust is): a
            // script of the repository, after its VAR=value settings.
            let script = words
                .iter()
                .find(|w| !w.contains('='))
                .unwrap_or_else(|| panic!("no command in {row:?}"));
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
            assert!(
                script.starts_with("benches/") && path.is_file(),
                "neither a cargo bench nor a script of benches/: {cmd}"
            );
            continue;
        }
        let bench = after("--bench").unwrap_or_else(|| panic!("no --bench in {cmd}"));
        assert!(
            benches.iter().any(|b| b == bench),
            "no bench target {bench}: {cmd}"
        );
        if let Some(feature) = after("--features") {
            assert!(
                features.iter().any(|f| f == feature),
                "no feature {feature}: {cmd}"
            );
        }
    }
}

#[test]
fn links_in_the_readme_and_docs_lead_to_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec!["README.md".to_owned(), "BENCHMARKS.md".to_owned()];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let name = entry.expect("entry").file_name();
        docs.push(format!("docs/{}", name.to_string_lossy()));
    }
    for doc in docs {
        let text = read_doc(&doc);
        let dir = root.join(&doc).parent().expect("dir").to_owned();
        for (start, _) in text.match_indices("](") {
            let rest = &text[start + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = rest[..end].split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") {
                continue;
            }
            assert!(dir.join(target).exists(), "{doc}: link to missing {target}");
        }
    }
}

#[test]
fn the_readme_starts_a_user_in_one_screen() {
    let text = read_doc("README.md");
    let first_docs_link = text
        .lines()
        .position(|l| l.contains("](docs/"))
        .expect("the README links to docs/");
    assert!(first_docs_link <= 45, "line {first_docs_link}");
    assert!(text.contains("./demo.sh") && text.contains("./test.sh"));
}

/// Runs the README's `./demo.sh` as `nobody` from a copy (with its scripts/), with `PATH` holding
/// only links to `tools` and a `cargo` that prints its arguments.
fn demo_sh_as_nobody(tools: &[&str]) -> std::process::Output {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Not the checkout itself: it may sit where nobody cannot reach (a mode-0700 directory).
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (copy, bin) = (dir.path().join("checkout"), dir.path().join("bin"));
    std::fs::create_dir_all(copy.join("scripts")).expect("mkdir");
    std::fs::create_dir(&bin).expect("mkdir");
    for file in ["demo.sh", "scripts/system-packages.sh"] {
        std::fs::copy(root.join(file), copy.join(file)).expect("copy");
    }
    for tool in ["bash", "dirname", "id", "apt-get"].iter().chain(tools) {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .expect("sh");
        let path = String::from_utf8_lossy(&found.stdout).trim().to_owned();
        assert!(
            !path.is_empty(),
            "{tool} is installed (test.sh installs it)"
        );
        symlink(path, bin.join(tool)).expect("link");
    }
    std::fs::write(bin.join("cargo"), "#!/bin/sh\necho \"cargo $*\"\n").expect("write");
    std::fs::set_permissions(bin.join("cargo"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let mut command = Command::new("/usr/bin/setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin.join("bash"))
        .arg(copy.join("demo.sh"))
        .args(["--files", "10"])
        .env_clear()
        .env("PATH", &bin);
    command.output().expect("run demo.sh")
}

#[test]
fn demo_sh_names_a_missing_build_tool_and_its_install_command_before_any_build() {
    let out = demo_sh_as_nobody(&["cc", "make", "nasm", "fusermount3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "demo.sh: missing cmake; install with: sudo apt-get install cmake\n"
    );
    assert!(out.stdout.is_empty(), "cargo never ran");
    let out = demo_sh_as_nobody(&["cc", "make", "nasm", "cmake", "fusermount3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "cargo run --release --locked -- demo --files 10\n"
    );
}
