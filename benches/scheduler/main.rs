//! Scheduler benchmark: the PPO policy against the heuristic, a static CPU-only setup and
//! round-robin placement, in the simulator.
//!
//! Run with `cargo bench --features train --bench scheduler [-- OPTIONS]`. It trains a policy
//! with the default `TrainConfig` (random scenarios around the default calibration), or loads
//! one with `--policy FILE.json` (a serde_json `train::Trained`), then runs every policy on
//! cpu_bound, io_bound and load_shift, each with and without a GPU, for 5 seeds each, and prints
//! a markdown table: mean ± sd of the mean load latency (ms), stall share, the PPO/static and
//! PPO/heuristic latency ratios, and paired t-tests (df = 4; |t| > 2.776 is significant at the
//! two-sided 5% level). Target: PPO <= 0.7x static and no worse than the heuristic everywhere.
//!
//! `--real FILE [--calibration CAL.json] [--disk-calibration DISK.json] [--policy-file
//! POLICY.json]` instead checks the simulator against the real system: FILE is what
//! `cargo bench --bench adapt -- --save FILE` measured; the simulator runs the same scenarios
//! (those it models: (a) CPU load, (b) a slowed source) with the costs of CAL.json (`prepfs
//! policy calibrate`; the built-in figures without it) and the source figures of DISK.json for
//! the scenarios on the loop-mounted image, and prints its predicted images/s and load latency
//! per phase and mode beside the measured ones (see `real`).
//!
//! Options: `--policy FILE` load instead of training, `--save FILE` write the trained policy,
//! `--updates N` (default 1000, about a minute), `--seed S` (training seed, default 0),
//! `--steps N` evaluation intervals per run (default 150 = 30 s). Benchmarks report numbers;
//! they never assert.

use std::time::Instant;

mod real;

use prepfs::scheduler::sim::baselines::{self, Policy};
use prepfs::scheduler::sim::scenario::Scenario;
use prepfs::scheduler::train::{self, TrainConfig, Trained};

/// Evaluation seeds per scenario: five paired runs (df = 4).
const SEEDS: u64 = 5;
/// Two-sided 5% critical value of Student's t with 4 degrees of freedom.
const T_CRITICAL: f64 = 2.776;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn mean_sd(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Paired t statistic of `a - b`.
fn paired_t(a: &[f64], b: &[f64]) -> f64 {
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    let (mean, sd) = mean_sd(&d);
    if sd == 0.0 {
        if mean == 0.0 {
            0.0
        } else {
            mean.signum() * f64::INFINITY
        }
    } else {
        mean / (sd / (d.len() as f64).sqrt())
    }
}

fn main() {
    if let Some(path) = arg("--real") {
        return real::check(
            &path,
            arg("--calibration"),
            arg("--disk-calibration"),
            arg("--policy-file"),
        );
    }
    let steps: usize = arg("--steps").and_then(|s| s.parse().ok()).unwrap_or(150);
    let trained: Trained = match arg("--policy") {
        Some(path) => {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
        }
        None => {
            let cfg = TrainConfig {
                updates: arg("--updates")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(1000),
                seed: arg("--seed").and_then(|s| s.parse().ok()).unwrap_or(0),
                ..TrainConfig::default()
            };
            let t = Instant::now();
            let every = (cfg.updates / 20).max(1);
            let trained = train::train(&cfg, &mut |p| {
                if p.update % every == 0 || p.update + 1 == cfg.updates {
                    let f = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.2}"));
                    eprintln!(
                        "update {:4} steps {:7} reward {:>7} heuristic {:>7} vloss {:.3} entropy {:.2} kl {:.4} ({:.0}s)",
                        p.update,
                        p.env_steps,
                        f(p.episode_reward),
                        f(p.heuristic_reward),
                        p.stats.value_loss,
                        p.stats.entropy,
                        p.stats.approx_kl,
                        t.elapsed().as_secs_f64()
                    );
                }
            });
            let secs = t.elapsed().as_secs_f64();
            let env_steps = trained.curve.last().map_or(0, |p| p.env_steps);
            eprintln!(
                "trained {} updates, {env_steps} env steps in {secs:.0} s ({:.0} steps/s incl. updates and heuristic reference runs)",
                cfg.updates,
                env_steps as f64 / secs
            );
            if let Some(path) = arg("--save") {
                let json = serde_json::to_string(&trained).unwrap_or_default();
                std::fs::write(&path, json).unwrap_or_else(|e| panic!("{path}: {e}"));
            }
            trained
        }
    };
    println!(
        "| scenario | PPO ms | heuristic ms | static ms | round-robin ms | PPO stall | heur. stall | static stall | PPO/static | PPO/heur. | t vs heur. | t vs static |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let shipped = prepfs::scheduler::artifact::Payload::shipped()
        .is_ok_and(|p| p.network == trained.network && p.normalisation == trained.normalisation);
    eprintln!("this policy is the shipped policy/default.json: {shipped}");
    let ppo = train::greedy(&trained.network, &trained.normalisation);
    for base in [
        Scenario::cpu_bound(),
        Scenario::io_bound(),
        Scenario::load_shift(),
    ] {
        for gpu in [false, true] {
            let s = base.clone().with_gpu(gpu);
            let heuristic = baselines::heuristic_policy(&s);
            let round_robin = baselines::round_robin(&s);
            let policies: [&Policy; 4] = [&ppo, &heuristic, &baselines::static_cpu, &round_robin];
            let runs: Vec<Vec<train::Evaluation>> = policies
                .iter()
                .map(|p| {
                    (0..SEEDS)
                        .map(|seed| train::evaluate(*p, &s, 1000 + seed, steps))
                        .collect()
                })
                .collect();
            let ms: Vec<Vec<f64>> = runs
                .iter()
                .map(|r| r.iter().map(|e| e.mean_latency_s * 1e3).collect())
                .collect();
            let stall =
                |i: usize| mean_sd(&runs[i].iter().map(|e| e.stall_share).collect::<Vec<_>>()).0;
            let cell = |i: usize| {
                let (m, sd) = mean_sd(&ms[i]);
                format!("{m:.2} ± {sd:.2}")
            };
            let t = |j: usize| {
                let t = paired_t(&ms[0], &ms[j]);
                format!("{t:.2}{}", if t.abs() > T_CRITICAL { " *" } else { "" })
            };
            let (p, h, st) = (mean_sd(&ms[0]).0, mean_sd(&ms[1]).0, mean_sd(&ms[2]).0);
            println!(
                "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {} | {} |",
                s.name,
                cell(0),
                cell(1),
                cell(2),
                cell(3),
                stall(0),
                stall(1),
                stall(2),
                p / st,
                p / h,
                t(1),
                t(2)
            );
        }
    }
    println!(
        "\nt: paired over {SEEDS} seeds, PPO minus the other (negative = PPO faster); * = |t| > {T_CRITICAL} (two-sided 5%, df = 4)."
    );
}
