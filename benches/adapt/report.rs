//! What the evaluation prints: per scenario, each mode's figures per phase (medians over the
//! runs), and the paired comparisons the criteria rest on (policy against heuristic,
//! the heuristic against itself for the noise floor, load latency against static), with a
//! Student's t-test over the runs' log ratios.
//!
//! Owns the statistics (percentiles, the paired t-test and its p-value) and the tables. Must never
//! run anything: it reads the results main.rs gathered.

use crate::measure::median;

/// One phase of one run.
#[derive(Debug, Default, Clone)]
pub struct Phase {
    pub images_per_s: f64,
    /// Load latency percentiles of the measured job's reads, in milliseconds.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub stall_s: f64,
    /// Seconds from the phase's start to the scheduler's first action that differs from the
    /// action in force when it started (`None`: unchanged).
    pub reacted_s: Option<f64>,
    /// Share of the phase's stats polls in which the guard let the policy act.
    pub policy_share: Option<f64>,
    /// Reads of the measured job that failed (not in the figures above).
    pub failed_reads: u64,
    /// Times memory pressure began in the phase, and the cached bytes given back under it
    /// (`memory.pressure_events`, `memory.given_back_bytes`): a budget that keeps refilling
    /// what it gave back shows as many events.
    pub pressure_events: u64,
    pub given_back_bytes: u64,
    /// `memory.held_back_bytes` at the phase's end: the slices admission may not fill yet.
    pub held_back_bytes: u64,
    /// What the source's device read per second in the phase (the disk scenarios): whether a
    /// throttle binds.
    pub device_mb_s: Option<f64>,
    /// What prepfs read from the source per second (`source.bytes_read`): beside the device's,
    /// the share the kernel's page cache served (a mode may win (b) only by warming it).
    pub source_mb_s: f64,
    /// Each knob's option most in force in the phase, with its share of the decisions
    /// (`scheduler.histogram`), e.g. `codec=zstd 80%`.
    pub choices: String,
    /// The RAM tier's blocks per codec at the phase's end and the decoded pixels it holds
    /// (`cache.blocks_by_codec`, `cache.decoded.logical_bytes`), and the CPU the phase spent
    /// unpacking entries on hits: what packing costs the renders.
    pub stored: String,
}

/// One run of one mode in one scenario.
pub struct Run {
    pub phases: Vec<Phase>,
    /// The run's `--cache-mem`, the cache's slice of it at the end (`memory.cache.slice_bytes`)
    /// and the view's files: what the simulator is given to predict it.
    pub cache_mem: u64,
    pub cache_slice: u64,
    pub files: usize,
    /// The scheduler's and telemetry's threads' CPU over the run, in % of a core.
    pub control_cpu_pct: f64,
    /// Whether the daemon was gone before the run's end (killed).
    pub killed: bool,
}

/// The `q` quantile (0..=1) of `v`, nearest rank; 0 for no samples.
pub fn quantile(v: &mut [f32], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f32::total_cmp);
    let at = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    f64::from(v[at])
}

/// A paired comparison of `a` against `b` over runs: the geometric mean of a/b, the t statistic
/// of the log ratios, its two-sided p-value, and the runs' standard deviation of the log ratio.
pub struct Paired {
    pub ratio: f64,
    pub t: f64,
    pub p: f64,
    pub sd: f64,
    pub n: usize,
}

pub fn paired(a: &[f64], b: &[f64]) -> Option<Paired> {
    let d: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| **x > 0.0 && **y > 0.0)
        .map(|(x, y)| (x / y).ln())
        .collect();
    let n = d.len();
    if n < 2 {
        return None;
    }
    let mean = d.iter().sum::<f64>() / n as f64;
    let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let t = if sd > 0.0 {
        mean / (sd / (n as f64).sqrt())
    } else if mean == 0.0 {
        0.0
    } else {
        f64::INFINITY.copysign(mean)
    };
    Some(Paired {
        ratio: mean.exp(),
        t,
        p: two_sided_p(t, (n - 1) as f64),
        sd,
        n,
    })
}

/// P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2).
fn two_sided_p(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return 0.0;
    }
    incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
}

/// The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
/// Lentz), using the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where that converges faster.
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - incomplete_beta(b, a, 1.0 - x);
    }
    let ln_front = a * x.ln() + b * (1.0 - x).ln() + ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b);
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    d = 1.0 / if d.abs() < tiny { tiny } else { d };
    let mut f = d;
    for m in 1..300 {
        let m = f64::from(m);
        for numerator in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + numerator * d;
            d = 1.0 / if d.abs() < tiny { tiny } else { d };
            c = 1.0 + numerator / c;
            c = if c.abs() < tiny { tiny } else { c };
            f *= c * d;
        }
        if (c * d - 1.0).abs() < 1e-12 {
            break;
        }
    }
    (ln_front.exp() * f / a).clamp(0.0, 1.0)
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = C[0]
        + C[1..]
            .iter()
            .enumerate()
            .map(|(i, c)| c / (x + i as f64 + 1.0))
            .sum::<f64>();
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The t value a two-sided test at p < 0.05 needs with `df` degrees of freedom (bisection on
/// `two_sided_p`).
fn t_critical(df: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 100.0);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if two_sided_p(mid, df) > 0.05 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// Checks the t-test against tabulated values; fails the bench (not silently) if it drifts.
pub fn self_check() -> Result<(), String> {
    for (t, df, p) in [
        (2.776_f64, 4.0, 0.05),
        (4.604, 4.0, 0.01),
        (2.228, 10.0, 0.05),
    ] {
        let got = two_sided_p(t, df);
        if (got - p).abs() > 0.0005 {
            return Err(format!(
                "t-test self-check: p({t}, df {df}) = {got}, table {p}"
            ));
        }
    }
    Ok(())
}

/// Prints one scenario's tables: figures per mode, then the paired comparisons.
pub fn print_scenario(title: &str, phases: [&str; 3], results: &[(&str, Vec<Run>)]) {
    println!("\n### {title}\n");
    println!(
        "| mode | {} | reacted after (s), per change | policy acting, per phase | scheduler + telemetry CPU | failed reads; daemon killed | pressure events; MB given back, per phase |",
        phases
            .iter()
            .map(|n| format!("{n}: img/s, p50 / p99 ms, stall s"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (mode, runs) in results {
        let per = |p: usize, f: &dyn Fn(&Phase) -> f64| -> f64 {
            median(&runs.iter().map(|r| f(&r.phases[p])).collect::<Vec<_>>())
        };
        let cells: Vec<String> = (0..3)
            .map(|p| {
                format!(
                    "{:.0}, {:.1} / {:.1}, {:.1}",
                    per(p, &|x| x.images_per_s),
                    per(p, &|x| x.p50_ms),
                    per(p, &|x| x.p99_ms),
                    per(p, &|x| x.stall_s)
                )
            })
            .collect();
        let reacted: Vec<String> = (1..3)
            .map(|p| {
                runs.iter()
                    .map(|r| {
                        r.phases[p]
                            .reacted_s
                            .map_or("-".into(), |t| format!("{t:.1}"))
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect();
        let share: Vec<String> = (0..3)
            .map(|p| {
                let s: Vec<f64> = runs
                    .iter()
                    .filter_map(|r| r.phases[p].policy_share)
                    .collect();
                if s.is_empty() {
                    "-".into()
                } else {
                    format!("{:.0}%", median(&s) * 100.0)
                }
            })
            .collect();
        let cpu = median(&runs.iter().map(|r| r.control_cpu_pct).collect::<Vec<_>>());
        let failed: u64 = runs
            .iter()
            .flat_map(|r| &r.phases)
            .map(|p| p.failed_reads)
            .sum();
        let killed = runs.iter().filter(|r| r.killed).count();
        let pressure: Vec<String> = (0..3)
            .map(|p| {
                format!(
                    "{:.0}; {:.0}",
                    per(p, &|x| x.pressure_events as f64),
                    per(p, &|x| x.given_back_bytes as f64 / 1e6)
                )
            })
            .collect();
        println!(
            "| {mode} | {} | {} | {} | {cpu:.2}% of a core | {failed}; in {killed} of {} runs | {} |",
            cells.join(" | "),
            reacted.join("; "),
            share.join(" / "),
            runs.len(),
            pressure.join(" / ")
        );
    }
    let find = |name: &str| results.iter().find(|(m, _)| *m == name).map(|(_, r)| r);
    let series = |runs: &Vec<Run>, p: usize, f: fn(&Phase) -> f64| -> Vec<f64> {
        runs.iter().map(|r| f(&r.phases[p])).collect()
    };
    let cell = |c: Option<Paired>| {
        c.map_or("-".into(), |c| {
            format!("{:.3}x (t {:.2}, p {:.3})", c.ratio, c.t, c.p)
        })
    };
    println!(
        "\n| phase | policy / heuristic img/s | heuristic-again / heuristic img/s (noise) | a difference the runs can tell | policy / static p50 latency | policy / static p99 latency |"
    );
    println!("|---|---|---|---|---|---|");
    for (p, name) in phases.iter().enumerate() {
        let vs = |a: &str, b: &str, f: fn(&Phase) -> f64| -> Option<Paired> {
            paired(&series(find(a)?, p, f), &series(find(b)?, p, f))
        };
        let noise = vs("heuristic-again", "heuristic", |x| x.images_per_s);
        let tell = noise.as_ref().map_or("-".into(), |c| {
            let n = c.n as f64;
            format!(
                "{:.1}% (A/A sd {:.1}% per run, {} runs)",
                (t_critical(n - 1.0) * c.sd / n.sqrt()).exp_m1() * 100.0,
                c.sd.exp_m1() * 100.0,
                c.n
            )
        });
        println!(
            "| {name} | {} | {} | {tell} | {} | {} |",
            cell(vs("policy", "heuristic", |x| x.images_per_s)),
            cell(noise),
            cell(vs("policy", "static", |x| x.p50_ms)),
            cell(vs("policy", "static", |x| x.p99_ms)),
        );
    }
}

/// What `--save` writes, for the simulator's check against the real system
/// (`cargo bench --features train --bench scheduler -- --real FILE`): per scenario, its setting,
/// what each phase brought, and each mode's medians over the runs per phase.
#[derive(serde::Serialize)]
pub struct Saved {
    pub phase_s: f64,
    pub runs: usize,
    pub readers: usize,
    pub cores: usize,
    pub scenarios: Vec<SavedScenario>,
}

#[derive(serde::Serialize)]
pub struct SavedScenario {
    pub letter: char,
    pub cache_mem: u64,
    /// The cache's slice of `cache_mem` (median over the runs).
    pub cache_slice: u64,
    pub files: usize,
    /// Per phase: the share of the cores a CPU hog takes, and the source device's read limit
    /// (bytes/s), if any.
    pub cpu_load: [f64; 3],
    pub device_limit: [Option<u64>; 3],
    /// Mode -> per phase: median images/s, p50 and p99 load latency (ms).
    pub modes: Vec<(String, [[f64; 3]; 3])>,
}

impl SavedScenario {
    /// The medians of `results` (one entry per mode) under the setting given.
    pub fn new(
        letter: char,
        cpu_load: [f64; 3],
        device_limit: [Option<u64>; 3],
        results: &[(&str, Vec<Run>)],
    ) -> SavedScenario {
        let first = results.iter().flat_map(|(_, r)| r).next();
        let modes = results
            .iter()
            .filter(|(_, runs)| !runs.is_empty())
            .map(|(mode, runs)| {
                let per = |p: usize, f: fn(&Phase) -> f64| {
                    median(&runs.iter().map(|r| f(&r.phases[p])).collect::<Vec<_>>())
                };
                let figures = [0, 1, 2].map(|p| {
                    [
                        per(p, |x| x.images_per_s),
                        per(p, |x| x.p50_ms),
                        per(p, |x| x.p99_ms),
                    ]
                });
                ((*mode).to_owned(), figures)
            })
            .collect();
        SavedScenario {
            letter,
            cache_mem: first.map_or(0, |r| r.cache_mem),
            cache_slice: median(
                &results
                    .iter()
                    .flat_map(|(_, r)| r)
                    .map(|r| r.cache_slice as f64)
                    .collect::<Vec<_>>(),
            ) as u64,
            files: first.map_or(0, |r| r.files),
            cpu_load,
            device_limit,
            modes,
        }
    }
}
