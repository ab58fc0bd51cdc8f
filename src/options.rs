//! Mount options given as `-o` lists and TOML config files, as the command-line flags they mean.
//!
//! Owns: the spelling rule that makes one option of `--cache-mem 8G` on the command line,
//! `-o cache_mem=8G` (as mount(8), fstab and the FUSE mount helper pass options) and
//! `cache_mem = "8G"` in a `--config` file; the generic mount(8) options a helper passes along,
//! which prepfs accepts and ignores because its mounts are always read-only, nosuid and nodev;
//! and reading the config file. Must never decide what an option means: the flags it produces go
//! through the same parser and checks as typed ones.

use std::ffi::OsString;
use std::path::Path;

/// Generic mount(8) options passed along by mount helpers and fstab: accepted and ignored, since
/// a prepfs mount is always `ro,nosuid,nodev,noatime` (`rw` included: the mount is read-only
/// whatever it asks).
const GENERIC: &[&str] = &[
    "rw",
    "ro",
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "diratime",
    "nodiratime",
    "async",
    "sync",
    "nofail",
    "_netdev",
];
/// Prefixes of options meant for other programs (systemd's `x-systemd.*`, `comment=`).
const FOREIGN_PREFIXES: &[&str] = &["x-", "comment="];
/// Longest config file read (a config is a few hundred bytes).
const MAX_CONFIG: u64 = 1 << 20;

/// One option: its long flag name (dashes, no leading `--`) and value, if it takes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    /// `cache-mem` for `--cache-mem`.
    pub name: String,
    /// `Some("8G")`; `None` for a switch such as `--allow-other`.
    pub value: Option<String>,
}

impl Flag {
    fn new(key: &str, value: Option<String>) -> Flag {
        Flag {
            name: key.trim().replace('_', "-"),
            value,
        }
    }

    /// The command-line words of this flag: `--cache-mem=8G`, or `--allow-other`.
    pub fn words(&self) -> String {
        match &self.value {
            Some(v) => format!("--{}={v}", self.name),
            None => format!("--{}", self.name),
        }
    }
}

/// The flags of one `-o` list: comma-separated `key=value` or `key`, generic mount options
/// skipped. A `config=FILE` item is returned as the flag `config`.
pub fn from_list(list: &str) -> Vec<Flag> {
    list.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .filter(|item| !GENERIC.contains(item))
        .filter(|item| !FOREIGN_PREFIXES.iter().any(|p| item.starts_with(p)))
        .map(|item| match item.split_once('=') {
            Some((key, value)) => Flag::new(key, Some(value.to_owned())),
            None => Flag::new(item, None),
        })
        .collect()
}

/// The flags of a TOML config file: top-level `key = value` pairs; a string, integer or float
/// is the flag's value, `true` a switch (`false` leaves it out), an array of strings the flag
/// repeated (`view = ["a=decode", "b=decode"]`).
pub fn from_file(path: &Path) -> Result<Vec<Flag>, String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_CONFIG), &mut text)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("{shown}: {}", e.message()))?;
    let mut flags = Vec::new();
    for (key, value) in table {
        let bad = |what: &str| format!("{shown}: {key}: {what}");
        match value {
            toml::Value::String(s) => flags.push(Flag::new(&key, Some(s))),
            toml::Value::Integer(i) => flags.push(Flag::new(&key, Some(i.to_string()))),
            toml::Value::Float(f) => flags.push(Flag::new(&key, Some(f.to_string()))),
            toml::Value::Boolean(true) => flags.push(Flag::new(&key, None)),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for item in items {
                    match item {
                        toml::Value::String(s) => flags.push(Flag::new(&key, Some(s))),
                        _ => return Err(bad("a list may hold only strings")),
                    }
                }
            }
            _ => return Err(bad("expected a string, number, boolean or list of strings")),
        }
    }
    Ok(flags)
}

/// The words of a `mount` command line after `mount` with every `-o` list and `--config` file
/// spelled out as the flags they mean: the files' flags first, so that the command line
/// overrides them. An option whose name is not in `known` (long flag names) fails here, saying
/// where it came from.
pub fn spell_out(
    words: impl IntoIterator<Item = OsString>,
    known: &[&str],
) -> Result<Vec<OsString>, String> {
    let check = |flag: &Flag, origin: &str| {
        if flag.name == "config" || flag.name == "o" || !known.contains(&flag.name.as_str()) {
            Err(format!("unknown mount option '{}' in {origin}", flag.name))
        } else {
            Ok(OsString::from(flag.words()))
        }
    };
    let (mut from_files, mut typed) = (Vec::new(), Vec::new());
    let config = |path: &str, from_files: &mut Vec<OsString>| -> Result<(), String> {
        for flag in from_file(Path::new(path))? {
            from_files.push(check(&flag, path)?);
        }
        Ok(())
    };
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let text = word.to_str().unwrap_or("");
        let mut value = |flag: &str| {
            words
                .next()
                .and_then(|v| v.into_string().ok())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let list = match text {
            "-o" => value("-o")?,
            _ if text.starts_with("-o") => text[2..].to_owned(),
            "--config" => {
                let path = value("--config")?;
                config(&path, &mut from_files)?;
                continue;
            }
            _ if text.starts_with("--config=") => {
                config(&text["--config=".len()..], &mut from_files)?;
                continue;
            }
            _ => {
                typed.push(word);
                continue;
            }
        };
        for flag in from_list(&list) {
            match (flag.name.as_str(), &flag.value) {
                ("config", Some(path)) => config(path, &mut from_files)?,
                _ => typed.push(check(&flag, "-o")?),
            }
        }
    }
    Ok(from_files.into_iter().chain(typed).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(flags: &[Flag]) -> Vec<String> {
        flags.iter().map(Flag::words).collect()
    }

    #[test]
    fn an_o_list_spells_options_like_the_command_line_and_skips_generic_ones() {
        let flags =
            from_list("rw,nosuid,cache_mem=8G,allow_other,x-systemd.automount,,codec=zstd-3");
        assert_eq!(
            words(&flags),
            ["--cache-mem=8G", "--allow-other", "--codec=zstd-3"]
        );
    }

    #[test]
    fn a_config_file_gives_values_switches_and_repeated_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("prepfs.toml");
        std::fs::write(
            &path,
            "cache_mem = \"8G\"\nprefetch-threads = 3\nallow_other = false\nforeground = true\n\
             view = [\"train=decode,hflip\", \"val=decode\"]\n",
        )
        .expect("write");
        let mut got = words(&from_file(&path).expect("parses"));
        got.sort();
        assert_eq!(
            got,
            [
                "--cache-mem=8G",
                "--foreground",
                "--prefetch-threads=3",
                "--view=train=decode,hflip",
                "--view=val=decode"
            ]
        );
        std::fs::write(&path, "cache_mem = [1]\n").expect("write");
        assert!(from_file(&path).expect_err("bad").contains("cache_mem"));
        std::fs::write(&path, "cache_mem = \n").expect("write");
        assert!(from_file(&path).is_err());
    }

    #[test]
    fn spelled_out_files_come_first_and_unknown_names_say_where_they_came_from() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("prepfs.toml");
        std::fs::write(&path, "codec = \"lz4\"\n").expect("write");
        let known = ["cache-mem", "codec", "allow-other"];
        let line = |words: &[&str]| words.iter().map(OsString::from).collect::<Vec<_>>();
        let config = format!("config={}", path.display());
        let got = spell_out(
            line(&[
                "src",
                "-o",
                &format!("rw,cache_mem=8G,{config}"),
                "--codec",
                "zstd",
            ]),
            &known,
        )
        .expect("spells out");
        assert_eq!(
            got,
            line(&["--codec=lz4", "src", "--cache-mem=8G", "--codec", "zstd"])
        );
        let err = spell_out(line(&["-o", "cache_size=8G"]), &known).expect_err("unknown");
        assert_eq!(err, "unknown mount option 'cache-size' in -o");
        std::fs::write(&path, "o = \"x\"\n").expect("write");
        let err = spell_out(line(&["--config", &path.display().to_string()]), &known)
            .expect_err("unknown");
        assert!(err.contains("'o'") && err.contains("prepfs.toml"), "{err}");
        assert_eq!(
            spell_out(line(&["-o"]), &known).expect_err("no value"),
            "-o needs a value"
        );
    }
}
