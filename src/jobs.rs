//! Training jobs as the mount tells them apart: which job the process behind a request belongs to.
//!
//! Owns the rule (docs/SEMANTICS.md, "Jobs"): a process whose environment names `PREPFS_JOB=<name>`
//! belongs to the job of that name, and one that torchrun started (its `TORCHELASTIC_RUN_ID` and
//! `MASTER_PORT`) to that run's job, all ranks together; any other process belongs to the job of
//! the oldest ancestor it was forked from: walking up while the parent runs the same program and
//! the process did not start a command line of its own (a DataLoader's workers are forks of their
//! loader, or Python's multiprocessing bootstraps, so they are its job; trainings a script or a
//! Python driver starts as new commands are jobs of their own). A job is that ancestor's pid and
//! start time, so a restarted job is a new job. Reads only /proc (in memory, never the source);
//! its cache of processes is bounded (`MAX_PROCESSES`). A process it knows costs a read of its
//! `status` and `stat`, which may run on a FUSE thread; one it does not know also costs its and
//! its ancestors' `cmdline` and `environ`, which wait for the process's memory-map lock (held by
//! a thread of it faulting on a mapping of this mount, the fault waiting for a FUSE thread): ask
//! `knows` first, and look a new process up off the FUSE threads. Must never be asked about
//! requests that are not opens of view files: the lookups cost a few /proc reads.

use std::collections::HashMap;
use std::path::PathBuf;

use parking_lot::Mutex;

/// A training job: a hash of its name, or of its oldest same-program ancestor's pid and start
/// time. `JobId::UNKNOWN` stands for requests with no process behind them (or one /proc does not
/// show), which all count as one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

impl JobId {
    /// The job of requests whose process prepfs cannot see.
    pub const UNKNOWN: JobId = JobId(0);
}

/// The environment variable that names a job explicitly.
pub const JOB_VARIABLE: &str = "PREPFS_JOB";
/// What torchrun sets in every rank of one run (with `MASTER_PORT`, distinct between runs on one
/// node): a run is one job.
const TORCHRUN_VARIABLES: [&str; 2] = ["TORCHELASTIC_RUN_ID", "MASTER_PORT"];
/// Command lines of Python's own process bootstraps (multiprocessing's spawn and forkserver,
/// joblib's loky): such a process, though started as a new command, works for its parent.
const BOOTSTRAPS: [&[u8]; 2] = [b"multiprocessing", b"loky"];
/// Processes whose job is remembered; past it the memory starts over (each process is then
/// looked up again once).
const MAX_PROCESSES: usize = 4096;
/// Parents walked at most, so a deep chain of one program costs a bounded number of reads.
const MAX_ANCESTORS: usize = 64;

/// A job as the mount saw it: its id, and the process it was named after (none for a job named
/// by `PREPFS_JOB`, or the unknown job).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Pid and start time of its oldest same-program ancestor.
    root: Option<(u32, u64)>,
}

impl Job {
    /// Whether the job may still open files: its root process lives (the same pid, started at the
    /// same time). A named job and the unknown job always may.
    pub fn alive(&self) -> bool {
        self.root.is_none_or(|(pid, started)| {
            Process::read(pid).is_some_and(|p| p.tgid == pid && p.started == started)
        })
    }
}

/// Maps the processes behind requests to their jobs, remembering each process (by pid and start
/// time, so a reused pid is looked up again).
#[derive(Default)]
pub struct Jobs {
    processes: Mutex<HashMap<u32, (u64, Job)>>,
}

impl Jobs {
    /// Whether `of(pid)` is answered from the cache (or needs no more of /proc than this asks):
    /// a process seen before, or one /proc does not show.
    pub fn knows(&self, pid: u32) -> bool {
        Process::read(pid).is_none_or(|process| {
            self.processes
                .lock()
                .get(&process.tgid)
                .is_some_and(|&(started, _)| started == process.started)
        })
    }

    /// The job of the process (or thread) `pid` as the kernel names it in a request.
    pub fn of(&self, pid: u32) -> Job {
        let Some(process) = Process::read(pid) else {
            return Job {
                id: JobId::UNKNOWN,
                root: None,
            };
        };
        if let Some(&(started, job)) = self.processes.lock().get(&process.tgid)
            && started == process.started
        {
            return job;
        }
        let job = job_of(&process);
        let mut processes = self.processes.lock();
        if processes.len() >= MAX_PROCESSES {
            processes.clear();
        }
        processes.insert(process.tgid, (process.started, job));
        job
    }
}

/// What /proc says of one process.
struct Process {
    /// The process (thread group) id.
    tgid: u32,
    /// Its parent's.
    ppid: u32,
    /// Its start time, in clock ticks since boot.
    started: u64,
}

impl Process {
    /// The process that thread or process `pid` belongs to.
    fn read(pid: u32) -> Option<Process> {
        if pid == 0 {
            return None;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        let (tgid, ppid) = (field("Tgid:")?, field("PPid:")?);
        let stat = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
        // Fields after the command name (which is in parentheses and may hold anything): the
        // start time is the 20th of them (field 22 of stat).
        let started = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(19)?
            .parse()
            .ok()?;
        Some(Process {
            tgid,
            ppid,
            started,
        })
    }

    fn program(&self) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/{}/exe", self.tgid)).ok()
    }

    /// The job its environment names: `PREPFS_JOB`'s value, else torchrun's run (its id and
    /// port), if set and not empty.
    fn named_job(&self) -> Option<Vec<u8>> {
        let environ = std::fs::read(format!("/proc/{}/environ", self.tgid)).ok()?;
        let value = |name: &str| {
            let prefix = format!("{name}=");
            environ
                .split(|&b| b == 0)
                .find_map(|var| var.strip_prefix(prefix.as_bytes()))
                .filter(|value| !value.is_empty())
        };
        if let Some(name) = value(JOB_VARIABLE) {
            return Some(name.to_vec());
        }
        let mut run = b"torchrun\0".to_vec();
        for name in TORCHRUN_VARIABLES {
            run.extend_from_slice(value(name)?);
            run.push(0);
        }
        Some(run)
    }

    fn command_line(&self) -> Option<Vec<u8>> {
        std::fs::read(format!("/proc/{}/cmdline", self.tgid)).ok()
    }

    /// Whether it works for `parent` rather than being a job of its own: it runs the same
    /// program, and either has its parent's command line (a fork) or is one of the
    /// interpreter's own worker bootstraps.
    fn works_for(&self, parent: &Process) -> bool {
        let Some(program) = self.program() else {
            return false;
        };
        if parent.program().as_ref() != Some(&program) {
            return false;
        }
        let command = self.command_line().unwrap_or_default();
        command == parent.command_line().unwrap_or_default()
            || BOOTSTRAPS
                .iter()
                .any(|b| command.windows(b.len()).any(|w| w == *b))
    }
}

/// The job of `process` by the rule above.
fn job_of(process: &Process) -> Job {
    if let Some(name) = process.named_job() {
        let mut key = b"name\0".to_vec();
        key.extend_from_slice(&name);
        return Job {
            id: JobId(xxhash_rust::xxh3::xxh3_64(&key).max(1)),
            root: None,
        };
    }
    let mut root = Process {
        tgid: process.tgid,
        ppid: process.ppid,
        started: process.started,
    };
    for _ in 0..MAX_ANCESTORS {
        if root.ppid <= 1 {
            break;
        }
        match Process::read(root.ppid) {
            Some(parent) if root.works_for(&parent) => root = parent,
            _ => break,
        }
    }
    let root = (root.tgid, root.started);
    let mut key = b"process\0".to_vec();
    key.extend_from_slice(&root.0.to_le_bytes());
    key.extend_from_slice(&root.1.to_le_bytes());
    Job {
        id: JobId(xxhash_rust::xxh3::xxh3_64(&key).max(1)),
        root: Some(root),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn sleeper(env: Option<&str>) -> std::process::Child {
        let mut command = Command::new("sleep");
        command.arg("30").stdout(Stdio::null());
        if let Some(name) = env {
            command.env(JOB_VARIABLE, name);
        }
        let child = command.spawn().expect("sleep");
        // Asked before its exec is done (program, arguments and environment in place), the
        // child would still be a fork of this test.
        while !Process::read(child.id()).is_some_and(|p| {
            p.program().is_some_and(|p| p.ends_with("sleep"))
                && p.command_line().is_some_and(|c| c.starts_with(b"sleep"))
        }) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child
    }

    #[test]
    fn a_process_is_known_once_its_job_was_looked_up() {
        let jobs = Jobs::default();
        let me = std::process::id();
        assert!(
            !jobs.knows(me),
            "not looked up yet: its memory would be read"
        );
        jobs.of(me);
        assert!(jobs.knows(me));
        // Nothing behind the request: nothing to read.
        assert!(jobs.knows(0));
    }

    #[test]
    fn a_process_of_another_program_is_its_own_job_and_a_named_one_joins_its_name() {
        let jobs = Jobs::default();
        let me = jobs.of(std::process::id()).id;
        assert_ne!(me, JobId::UNKNOWN);
        // This test's threads are this process's job (asked while the thread lives).
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid(2) has no memory effects.
            let _ = tid_tx.send(unsafe { libc::gettid() } as u32);
            let _ = done_rx.recv();
        });
        let tid = tid_rx.recv().expect("tid");
        assert_ne!(tid, std::process::id());
        assert_eq!(jobs.of(tid).id, me);
        drop(done_tx);
        thread.join().expect("thread");
        let (mut a, mut b) = (sleeper(None), sleeper(None));
        let (ja, jb) = (jobs.of(a.id()).id, jobs.of(b.id()).id);
        assert!(ja != me && jb != me && ja != jb, "{me:?} {ja:?} {jb:?}");
        let (mut n1, mut n2) = (sleeper(Some("search-7")), sleeper(Some("search-7")));
        assert_eq!(jobs.of(n1.id()).id, jobs.of(n2.id()).id);
        assert_ne!(jobs.of(n1.id()).id, ja);
        let job_a = jobs.of(a.id());
        assert!(job_a.alive());
        for child in [&mut a, &mut b, &mut n1, &mut n2] {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(!job_a.alive(), "a job whose process ended is over");
        assert_eq!(jobs.of(0).id, JobId::UNKNOWN);
    }

    /// The first child of `pid` whose command line holds `command`, once it has one.
    fn child_running(pid: u32, command: &str) -> u32 {
        for _ in 0..500 {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                let line = Process::read(child).and_then(|p| p.command_line());
                if line.is_some_and(|l| l.windows(command.len()).any(|w| w == command.as_bytes())) {
                    return child;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("no child of {pid} runs {command}");
    }

    #[test]
    fn forks_are_their_parents_job_and_new_commands_of_the_same_program_their_own() {
        let jobs = Jobs::default();
        // A forked subshell (same program, same command line): the outer shell's job.
        let mut forks = Command::new("sh")
            .args(["-c", "(sleep 5; true) & wait"])
            .spawn()
            .expect("sh");
        let sub = child_running(forks.id(), "(sleep 5; true)");
        assert_eq!(jobs.of(sub).id, jobs.of(forks.id()).id);
        // A shell started as a new command by a shell (a driver starting a trial): its own job.
        let mut driver = Command::new("sh")
            .args(["-c", "sh -c 'sleep 5; true' & wait"])
            .spawn()
            .expect("sh");
        let trial = child_running(driver.id(), "\0sleep 5; true");
        assert_ne!(jobs.of(trial).id, jobs.of(driver.id()).id);
        for child in [&mut forks, &mut driver] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
