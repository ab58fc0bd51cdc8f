//! What the views comparison's runs of several jobs at once tell (issue 35, coordinated prep):
//! the jobs table (all jobs' images/s, renders per epoch against the files, shared hits, CPU per
//! image and what bounds it), the sentence on what bounds the gain, and the targets of issue 35.
//!
//! The targets compare the uint8 view with coordination (`u8-off`: `--decoded-cache off`,
//! renders shared) against the same mount with coordination off (`u8-alone`) and against DALI's
//! crop-decoding pipeline (`dali-roi`), three jobs each, and one job of it against one of
//! `u8-alone`. A target whose runs are missing is left out, never guessed.
//!
//! Presentation only: every number comes from the summaries it is given. Must never assert: a
//! missed target is reported as missed, and the run still succeeds.

use crate::target::Target;
use crate::views::Pipeline;
use crate::views_report::{Summary, find, speedup};

/// Jobs of the coordinated runs.
const JOBS: usize = 3;
/// Renders per epoch, three jobs on the uint8 view, at most this many times the files.
const RENDERS_PER_FILE: f64 = 1.1;
/// The daemon's CPU per epoch for three jobs, at most this many times that for one.
const DAEMON_CPU_VS_ONE_JOB: f64 = 1.2;
/// Three coordinated jobs' images/s over three with coordination off.
const VS_ALONE: f64 = 1.6;
/// Three coordinated jobs' images/s over three DALI `image_random_crop` jobs.
const VS_DALI_ROI: f64 = 2.0;
/// One job: what coordination may cost in images/s and daemon CPU per image, as a fraction.
const ONE_JOB_COST: f64 = 0.03;
/// Cores busy, as a fraction of the machine's, from which a run counts as CPU-bound.
const CPU_BOUND: f64 = 0.9;

/// The targets for the runs present; none when no run had several jobs.
pub fn targets(summaries: &[Summary], files: usize) -> Vec<Target> {
    let (coordinated, alone) = (Pipeline::ViewUint8Off, Pipeline::ViewUint8Alone);
    let mut out = Vec::new();
    let three = find(summaries, coordinated, JOBS);
    let one = find(summaries, coordinated, 1);
    if let Some(renders) = three.and_then(|s| s.renders_per_epoch) {
        let ratio = renders / files.max(1) as f64;
        out.push(Target {
            name: format!("jobs (issue 35): {JOBS} jobs, uint8 view: renders per epoch / files"),
            measured: ratio,
            bound: format!("<= {RENDERS_PER_FILE:.2}"),
            met: ratio <= RENDERS_PER_FILE,
        });
    }
    let daemon = |s: Option<&Summary>| s.and_then(|s| s.daemon_cpu_s_per_epoch);
    if let (Some(many), Some(single)) = (daemon(three), daemon(one)) {
        let ratio = many / single.max(1e-9);
        out.push(Target {
            name: format!("jobs (issue 35): uint8 view: daemon CPU per epoch, {JOBS} jobs / 1 job"),
            measured: ratio,
            bound: format!("<= {DAEMON_CPU_VS_ONE_JOB:.2}"),
            met: ratio <= DAEMON_CPU_VS_ONE_JOB,
        });
    }
    if let Some(three) = three {
        for (base, bound, what) in [
            (alone, VS_ALONE, "coordination off (--share-renders off)"),
            (Pipeline::DaliRoi, VS_DALI_ROI, "DALI CPU image_random_crop"),
        ] {
            if let Some(base) = find(summaries, base, JOBS) {
                out.push(speedup(
                    format!("jobs (issue 35): {JOBS} jobs, uint8 view: images/s / {what}"),
                    three,
                    base,
                    bound,
                ));
            }
        }
    }
    if let (Some(one), Some(off)) = (one, find(summaries, alone, 1)) {
        out.extend(one_job_targets(one, off));
    }
    out
}

/// One job: coordination costs at most `ONE_JOB_COST` of images/s and of daemon CPU per image
/// against the same mount with coordination off. One-sided: being faster is no cost.
fn one_job_targets(one: &Summary, off: &Summary) -> Vec<Target> {
    let mut out = vec![speedup(
        "jobs (issue 35): 1 job, uint8 view: images/s / coordination off".into(),
        one,
        off,
        1.0 - ONE_JOB_COST,
    )];
    if let (Some(ms), Some(base)) = (one.daemon_cpu_ms_per_image, off.daemon_cpu_ms_per_image) {
        let ratio = ms / base.max(1e-9);
        out.push(Target {
            name: "jobs (issue 35): 1 job, uint8 view: daemon CPU ms/image / coordination off"
                .into(),
            measured: ratio,
            bound: format!("<= {:.2}", 1.0 + ONE_JOB_COST),
            met: ratio <= 1.0 + ONE_JOB_COST,
        });
    }
    out
}

/// The jobs section: one row per pipeline and job count, and what bounds the gain; empty when
/// no run had several jobs.
pub fn markdown(summaries: &[Summary], files: usize, workers: usize) -> String {
    if summaries.iter().all(|s| s.jobs <= 1) {
        return String::new();
    }
    let cores = cores();
    let mut md = format!(
        "\n**Jobs** (issue 35, coordinated prep): each pipeline again with several training jobs \
         at once: readers started together in one cgroup (over one mount for a view), each a \
         process of its own with a DataLoader of {workers} workers (or {workers} DALI threads) \
         and its own shuffle seed, every epoch started in all of them at once. Images/s is all \
         jobs' images over the time from the epoch's start to the last job's end; renders and \
         shared hits are the mount's counters (`views.<name>.renders`, `.shared_hits`) per \
         measured epoch, renders against the {files} files; CPU is per image delivered to any \
         job. \"CPU-bound images/s\" is what the machine's {cores} cores would deliver at that \
         CPU per image, all busy. `--share-renders off` is coordination off: every job renders \
         its own tensors.\n\n\
         | pipeline | jobs | images/s, all jobs | vs 1 job | renders per epoch / files | shared hits per epoch | CPU ms/image | loader ms/image | daemon ms/image | daemon CPU s per epoch | cores busy | CPU-bound images/s |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    for s in summaries {
        let vs_one =
            find(summaries, s.pipeline, 1).map(|one| s.images_per_s / one.images_per_s.max(1e-9));
        md.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {:.2} | {} | {} | {} | {:.2} | {:.0} |\n",
            s.pipeline.name(),
            s.jobs,
            s.images_per_s,
            opt(vs_one, 2),
            opt(s.renders_per_epoch.map(|r| r / files.max(1) as f64), 2),
            opt(s.shared_hits_per_epoch, 0),
            s.cpu_ms_per_image,
            opt(s.loader_cpu_ms_per_image, 2),
            opt(s.daemon_cpu_ms_per_image, 2),
            opt(s.daemon_cpu_s_per_epoch, 2),
            s.cores_busy,
            cores as f64 * 1e3 / s.cpu_ms_per_image.max(1e-9),
        ));
    }
    for pipeline in [Pipeline::ViewUint8Off, Pipeline::ViewFloat32Off] {
        if let Some(line) = bound_of_gain(summaries, pipeline, cores) {
            md.push_str(&line);
        }
    }
    md
}

/// What bounds the gain of `pipeline` (a coordinated view) at its largest job count: whether
/// the cores were all busy (by the jobs or by other processes), and the loaders' own CPU per
/// image, which no shared render saves.
fn bound_of_gain(summaries: &[Summary], pipeline: Pipeline, cores: usize) -> Option<String> {
    let s = summaries
        .iter()
        .filter(|s| s.pipeline == pipeline && s.jobs > 1)
        .max_by_key(|s| s.jobs)?;
    let loader = s.loader_cpu_ms_per_image?;
    let daemon = s.daemon_cpu_ms_per_image?;
    // Cores that other processes took count as busy: the jobs could not have had them.
    let verdict = if s.cores_busy + s.others_busy >= CPU_BOUND * cores as f64 {
        "all busy, so CPU bounds it"
    } else {
        "not all busy, so waits bound it before CPU does: on renders, or on the slowest job at \
         the epoch's end"
    };
    let busy = format!("with other processes' {:.2}: {verdict}", s.others_busy);
    let ceiling = cores as f64 * 1e3 / loader.max(1e-9);
    Some(format!(
        "\nWhat bounds the gain, {} with {} jobs: {:.0} images/s kept {:.2} of {cores} cores \
         busy ({busy}). Of its {:.2} CPU ms per image the daemon's renders take {daemon:.2} and \
         the loaders {loader:.2} ({:.0}%: np.load, collation, the workers' transfers, one per \
         job and image, which no shared render saves); even a daemon that cost nothing would \
         leave {cores} cores at most {ceiling:.0} images/s ({:.2}x the measured).\n",
        pipeline.name(),
        s.jobs,
        s.images_per_s,
        s.cores_busy,
        s.cpu_ms_per_image,
        loader * 100.0 / s.cpu_ms_per_image.max(1e-9),
        ceiling / s.images_per_s.max(1e-9),
    ))
}

/// Cores of this machine (what "all busy" means).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
