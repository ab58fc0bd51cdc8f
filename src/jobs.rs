//! Training jobs as the mount tells them apart: which job the process behind a request belongs to.
//!
//! Owns the rule (docs/SEMANTICS.md, "Jobs"): a process whose environment names
//! `PREPFS_JOB=<name>` belongs to the job of that name; any other process belongs to the job of
//! its oldest ancestor that runs the same program, walking up through parents that run it (a
//! DataLoader's workers, forked or spawned through a forkserver, run the interpreter their loader
//! runs, so they are its job; two trainings started by one shell script are two jobs, since the
//! shell runs another program). A job is that ancestor's pid and start time, so a restarted job is
//! a new job. Reads only /proc (in memory, never the source), so it may run on a FUSE thread; its
//! cache of processes is bounded (`MAX_PROCESSES`). Must never be asked about requests that are
//! not opens of view files: the lookups cost a few /proc reads.

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

    /// The value of `PREPFS_JOB` in its environment, if set and not empty.
    fn named_job(&self) -> Option<Vec<u8>> {
        let environ = std::fs::read(format!("/proc/{}/environ", self.tgid)).ok()?;
        let prefix = format!("{JOB_VARIABLE}=");
        environ
            .split(|&b| b == 0)
            .find_map(|var| var.strip_prefix(prefix.as_bytes()))
            .filter(|name| !name.is_empty())
            .map(<[u8]>::to_vec)
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
    let program = process.program();
    let mut root = (process.tgid, process.started);
    let mut ppid = process.ppid;
    for _ in 0..MAX_ANCESTORS {
        if ppid <= 1 {
            break;
        }
        let Some(parent) = Process::read(ppid) else {
            break;
        };
        if program.is_none() || parent.program() != program {
            break;
        }
        root = (parent.tgid, parent.started);
        ppid = parent.ppid;
    }
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
        command.spawn().expect("sleep")
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

    #[test]
    fn children_running_the_same_program_are_their_parents_job() {
        // A shell that forks a subshell (the same program) which sleeps: the subshell is the
        // outer shell's job; `sleep` itself is another program, so its own job.
        let jobs = Jobs::default();
        let mut outer = Command::new("sh")
            .args(["-c", "(sh -c 'sleep 5; true'; true) & wait"])
            .spawn()
            .expect("sh");
        let outer_job = loop {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", outer.id()))
                    .unwrap_or_default();
            if let Some(sub) = children.split_whitespace().next() {
                let sub: u32 = sub.parse().expect("pid");
                if Process::read(sub)
                    .and_then(|p| p.program())
                    .is_some_and(|p| {
                        p.file_name()
                            .is_some_and(|n| n.to_string_lossy().contains("sh"))
                    })
                {
                    break (jobs.of(outer.id()).id, jobs.of(sub).id);
                }
            }
        };
        assert_eq!(
            outer_job.0, outer_job.1,
            "a forked shell is its parent's job"
        );
        let _ = outer.kill();
        let _ = outer.wait();
    }
}
