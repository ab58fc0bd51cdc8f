//! What the epochs benchmark tells: the JSON results file, the SVG plots, the Markdown tables
//! appended to BENCHMARKS.md, and the targets of issues 3 and 4 evaluated from the side-by-side
//! runs.
//!
//! Owns presentation only: every number comes from the runs it is given. Must never assert:
//! a missed target is reported as missed, and the run still succeeds.

use std::path::Path;
use std::process::Command;

use plotters::prelude::*;
use serde::Serialize;
use serde_json::json;

use crate::dataset::Manifest;
use crate::prefetch::PrefetchRun;
use crate::views::{Pipeline, ViewRun};
use crate::{Options, Reader, Run, Side};

/// One target, evaluated.
#[derive(Debug, Serialize)]
pub struct Target {
    pub name: String,
    pub measured: f64,
    pub bound: String,
    pub met: bool,
}

/// The median of `values` (0 when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn find(runs: &[Run], reader: Reader, side: Side) -> Option<&Run> {
    runs.iter()
        .find(|r| r.setup.reader == reader && r.side == side)
}

/// Median over epochs 2.. of `f`.
fn warm(run: &Run, f: impl Fn(&crate::Epoch) -> f64) -> f64 {
    median(run.epochs.iter().skip(1).map(f).collect())
}

fn cold(run: &Run, f: impl Fn(&crate::Epoch) -> f64) -> f64 {
    run.epochs.first().map_or(0.0, f)
}

/// Median over epochs 2.. of a views run.
fn warm_view(run: &ViewRun, f: impl Fn(&crate::views::ViewEpoch) -> f64) -> f64 {
    median(run.epochs.iter().skip(1).map(f).collect())
}

fn find_view(view_runs: &[ViewRun], pipeline: Pipeline) -> Option<&ViewRun> {
    view_runs.iter().find(|r| r.pipeline == pipeline)
}

/// The targets, for the readers and pipelines that ran.
pub fn targets(runs: &[Run], view_runs: &[ViewRun]) -> Vec<Target> {
    let mut out = Vec::new();
    if let (Some(stock), Some(view)) = (
        find_view(view_runs, Pipeline::Stock),
        find_view(view_runs, Pipeline::ViewFloat32),
    ) {
        let ratio =
            warm_view(view, |e| e.items_per_s) / warm_view(stock, |e| e.items_per_s).max(1e-9);
        out.push(Target {
            name: "views, epochs 2+: float32 view images/s / stock PyTorch".into(),
            measured: ratio,
            bound: ">= 2.50".into(),
            met: ratio >= 2.5,
        });
        if let Some(decoded) = find_view(view_runs, Pipeline::ViewFloat32Decoded) {
            let ratio = warm_view(decoded, |e| e.items_per_s)
                / warm_view(stock, |e| e.items_per_s).max(1e-9);
            out.push(Target {
                name: "views, epochs 2+: float32 view with decoded cache / stock PyTorch".into(),
                measured: ratio,
                bound: ">= 2.50".into(),
                met: ratio >= 2.5,
            });
        }
    }
    if let (Some(pc), Some(pf)) = (
        find(runs, Reader::Plain, Side::PageCache),
        find(runs, Reader::Plain, Side::Prepfs),
    ) {
        let optimum = pf.optimum_misses().unwrap_or(0) as f64;
        let ratio = warm(pf, |e| e.device_bytes as f64) / optimum.max(1.0);
        out.push(Target {
            name: format!(
                "plain, epochs 2+: prepfs device bytes / (D - C) (page cache: {:.2})",
                warm(pc, |e| e.device_bytes as f64) / optimum.max(1.0)
            ),
            measured: ratio,
            bound: "<= 1.05".into(),
            met: ratio <= 1.05,
        });
        let ratio = warm(pf, |e| e.seconds) / warm(pc, |e| e.seconds).max(1e-9);
        out.push(Target {
            name: "plain, epochs 2+: prepfs epoch time / page cache".into(),
            measured: ratio,
            bound: "<= 0.75".into(),
            met: ratio <= 0.75,
        });
    }
    if let (Some(pc), Some(pf)) = (
        find(runs, Reader::Torch, Side::PageCache),
        find(runs, Reader::Torch, Side::Prepfs),
    ) {
        let ratio = warm(pf, |e| e.items_per_s) / warm(pc, |e| e.items_per_s).max(1e-9);
        out.push(Target {
            name: "torch, epochs 2+: prepfs images/s / page cache".into(),
            measured: ratio,
            bound: ">= 1.00".into(),
            met: ratio >= 1.0,
        });
    }
    for reader in [Reader::Plain, Reader::Torch, Reader::Shards] {
        if let (Some(pc), Some(pf)) = (
            find(runs, reader, Side::PageCache),
            find(runs, reader, Side::Prepfs),
        ) {
            let ratio = cold(pf, |e| e.seconds) / cold(pc, |e| e.seconds).max(1e-9);
            out.push(Target {
                name: format!(
                    "{}, epoch 1 (cold): prepfs epoch time / page cache",
                    reader_name(reader)
                ),
                measured: ratio,
                bound: "<= 1.10".into(),
                met: ratio <= 1.10,
            });
        }
    }
    out
}

fn reader_name(reader: Reader) -> &'static str {
    match reader {
        Reader::Plain => "plain",
        Reader::Torch => "torch",
        Reader::Shards => "shards",
    }
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::PageCache => "page cache",
        Side::Prepfs => "prepfs",
    }
}

fn shell(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// "N vCPU (model), M GiB RAM, kernel K".
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    format!(
        "{cpus} vCPU ({model}), {:.0} GiB RAM, kernel {}",
        mem_kib as f64 / (1 << 20) as f64,
        shell("uname -r")
    )
}

/// Writes results, plots and (full runs) the BENCHMARKS.md section; returns a summary to print.
pub fn write(
    opts: &Options,
    manifest: &Manifest,
    runs: &[Run],
    view_runs: &[ViewRun],
    prefetch_runs: &[PrefetchRun],
) -> Result<String, String> {
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let date = shell("date -u +%Y-%m-%d");
    let commit = shell("git -C \"$CARGO_MANIFEST_DIR\" rev-parse --short HEAD 2>/dev/null");
    let machine = machine();
    let mut targets = targets(runs, view_runs);
    targets.extend(crate::prefetch::targets(prefetch_runs, opts.read_bps));
    let results = json!({
        "date": date,
        "commit": commit,
        "machine": machine,
        "command": command(opts),
        "options": opts,
        "dataset": manifest,
        "runs": runs,
        "views": view_runs,
        "prefetch": prefetch_runs,
        "targets": targets,
    });
    let json_path = opts.out.join("epochs.json");
    std::fs::write(
        &json_path,
        serde_json::to_vec_pretty(&results).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", json_path.display()))?;
    plot(
        runs,
        &opts.out.join("epoch_seconds.svg"),
        "Epoch time (s)",
        |e| e.seconds,
    )?;
    plot(
        runs,
        &opts.out.join("device_mb.svg"),
        "Read from the slow device per epoch (MB)",
        |e| e.device_bytes as f64 / 1e6,
    )?;
    let mut md = markdown(opts, manifest, runs, &date, &commit, &machine);
    md.push_str(&views_markdown(view_runs));
    md.push_str(&crate::prefetch::markdown(prefetch_runs, opts.read_bps));
    md.push_str(&targets_markdown(&targets));
    if !opts.quick {
        let mut text = std::fs::read_to_string(crate::BENCHMARKS_MD).unwrap_or_default();
        text.push_str(&md);
        std::fs::write(crate::BENCHMARKS_MD, text).map_err(|e| format!("BENCHMARKS.md: {e}"))?;
    }
    Ok(format!(
        "{md}\nResults: {} (plots beside it)",
        json_path.display()
    ))
}

fn command(opts: &Options) -> String {
    if opts.args.is_empty() {
        "cargo bench --bench epochs".into()
    } else {
        format!("cargo bench --bench epochs -- {}", opts.args)
    }
}

fn markdown(
    opts: &Options,
    manifest: &Manifest,
    runs: &[Run],
    date: &str,
    commit: &str,
    machine: &str,
) -> String {
    let mb = |b: f64| b / 1e6;
    let mut md = format!(
        "\n### Epochs, {date} (commit {commit})\n\n\
         Command: `{}` (as root). Machine: {machine}.\n\n\
         Dataset: {} JPEGs, D = {:.0} MB; {} tar shards, {:.0} MB. Slow storage: ext4 image on a \
         loop device (direct I/O), reads throttled to {} MB/s and {} IOPS by the blkio cgroup; \
         page cache dropped before each run. Memory: one cgroup per run holding the reader (and \
         the prepfs daemon), limit = M + the reader's measured working set, M = {:.2} x D; prepfs \
         --cache-mem = M - the daemon's measured working set - {} MiB kept free for the kernel's side of reads in flight, at most \
         the limit less prepfs's 64 MiB headroom, of which the RAM tier gets C (the rest is prepfs's working memory for reads in \
         flight; no prefetch staging). Epochs 2+ are medians.\n\n",
        command(opts),
        manifest.files,
        mb(manifest.file_bytes as f64),
        manifest.shards,
        mb(manifest.shard_bytes as f64),
        opts.read_bps / 1_000_000,
        opts.read_iops,
        opts.mem_ratio,
        crate::IN_FLIGHT_HEADROOM >> 20,
    );
    if !runs.is_empty() {
        md.push_str(
            "| reader | side | limit MB | --cache-mem MB | C MB | D-C MB | epoch 1 s | epochs 2+ s | epoch 1 items/s | epochs 2+ items/s | device MB (reads) epoch 1 | device MB (reads) epochs 2+ | prepfs misses MB epochs 2+ |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
    }
    for run in runs {
        let s = &run.setup;
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {} | {} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} ({:.0}) | {:.0} ({:.0}) | {} |\n",
            reader_name(s.reader),
            side_name(run.side),
            mb(s.memory_limit as f64),
            mb(s.cache_mem as f64),
            run.cache.map_or("-".into(), |c| format!("{:.0}", mb(c as f64))),
            run.optimum_misses()
                .map_or("-".into(), |m| format!("{:.0}", mb(m as f64))),
            cold(run, |e| e.seconds),
            warm(run, |e| e.seconds),
            cold(run, |e| e.items_per_s),
            warm(run, |e| e.items_per_s),
            mb(cold(run, |e| e.device_bytes as f64)),
            cold(run, |e| e.device_reads as f64),
            mb(warm(run, |e| e.device_bytes as f64)),
            warm(run, |e| e.device_reads as f64),
            if run.side == Side::Prepfs {
                format!("{:.0}", mb(warm(run, |e| e.prepfs_miss_bytes.unwrap_or(0) as f64)))
            } else {
                "-".into()
            },
        ));
    }
    md
}

fn targets_markdown(targets: &[Target]) -> String {
    let mut md = String::from("\n| target | measured | bound | met |\n|---|---:|---|---|\n");
    for t in targets {
        md.push_str(&format!(
            "| {} | {:.2} | {} | {} |\n",
            t.name,
            t.measured,
            t.bound,
            if t.met { "yes" } else { "**no**" }
        ));
    }
    md
}

/// The views comparison table (empty when it did not run).
fn views_markdown(view_runs: &[ViewRun]) -> String {
    let Some(stock) = find_view(view_runs, Pipeline::Stock) else {
        return String::new();
    };
    let stock_rate = warm_view(stock, |e| e.items_per_s).max(1e-9);
    let mut md = String::from(
        "\nViews: the stock PyTorch pipeline vs DatasetFolder + np.load over a prepfs view, \
         DataLoader(batch 32, shuffle, num_workers=2) on both, same images and cores, no \
         throttling, caches warm from epoch 2 (prepfs --cache-mem holds the dataset). CPU is \
         everything the pipeline ran (loader, workers, daemon), from its cpuacct cgroup. Epochs \
         2+ are medians; latencies are the daemon's p50 over the run.\n\n\
         | pipeline | images/s | vs stock | CPU ms/image | decode p50 ms | transform p50 ms | render p50 ms |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in view_runs {
        let rate = warm_view(run, |e| e.items_per_s);
        let cpu = warm_view(run, |e| e.cpu_seconds * 1e3 / e.items.max(1) as f64);
        let latency = |name: &str| {
            run.epochs
                .last()
                .and_then(|e| e.view_stats.as_ref())
                .and_then(|s| s[name]["p50"].as_f64())
                .map_or("-".into(), |us| format!("{:.2}", us / 1e3))
        };
        md.push_str(&format!(
            "| {}{} | {rate:.0} | {:.2} | {cpu:.2} | {} | {} | {} |\n",
            run.pipeline.name(),
            run.spec.map_or(String::new(), |s| format!(" `{s}`")),
            rate / stock_rate,
            latency("decode_latency_us"),
            latency("transform_latency_us"),
            latency("render_latency_us"),
        ));
    }
    md
}

/// A line per (reader, side) of `value` against the epoch number.
fn plot(
    runs: &[Run],
    path: &Path,
    title: &str,
    value: impl Fn(&crate::Epoch) -> f64,
) -> Result<(), String> {
    let epochs = runs.iter().map(|r| r.epochs.len()).max().unwrap_or(1) as f64;
    let top = runs
        .iter()
        .flat_map(|r| r.epochs.iter().map(&value))
        .fold(0.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..epochs + 0.5, 0.0..top.max(1e-9))
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .x_labels(epochs as usize)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, run) in runs.iter().enumerate() {
        let colour = Palette99::pick(i / 2 * 2 + usize::from(run.side == Side::Prepfs));
        let points: Vec<(f64, f64)> = run
            .epochs
            .iter()
            .map(|e| (f64::from(e.epoch), value(e)))
            .collect();
        let style =
            ShapeStyle::from(&colour).stroke_width(if run.side == Side::Prepfs { 3 } else { 1 });
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(|e| draw(&e))?
            .label(format!(
                "{} · {}",
                reader_name(run.setup.reader),
                side_name(run.side)
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, style.filled())),
            )
            .map_err(|e| draw(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}
