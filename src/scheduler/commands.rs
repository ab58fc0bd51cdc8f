//! The `prepfs policy` subcommands: `calibrate` (measure this machine for the simulator),
//! `train` (PPO in the simulator, writing a policy file, its learning curve as CSV and SVG) and
//! `show` (check a policy file and print where it came from).
//!
//! Owns: turning those requests into files and one-line errors; in a build without the `train`
//! feature, `calibrate` and `train` answer `WITHOUT_TRAIN`. Must never touch a mount.

use std::path::{Path, PathBuf};

#[cfg(feature = "train")]
use plotters::prelude::*;

use super::artifact::Payload;
#[cfg(feature = "train")]
use super::{
    artifact::Metadata,
    calibrate::calibrate,
    sim::calibration::Calibration,
    train::{CurvePoint, TrainConfig, train},
};

/// `prepfs policy calibrate`.
#[cfg(feature = "train")]
pub fn run_calibrate(dataset: Option<&Path>, out: &Path) -> Result<(), String> {
    let c = calibrate(dataset)?;
    let text = serde_json::to_string_pretty(&c).map_err(|e| e.to_string())? + "\n";
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    println!(
        "decode {:.3} ms, augment {:.3} ms, a render that keeps no pixels {:.3} ms, the read path {:.3} ms per image per core; lz4 x{:.2}, zstd-3 x{:.2} on pixels; source {:.0} MB/s, {:.2} ms first byte",
        c.decode_s * 1e3,
        c.augment_s * 1e3,
        c.render_s.unwrap_or(0.0) * 1e3,
        c.deliver_s.unwrap_or(0.0) * 1e3,
        c.lz4.pixel_ratio,
        c.zstd3.pixel_ratio,
        c.source_bytes_per_s / 1e6,
        c.source_latency_s * 1e3
    );
    println!("wrote {}", out.display());
    Ok(())
}

/// What `prepfs policy train` was asked.
#[derive(Debug, Clone)]
pub struct TrainRequest {
    /// Calibration file (default: the built-in figures).
    pub calibration: Option<PathBuf>,
    /// PPO updates.
    pub updates: usize,
    /// Seed of everything.
    pub seed: u64,
    /// Policy file to write.
    pub out: PathBuf,
    /// The command line, recorded in the policy.
    pub command: String,
}

/// `prepfs policy calibrate` in a build without the trainer: one line, no file.
#[cfg(not(feature = "train"))]
pub fn run_calibrate(_dataset: Option<&Path>, _out: &Path) -> Result<(), String> {
    Err(super::WITHOUT_TRAIN.to_owned())
}

/// `prepfs policy train`: trains, writes the policy, `<out>.curve.csv` and `<out>.curve.svg`.
#[cfg(feature = "train")]
pub fn run_train(request: &TrainRequest) -> Result<(), String> {
    let calibration: Calibration = match &request.calibration {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Calibration::default(),
    };
    let cfg = TrainConfig {
        updates: request.updates,
        seed: request.seed,
        calibration,
        ..TrainConfig::default()
    };
    let bar = indicatif::ProgressBar::new(cfg.updates as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} updates {msg} [{elapsed}]")
            .map_err(|e| e.to_string())?,
    );
    let started = std::time::Instant::now();
    let trained = train(&cfg, &mut |p: &CurvePoint| {
        bar.inc(1);
        if let (Some(ppo), Some(h)) = (p.episode_reward, p.heuristic_reward) {
            bar.set_message(format!("reward {ppo:.2} (heuristic {h:.2})"));
        }
    });
    bar.finish();
    let steps = trained.curve.last().map_or(0, |p| p.env_steps) as u64;
    let payload = Payload {
        network: trained.network,
        normalisation: trained.normalisation,
        reward_scale: trained.reward_scale,
        metadata: Metadata {
            command: request.command.clone(),
            prepfs_version: env!("CARGO_PKG_VERSION").to_owned(),
            reward: cfg.reward,
            training: serde_json::to_value(&cfg).map_err(|e| e.to_string())?,
            steps,
        },
    };
    payload
        .save(&request.out)
        .map_err(|e| format!("{}: {e}", request.out.display()))?;
    let csv = request.out.with_extension("curve.csv");
    write_curve(&trained.curve, &csv)?;
    let svg = request.out.with_extension("curve.svg");
    plot_curve(&trained.curve, &svg)?;
    println!(
        "trained {} updates ({steps} simulated decisions) in {:.0} s; wrote {}, {}, {}",
        cfg.updates,
        started.elapsed().as_secs_f64(),
        request.out.display(),
        csv.display(),
        svg.display()
    );
    Ok(())
}

/// `prepfs policy train` in a build without the trainer: one line, no file.
#[cfg(not(feature = "train"))]
pub fn run_train(_request: &TrainRequest) -> Result<(), String> {
    Err(super::WITHOUT_TRAIN.to_owned())
}

#[cfg(feature = "train")]
fn write_curve(curve: &[CurvePoint], path: &Path) -> Result<(), String> {
    let mut text = String::from(
        "update,env_steps,episode_reward,heuristic_reward,policy_loss,value_loss,entropy,approx_kl\n",
    );
    let opt = |x: Option<f64>| x.map(|v| format!("{v:.4}")).unwrap_or_default();
    for p in curve {
        text += &format!(
            "{},{},{},{},{:.5},{:.5},{:.4},{:.5}\n",
            p.update,
            p.env_steps,
            opt(p.episode_reward),
            opt(p.heuristic_reward),
            p.stats.policy_loss,
            p.stats.value_loss,
            p.stats.entropy,
            p.stats.approx_kl
        );
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Mean of each run of `window` points that have a value (the curve is noisy per update).
#[cfg(feature = "train")]
fn smoothed(curve: &[CurvePoint], value: impl Fn(&CurvePoint) -> Option<f64>) -> Vec<(f64, f64)> {
    const WINDOW: usize = 10;
    let points: Vec<(f64, f64)> = curve
        .iter()
        .filter_map(|p| Some((p.env_steps as f64, value(p)?)))
        .collect();
    points
        .windows(WINDOW.min(points.len()).max(1))
        .map(|w| {
            let n = w.len() as f64;
            (w[w.len() - 1].0, w.iter().map(|p| p.1).sum::<f64>() / n)
        })
        .collect()
}

#[cfg(feature = "train")]
fn plot_curve(curve: &[CurvePoint], path: &Path) -> Result<(), String> {
    let ppo = smoothed(curve, |p| p.episode_reward);
    let heuristic = smoothed(curve, |p| p.heuristic_reward);
    let all = ppo.iter().chain(&heuristic);
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    let x_max = curve.last().map_or(1.0, |p| p.env_steps as f64).max(1.0);
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (-1.0, 0.0) };
    let pad = ((hi - lo) * 0.1).max(1e-3);
    let draw = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "PPO training in the simulator: reward per decision",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, (lo - pad)..(hi + pad))
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc("simulated decisions")
        .y_desc("mean reward (10-update window)")
        .draw()
        .map_err(|e| draw(&e))?;
    for (points, label, colour) in [
        (ppo, "PPO policy (sampling)", &BLUE),
        (heuristic, "heuristic, same episodes", &RED),
    ] {
        let style = ShapeStyle::from(colour).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(|e| draw(&e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))
}

/// `prepfs policy show [FILE]`: checks the file (or the shipped policy) and prints its origin.
pub fn run_show(file: Option<&Path>) -> Result<(), String> {
    let (payload, name) = match file {
        Some(path) => (
            Payload::load(path).map_err(|e| format!("{}: {e}", path.display()))?,
            path.display().to_string(),
        ),
        None => (
            Payload::shipped().map_err(|e| format!("shipped policy: {e}"))?,
            "shipped policy".to_owned(),
        ),
    };
    let m = &payload.metadata;
    println!(
        "{name}: valid (schema {:08x})",
        super::state::SCHEMA_VERSION
    );
    println!("  trained by:  {}", m.command);
    println!("  prepfs:      {}", m.prepfs_version);
    println!("  decisions:   {}", m.steps);
    println!(
        "  reward:      alpha {} per ms, beta {}, stall {}",
        m.reward.alpha, m.reward.beta, m.reward.stall
    );
    Ok(())
}
