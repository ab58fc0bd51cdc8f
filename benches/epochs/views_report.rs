//! What the views comparison tells: each pipeline's medians over its rounds (at each job count),
//! the Markdown table with ratios against stock PyTorch and against DALI's crop-decoding pipeline
//! measured in the same run with as many jobs, the images/s plot, and the targets of issues 4 and
//! 25 (one job). Several jobs at once (issue 35) have their own table, in `jobs_report`.
//!
//! Presentation only: every number comes from the runs it is given. Must never assert: a missed
//! target is reported as missed, and the run still succeeds.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::dataset::Manifest;
use crate::target::{Target, median};
use crate::views::{Pipeline, ViewRun};

/// Issue 25: float32 view (`--decoded-cache off`) images/s over DALI's image_random_crop.
const FLOAT32_VS_DALI_ROI: f64 = 1.05;
/// Issue 25: uint8 view (`--decoded-cache off`) images/s over DALI's image_random_crop.
const UINT8_VS_DALI_ROI: f64 = 1.4;
/// Issue 25: the daemon's CPU per image, views with `--decoded-cache off`, in ms.
const DAEMON_MS_PER_IMAGE: f64 = 1.2;
/// Issue 4: float32 view images/s over stock PyTorch.
const FLOAT32_VS_STOCK: f64 = 2.5;
/// Cores of CPU the rest of the machine may use during a run before its table says the run shared
/// the machine: background daemons stay well under it; a compile or a test suite does not.
const SHARED_MACHINE_CORES: f64 = 0.1;

/// One pipeline at one job count over all its rounds. Each round's value aggregates its
/// measured epochs (images over seconds, CPU over images); the pipeline's value is the median
/// over rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub pipeline: Pipeline,
    /// Jobs that read every epoch at once.
    pub jobs: usize,
    /// Images per second, all jobs together.
    pub images_per_s: f64,
    /// Each round's images per second, in round order.
    pub round_images_per_s: Vec<f64>,
    /// CPU of the whole pipeline (loader, workers, daemon) per image, ms.
    pub cpu_ms_per_image: f64,
    /// The prepfs daemon's part of it.
    pub daemon_cpu_ms_per_image: Option<f64>,
    /// The rest: the loader's processes.
    pub loader_cpu_ms_per_image: Option<f64>,
    /// CPU seconds per second of the pipeline: cores it kept busy.
    pub cores_busy: f64,
    /// CPU seconds per second that other processes on the machine used meanwhile.
    pub others_busy: f64,
    /// The view's decode and render latency p50 after the last epoch, ms.
    pub decode_p50_ms: Option<f64>,
    pub render_p50_ms: Option<f64>,
    /// Decoded pixels the mount held after the last epoch, MB.
    pub decoded_mb: Option<f64>,
    /// The daemon's CPU seconds per measured epoch (every job reading every image once).
    pub daemon_cpu_s_per_epoch: Option<f64>,
    /// Renders the view's mount made per measured epoch.
    pub renders_per_epoch: Option<f64>,
    /// Opens served by another job's render per measured epoch.
    pub shared_hits_per_epoch: Option<f64>,
}

/// The summaries of the pipelines that ran, in `Pipeline::ALL` order, each pipeline's job counts
/// in increasing order.
pub fn summarize(runs: &[ViewRun]) -> Vec<Summary> {
    let mut counts: Vec<usize> = runs.iter().map(|r| r.jobs).collect();
    counts.sort_unstable();
    counts.dedup();
    Pipeline::ALL
        .into_iter()
        .flat_map(|pipeline| counts.iter().map(move |&jobs| (pipeline, jobs)))
        .filter_map(|(pipeline, jobs)| {
            let rounds: Vec<&ViewRun> = runs
                .iter()
                .filter(|r| r.pipeline == pipeline && r.jobs == jobs)
                .collect();
            (!rounds.is_empty()).then(|| summary(pipeline, jobs, &rounds))
        })
        .collect()
}

/// A counter of the measured epochs, per epoch: None when the pipeline has no mount.
fn per_epoch(run: &ViewRun, f: fn(&crate::views::ViewEpoch) -> Option<u64>) -> Option<f64> {
    let epochs = run.measured();
    let total = epochs.iter().map(f).sum::<Option<u64>>()?;
    Some(total as f64 / epochs.len().max(1) as f64)
}

fn summary(pipeline: Pipeline, jobs: usize, rounds: &[&ViewRun]) -> Summary {
    let over = |f: &dyn Fn(&ViewRun) -> Option<f64>| -> Option<f64> {
        let values: Vec<f64> = rounds.iter().filter_map(|r| f(r)).collect();
        (!values.is_empty()).then(|| median(values))
    };
    let sum = |run: &ViewRun, f: &dyn Fn(&crate::views::ViewEpoch) -> f64| -> f64 {
        run.measured().iter().map(f).sum()
    };
    let items = |run: &ViewRun| sum(run, &|e| e.items as f64).max(1.0);
    let seconds = |run: &ViewRun| sum(run, &|e| e.seconds).max(1e-9);
    let round_rate = |run: &ViewRun| items(run) / seconds(run);
    let daemon_seconds = |run: &ViewRun| -> Option<f64> {
        run.measured()
            .iter()
            .map(|e| e.daemon_cpu_seconds)
            .sum::<Option<f64>>()
    };
    let last_stats = |run: &ViewRun, path: &[&str]| -> Option<f64> {
        let stats = run.epochs.last()?.prepfs_stats.as_ref()?;
        path.iter()
            .try_fold(stats, |v: &Value, key| v.get(*key))?
            .as_f64()
    };
    let view = |run: &ViewRun| {
        run.spec
            .map(|s| s.split_once('=').map_or(s, |(n, _)| n).to_owned())
    };
    let latency = |name: &'static str| {
        move |run: &ViewRun| {
            let view = view(run)?;
            last_stats(run, &["views", &view, name, "p50"]).map(|us| us / 1e3)
        }
    };
    Summary {
        pipeline,
        jobs,
        images_per_s: median(rounds.iter().map(|r| round_rate(r)).collect()),
        round_images_per_s: rounds.iter().map(|r| round_rate(r)).collect(),
        cpu_ms_per_image: over(&|r| Some(sum(r, &|e| e.cpu_seconds) * 1e3 / items(r)))
            .unwrap_or(0.0),
        daemon_cpu_ms_per_image: over(&|r| daemon_seconds(r).map(|d| d * 1e3 / items(r))),
        loader_cpu_ms_per_image: over(&|r| {
            daemon_seconds(r).map(|d| (sum(r, &|e| e.cpu_seconds) - d) * 1e3 / items(r))
        }),
        cores_busy: over(&|r| Some(sum(r, &|e| e.cpu_seconds) / seconds(r))).unwrap_or(0.0),
        others_busy: over(&|r| Some(sum(r, &|e| e.others_cpu_seconds) / seconds(r))).unwrap_or(0.0),
        decode_p50_ms: over(&latency("decode_latency_us")),
        render_p50_ms: over(&latency("render_latency_us")),
        decoded_mb: over(&|r| {
            view(r)?;
            last_stats(r, &["cache", "decoded", "bytes"]).map(|b| b / 1e6)
        }),
        daemon_cpu_s_per_epoch: over(&|r| {
            daemon_seconds(r).map(|d| d / r.measured().len().max(1) as f64)
        }),
        renders_per_epoch: over(&|r| per_epoch(r, |e| e.renders)),
        shared_hits_per_epoch: over(&|r| per_epoch(r, |e| e.shared_hits)),
    }
}

/// The summary of `pipeline` with `jobs` jobs, when it ran.
pub fn find(summaries: &[Summary], pipeline: Pipeline, jobs: usize) -> Option<&Summary> {
    summaries
        .iter()
        .find(|s| s.pipeline == pipeline && s.jobs == jobs)
}

/// The target that `view` delivers at least `bound` times the images per second of `base`.
pub fn speedup(name: String, view: &Summary, base: &Summary, bound: f64) -> Target {
    let ratio = view.images_per_s / base.images_per_s.max(1e-9);
    Target {
        name,
        measured: ratio,
        bound: format!(">= {bound:.2}"),
        met: ratio >= bound,
    }
}

/// The targets of issues 25 and 4 (one job), for the pipelines that ran.
pub fn targets(summaries: &[Summary]) -> Vec<Target> {
    let one_job = |pipeline| find(summaries, pipeline, 1);
    let mut out = Vec::new();
    if let Some(roi) = one_job(Pipeline::DaliRoi) {
        for (pipeline, bound) in [
            (Pipeline::ViewFloat32Off, FLOAT32_VS_DALI_ROI),
            (Pipeline::ViewUint8Off, UINT8_VS_DALI_ROI),
        ] {
            if let Some(view) = one_job(pipeline) {
                out.push(speedup(
                    format!(
                        "views (issue 25): {} images/s / DALI CPU image_random_crop",
                        pipeline.name()
                    ),
                    view,
                    roi,
                    bound,
                ));
            }
        }
    }
    for pipeline in [Pipeline::ViewFloat32Off, Pipeline::ViewUint8Off] {
        if let Some(ms) = one_job(pipeline).and_then(|s| s.daemon_cpu_ms_per_image) {
            out.push(Target {
                name: format!("views (issue 25): {}: daemon CPU ms/image", pipeline.name()),
                measured: ms,
                bound: format!("<= {DAEMON_MS_PER_IMAGE:.2}"),
                met: ms <= DAEMON_MS_PER_IMAGE,
            });
        }
    }
    if let Some(stock) = one_job(Pipeline::Stock) {
        for pipeline in [Pipeline::ViewFloat32Off, Pipeline::ViewFloat32] {
            if let Some(view) = one_job(pipeline) {
                out.push(speedup(
                    format!(
                        "views (issue 4): {} images/s / stock PyTorch",
                        pipeline.name()
                    ),
                    view,
                    stock,
                    FLOAT32_VS_STOCK,
                ));
            }
        }
    }
    out
}

/// "name version, ..." of every Python package the runs reported.
fn versions(runs: &[ViewRun]) -> String {
    let mut seen: Vec<(String, String)> = Vec::new();
    for run in runs {
        if let Some(map) = run.versions.as_object() {
            for (name, version) in map {
                if !seen.iter().any(|(n, _)| n == name) {
                    seen.push((name.clone(), version.as_str().unwrap_or("?").to_owned()));
                }
            }
        }
    }
    seen.iter()
        .map(|(n, v)| format!("{n} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The views section: what ran, and one row per pipeline (empty when none ran).
pub fn markdown(
    manifest: &Manifest,
    runs: &[ViewRun],
    summaries: &[Summary],
    workers: usize,
    step_ms: f64,
) -> String {
    if summaries.is_empty() {
        return String::new();
    }
    let rounds = runs.iter().map(|r| r.round).max().unwrap_or(0);
    let measured = runs.first().map_or(0, |r| r.measured().len());
    let mut md = format!(
        "\n**Views** (issues 4 and 25): {} photo-like JPEGs (`src/synthetic.rs`, {:.0} KB mean, \
         400-640 x 300-480 px) in 100 class folders on an ext4 loop mount, unthrottled, its page \
         cache warm. Every pipeline delivers shuffled batches of 64 RandomResizedCrop(224) + \
         horizontal flip images as torch tensors, with {workers} DataLoader workers or {workers} DALI \
         threads; the consumer computes {step_ms} ms per batch (`--step-ms`). \
         Each pipeline runs {rounds} round(s), the order rotated by one each round; a run is a \
         fresh process (and prepfs mount), 1 warm-up epoch and {measured} measured. Numbers are \
         medians over the rounds of each round's measured epochs. CPU is the pipeline's cpuacct \
         cgroup (loader, workers, DALI threads and the prepfs daemon), counted from the end of \
         the warm-up epoch; the daemon's part is its own utime + stime; loader = CPU - daemon. \
         \"Others\" is CPU the rest of the machine used meanwhile (0 on a quiet machine). \
         Latencies are the daemon's p50 over the mount's life. With several jobs (`--jobs`), \
         each a reader of its own started together with the others, images/s is all jobs' \
         images over the time from the epoch's start to the last job's end, and the ratios are \
         against the peer run with as many jobs. Versions: {}.\n\n\
         | pipeline | jobs | images/s | rounds' images/s | vs stock | vs DALI crop | CPU ms/image | loader ms/image | daemon ms/image | cores busy | others | decode p50 ms | render p50 ms | decoded pixels MB |\n\
         |---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        manifest.files,
        manifest.file_bytes as f64 / manifest.files.max(1) as f64 / 1e3,
        versions(runs),
    );
    let ratio = |base: Option<&Summary>, s: &Summary| {
        base.map_or("-".into(), |b| {
            format!("{:.2}", s.images_per_s / b.images_per_s.max(1e-9))
        })
    };
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    for s in summaries {
        let (stock, roi) = (
            find(summaries, Pipeline::Stock, s.jobs),
            find(summaries, Pipeline::DaliRoi, s.jobs),
        );
        let rounds = s
            .round_images_per_s
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        md.push_str(&format!(
            "| {} | {} | {:.0} | {rounds} | {} | {} | {:.2} | {} | {} | {:.2} | {:.2} | {} | {} | {} |\n",
            s.pipeline.name(),
            s.jobs,
            s.images_per_s,
            ratio(stock, s),
            ratio(roi, s),
            s.cpu_ms_per_image,
            opt(s.loader_cpu_ms_per_image),
            opt(s.daemon_cpu_ms_per_image),
            s.cores_busy,
            s.others_busy,
            opt(s.decode_p50_ms),
            opt(s.render_p50_ms),
            s.decoded_mb.map_or("-".into(), |mb| format!("{mb:.0}")),
        ));
    }
    let shared = summaries.iter().map(|s| s.others_busy).fold(0.0, f64::max);
    if shared > SHARED_MACHINE_CORES {
        md.push_str(&format!(
            "\n**This run shared the machine**: other processes used up to {shared:.2} cores while \
             a pipeline ran, so its numbers are lower than on a quiet machine, and unevenly so.\n"
        ));
    }
    md
}

/// The images/s plot's file name, beside views.json.
pub const PLOT: &str = "views_images_per_s.svg";
/// Its title.
pub const PLOT_TITLE: &str =
    "Images/s per pipeline, same images and cores (RandomResizedCrop(224) + flip)";

/// One bar of the plot: a pipeline, its job count and its images per second (all jobs').
pub type Bar = (Pipeline, usize, f64);

/// Images per second of each pipeline that ran, from the summaries.
pub fn bars(summaries: &[Summary]) -> Vec<Bar> {
    summaries
        .iter()
        .map(|s| (s.pipeline, s.jobs, s.images_per_s))
        .collect()
}

/// The same bars from a views.json this harness wrote (`--replot-views`); one job where it
/// predates `--jobs`.
pub fn bars_from_json(doc: &Value) -> Result<Vec<Bar>, String> {
    let summaries = doc["summaries"].as_array().ok_or("no summaries")?;
    summaries
        .iter()
        .map(|s| {
            let pipeline = Pipeline::ALL
                .into_iter()
                .find(|p| serde_json::to_value(p).ok().as_ref() == Some(&s["pipeline"]))
                .ok_or_else(|| format!("unknown pipeline {}", s["pipeline"]))?;
            let rate = s["images_per_s"].as_f64().ok_or("no images_per_s")?;
            let jobs = s["jobs"].as_u64().map_or(1, |n| n as usize);
            Ok((pipeline, jobs, rate))
        })
        .collect()
}

/// Draws images/s per pipeline as horizontal bars (prepfs's views in one colour, their peers in
/// another), each labelled with its name and value, into the SVG file `path`.
pub fn plot(bars: &[Bar], path: &Path, title: &str) -> Result<(), String> {
    use plotters::prelude::*;
    let draw = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let top = bars.iter().map(|b| b.2).fold(0.0, f64::max).max(1.0) * 1.05;
    let rows = bars.len() as f64;
    let root = SVGBackend::new(path, (900, 60 + 44 * bars.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(30)
        .build_cartesian_2d(0.0..top, 0.0..rows)
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("images/s")
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, &(pipeline, jobs, rate)) in bars.iter().enumerate() {
        // The first bar at the top, as in the tables.
        let y = rows - 1.0 - i as f64;
        let colour = if pipeline.name().starts_with("prepfs") {
            RGBColor(120, 170, 220)
        } else {
            RGBColor(205, 205, 205)
        };
        chart
            .draw_series([Rectangle::new(
                [(0.0, y + 0.12), (rate, y + 0.88)],
                colour.filled(),
            )])
            .map_err(|e| draw(&e))?;
        chart
            .draw_series([Text::new(
                format!("{}{}: {rate:.0}", pipeline.name(), jobs_label(jobs)),
                (top * 0.01, y + 0.62),
                ("sans-serif", 15).into_font().color(&BLACK),
            )])
            .map_err(|e| draw(&e))?;
    }
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}

/// What a label adds for a run of several jobs (nothing for one, as before `--jobs`).
fn jobs_label(jobs: usize) -> String {
    if jobs > 1 {
        format!(", {jobs} jobs together")
    } else {
        String::new()
    }
}
