//! What the epochs benchmark tells: the JSON results files, the SVG plots, the Markdown tables
//! appended to docs/BENCHMARKS-HISTORY.md (for runs of this checkout's build), and the targets of issue 3 evaluated from the
//! side-by-side runs (with those of the views comparison, its runs of several jobs and prefetch,
//! which their own modules evaluate).
//!
//! Owns presentation only: every number comes from the runs it is given. Must never assert:
//! a missed target is reported as missed, and the run still succeeds.

use std::path::{Path, PathBuf};
use std::process::Command;

use plotters::prelude::*;
use serde_json::json;

use crate::dataset::Manifest;
use crate::prefetch::PrefetchRun;
use crate::target::{Target, median};
use crate::views::ViewRun;
use crate::{Options, Reader, Run, Side};

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

/// The targets, for the readers that ran.
pub fn targets(runs: &[Run]) -> Vec<Target> {
    let mut out = Vec::new();
    if let (Some(pc), Some(pf)) = (
        find(runs, Reader::Plain, Side::PageCache),
        find(runs, Reader::Plain, Side::Prepfs),
    ) {
        // Device bytes per epoch 2+ against a never-evict optimum, the page cache's beside them.
        let bytes_over = |optimum: u64, of: &str, bound: f64| {
            let per = |run: &Run| warm(run, |e| e.device_bytes as f64) / (optimum as f64).max(1.0);
            Target {
                name: format!(
                    "plain, epochs 2+: prepfs device bytes / ({of}) (page cache: {:.2})",
                    per(pc)
                ),
                measured: per(pf),
                bound: format!("<= {bound:.2}"),
                met: per(pf) <= bound,
            }
        };
        out.push(bytes_over(pf.optimum_misses().unwrap_or(0), "D - C", 1.05));
        // Issue 38: the whole budget serves a shuffled dataset twice the memory.
        let budget_optimum = pf.setup.data_bytes.saturating_sub(pf.setup.cache_mem);
        out.push(bytes_over(budget_optimum, "D - --cache-mem", 1.10));
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

/// Writes results, plots and (full runs) the docs/BENCHMARKS-HISTORY.md section; returns a
/// summary to print.
/// `main`: the dataset of the readers and prefetch runs, when they ran; `views`: the views
/// comparison's dataset and runs, when it ran.
pub fn write(
    opts: &Options,
    main: Option<&Manifest>,
    runs: &[Run],
    views: Option<(&Manifest, &[ViewRun])>,
    prefetch_runs: &[PrefetchRun],
) -> Result<String, String> {
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let date = shell("date -u +%Y-%m-%d");
    // A run of uncommitted changes says so: its numbers belong to no commit. A run of another
    // build (`PREPFS_BENCH_BIN`) names that build instead, and is not added to the history,
    // whose sections each name the commit they measured.
    let binary = crate::binary::prepfs();
    let own_build = binary == Path::new(env!("CARGO_BIN_EXE_prepfs"));
    let commit = if own_build {
        shell(
            "cd \"$CARGO_MANIFEST_DIR\" && git rev-parse --short HEAD 2>/dev/null && \
             { git diff --quiet HEAD 2>/dev/null || echo +uncommitted; }",
        )
        .replace('\n', "")
    } else {
        format!("build {}", binary.display())
    };
    let label = if own_build {
        format!("commit {commit}")
    } else {
        commit.clone()
    };
    let machine = machine();
    let header = json!({
        "date": date,
        "commit": commit,
        "machine": machine,
        "command": command(opts),
        "options": opts,
    });
    // The run's header first, then `body`'s keys.
    let write_json = |name: &str, body: serde_json::Value| -> Result<PathBuf, String> {
        let mut all = header.clone();
        if let (Some(all), Some(body)) = (all.as_object_mut(), body.as_object()) {
            all.extend(body.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let path = opts.out.join(name);
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&all).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    };
    let mut md = format!(
        "\n### Epochs, {date} ({label})\n\n\
         Command: `{}` (as root). Machine: {machine}.\n",
        command(opts)
    );
    let mut targets = Vec::new();
    let mut written = Vec::new();
    if let Some(manifest) = main {
        targets.extend(self::targets(runs));
        targets.extend(crate::prefetch::targets(prefetch_runs, opts.read_bps));
        written.push(write_json(
            "epochs.json",
            json!({
                "dataset": manifest,
                "runs": runs,
                "prefetch": prefetch_runs,
                "targets": targets,
            }),
        )?);
        if !runs.is_empty() {
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
        }
        md.push_str(&markdown(opts, manifest, runs));
        md.push_str(&crate::prefetch::markdown(prefetch_runs, opts.read_bps));
    }
    if let Some((manifest, view_runs)) = views {
        let summaries = crate::views_report::summarize(view_runs);
        let mut view_targets = crate::views_report::targets(&summaries);
        view_targets.extend(crate::jobs_report::targets(&summaries, manifest.files));
        written.push(write_json(
            "views.json",
            json!({
                "dataset": manifest,
                "summaries": summaries,
                "runs": view_runs,
                "targets": view_targets,
            }),
        )?);
        crate::views_report::plot(
            &crate::views_report::bars(&summaries),
            &opts.out.join(crate::views_report::PLOT),
            crate::views_report::PLOT_TITLE,
        )?;
        md.push_str(&crate::views_report::markdown(
            manifest,
            view_runs,
            &summaries,
            opts.workers,
            opts.step_ms,
        ));
        md.push_str(&crate::jobs_report::markdown(
            &summaries,
            manifest.files,
            opts.workers,
        ));
        targets.extend(view_targets);
    }
    md.push_str(&targets_markdown(&targets));
    if !opts.quick && own_build {
        let mut text = std::fs::read_to_string(crate::BENCHMARKS_HISTORY_MD).unwrap_or_default();
        text.push_str(&md);
        std::fs::write(crate::BENCHMARKS_HISTORY_MD, text)
            .map_err(|e| format!("docs/BENCHMARKS-HISTORY.md: {e}"))?;
    }
    let written: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    Ok(format!(
        "{md}\nResults: {} (plots beside them)",
        written.join(", ")
    ))
}

fn command(opts: &Options) -> String {
    if opts.args.is_empty() {
        "cargo bench --bench epochs".into()
    } else {
        format!("cargo bench --bench epochs -- {}", opts.args)
    }
}

/// The readers' dataset, setup and table.
fn markdown(opts: &Options, manifest: &Manifest, runs: &[Run]) -> String {
    let mb = |b: f64| b / 1e6;
    let mut md = format!(
        "\nDataset: {} JPEGs, D = {:.0} MB; {} tar shards, {:.0} MB. Slow storage: ext4 image on a \
         loop device (direct I/O), reads throttled to {} MB/s and {} IOPS by the blkio cgroup; \
         page cache dropped before each run. Memory: one cgroup per run holding the reader (and \
         the prepfs daemon), limit = M + the reader's measured working set, M = {:.2} x D; prepfs \
         --cache-mem = M - the daemon's measured working set - {} MiB kept free for the kernel's side of reads in flight, at most \
         the limit less prepfs's 64 MiB headroom, of which the RAM tier gets C (the rest is prepfs's working memory for \
         reads in flight and prefetch's staging buffer, a default mount's). Epochs 2+ are medians.\n\n",
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
