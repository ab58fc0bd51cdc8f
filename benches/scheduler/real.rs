//! The simulator against the real system (issue 38, item 3): for the scenarios the adapt bench
//! measured (`cargo bench --bench adapt -- --save FILE`), the simulator's prediction of each
//! mode's images/s and load latency per phase, beside what was measured.
//!
//! Owns the mapping of a measured scenario to a simulated one and the comparison table. Only the
//! scenarios the simulator models are predicted: (a), CPU load as its background share of the
//! cores, and (b), the slowed device as its throttle on the source's bandwidth; a line says why
//! the others are not. The simulated modes are the mounts': `policy` the policy file's greedy
//! choice under the mount's guard (`scheduler::guard`: the heuristics act first to be measured,
//! and take the knobs back from a policy whose reward trails theirs), `policy-unguarded` without
//! it, `heuristic` the heuristic baseline, `static` the heuristic with no codec and no decoded
//! pixels (the adapt bench's static mount), and the adapt bench's probes the heuristic with the
//! knobs their flags hold (`pixels-raw`, `pixels-zstd1`, `workers-2x`). Must never run a mount: it reads the measurements
//! from the file.

use std::cell::RefCell;

use prepfs::control::action::{Action, Head, Mask};
use prepfs::control::observation::Observation;
use prepfs::scheduler::artifact::Payload;
use prepfs::scheduler::guard::{Actor, Guard};
use prepfs::scheduler::sim::baselines::{self, Policy};
use prepfs::scheduler::sim::calibration::Calibration;
use prepfs::scheduler::sim::engine::{INTERVAL_S, Simulator};
use prepfs::scheduler::sim::scenario::{Scenario, SourceModel};
use prepfs::scheduler::state::RewardWeights;
use prepfs::scheduler::train;

/// Simulated runs per mode and scenario (seeds); the table shows their medians.
const SEEDS: u64 = 5;
/// The consumer asks as fast as its readers allow: each of the adapt bench's readers has one
/// read outstanding and starts the next as soon as one returns.
const AS_FAST_AS_READ: f64 = 1e5;

/// Per phase: images/s, p50 and p99 load latency (ms).
type Figures = [[f64; 3]; 3];

fn fail(msg: String) -> ! {
    eprintln!("scheduler --real: {msg}");
    std::process::exit(1)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &str) -> T {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| fail(format!("{path}: {e}")));
    serde_json::from_str(&text).unwrap_or_else(|e| fail(format!("{path}: {e}")))
}

/// What the adapt bench saved (its `report::Saved`).
#[derive(serde::Deserialize)]
struct Saved {
    phase_s: f64,
    runs: usize,
    readers: usize,
    cores: usize,
    scenarios: Vec<SavedScenario>,
}

#[derive(serde::Deserialize)]
struct SavedScenario {
    letter: char,
    cache_mem: u64,
    #[serde(default)]
    cache_slice: u64,
    files: usize,
    cpu_load: [f64; 3],
    device_limit: [Option<u64>; 3],
    modes: Vec<(String, Figures)>,
}

/// The simulated scenario of a measured one, or why the simulator does not model it. Phase `p`
/// starts after the adapt bench's warm-up of half a phase.
fn simulated(
    m: &SavedScenario,
    saved: &Saved,
    costs: &Calibration,
    disk: &Calibration,
) -> Result<Scenario, String> {
    match m.letter {
        'a' | 'b' => {}
        'c' => return Err("a working set that changes mid-run is not modelled".into()),
        'd' => return Err("a memory hog beside the daemon is not modelled".into()),
        'e' => return Err("other jobs sharing renders are not modelled".into()),
        other => return Err(format!("unknown scenario '{other}'")),
    }
    let (second, third) = (1.5 * saved.phase_s, 2.5 * saved.phase_s);
    let schedule = |v: [f64; 3]| vec![(0.0, v[0]), (second, v[1]), (third, v[2])];
    // (a) reads a directory the page cache holds; the others the loop-mounted image.
    let source = if m.letter == 'a' { costs } else { disk };
    let costs = Calibration {
        source_bytes_per_s: source.source_bytes_per_s,
        source_latency_s: source.source_latency_s,
        source_cpu_s_per_byte: source.source_cpu_s_per_byte,
        ..costs.clone()
    };
    let bandwidth = costs.source_bytes_per_s;
    let throttle = m
        .device_limit
        .map(|limit| limit.map_or(1.0, |l| (l as f64 / bandwidth).min(1.0)));
    Ok(Scenario {
        name: format!("({})", m.letter),
        cores: saved.cores,
        memory_bytes: 24e9,
        // What the RAM tier may hold: the cache's slice of the budget (staging and the work
        // slice have the rest).
        cache_bytes: if m.cache_slice > 0 {
            m.cache_slice
        } else {
            m.cache_mem
        } as f64,
        gpu: None,
        source: SourceModel {
            bytes_per_s: bandwidth,
            latency_s: costs.source_latency_s,
            concurrency: prepfs::prefetch::DEFAULT_THREADS,
        },
        costs,
        items: m.files,
        consumer_rate: AS_FAST_AS_READ,
        outstanding: saved.readers,
        background: schedule(m.cpu_load),
        throttle: schedule(throttle),
    })
}

/// `policy` as the mount runs it with its guard: each interval's reward goes to whoever set the
/// knobs in it, and the guard says who sets them next. A fresh guard per run.
fn guarded<'a>(policy: &'a Policy<'a>, heuristic: &'a Policy<'a>) -> Box<Policy<'a>> {
    let state = RefCell::new((Guard::default(), None::<Actor>));
    let weights = RewardWeights::default();
    Box::new(
        move |obs: &Observation, current: &Action, mask: &Mask, step: usize| {
            let mut state = state.borrow_mut();
            let (guard, acted) = &mut *state;
            if let Some(actor) = acted.take() {
                guard.observe(actor, weights.reward(obs), obs.request_rate > 0.0);
            }
            let actor = guard.actor();
            *acted = Some(actor);
            match actor {
                Actor::Policy => policy(obs, current, mask, step),
                Actor::Heuristic => heuristic(obs, current, mask, step),
            }
        },
    )
}

/// The median over seeds of the figures per phase on `s` of the policy `make` gives (one per
/// run), and per phase each knob's option most in force over the seeds' decisions (as the adapt
/// bench reports the mount's).
fn predict<'a>(
    make: &dyn Fn() -> Box<Policy<'a>>,
    s: &Scenario,
    phase_s: f64,
) -> (Figures, [String; 3]) {
    let warm = phase_s / 2.0;
    let steps = ((warm + 3.0 * phase_s) / INTERVAL_S).round() as usize;
    let mut chosen: [Vec<Action>; 3] = Default::default();
    let runs: Vec<Figures> = (0..SEEDS)
        .map(|seed| {
            let policy = make();
            let mut sim = Simulator::new(s.clone(), 2000 + seed);
            let mask = sim.mask();
            let mut current = baselines::static_cpu(
                &Observation::default(),
                &Action::default(),
                &Mask::default(),
                0,
            );
            let mut obs = sim.step(&current);
            let mut latencies: [Vec<f64>; 3] = Default::default();
            for i in 0..steps {
                current = policy(&obs, &current, &mask, i);
                obs = sim.step(&current);
                let p = ((sim.now() - warm) / phase_s).floor();
                if (0.0..3.0).contains(&p) {
                    let ms = sim.last_latencies().iter().map(|l| f64::from(*l) * 1e3);
                    latencies[p as usize].extend(ms);
                    chosen[p as usize].push(current);
                }
            }
            latencies.map(|mut v| {
                v.sort_by(f64::total_cmp);
                let q = |q: f64| {
                    let at = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
                    v.get(at).copied().unwrap_or(0.0)
                };
                [v.len() as f64 / phase_s, q(0.5), q(0.99)]
            })
        })
        .collect();
    let figures = std::array::from_fn(|p| {
        std::array::from_fn(|k| median(runs.iter().map(|r| r[p][k]).collect()))
    });
    (figures, chosen.map(|actions| most_in_force(&actions)))
}

/// Each knob's option chosen most often in `actions`, with its share: `codec=none 80%`.
fn most_in_force(actions: &[Action]) -> String {
    Head::ALL
        .iter()
        .filter(|h| !matches!(h, Head::Decode | Head::Augment))
        .map(|&h| {
            let mut counts = std::collections::BTreeMap::new();
            for a in actions {
                *counts.entry(a.get(h)).or_insert(0usize) += 1;
            }
            let (option, n) = counts.into_iter().max_by_key(|(_, n)| *n).unwrap_or((0, 0));
            format!(
                "{}={} {:.0}%",
                h.name(),
                h.option_name(option),
                n as f64 * 100.0 / actions.len().max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `cargo bench --features train --bench scheduler -- --real FILE ...`: see the module docs.
pub fn check(
    path: &str,
    calibration: Option<String>,
    disk_calibration: Option<String>,
    policy_file: Option<String>,
) {
    let saved: Saved = read_json(path);
    let costs: Calibration = calibration
        .as_deref()
        .map_or_else(Calibration::default, read_json);
    let disk: Calibration = disk_calibration
        .as_deref()
        .map_or_else(|| costs.clone(), read_json);
    let payload = match &policy_file {
        Some(p) => Payload::load(std::path::Path::new(p)),
        None => Payload::shipped(),
    }
    .unwrap_or_else(|e| fail(format!("policy: {e}")));
    let policy = train::greedy(&payload.network, &payload.normalisation);
    println!(
        "Simulator vs real system: {} (measured: {} rounds, {} s phases, {} readers, {} cores); costs {}; the disk's source {}; policy {}; simulated: median of {SEEDS} seeds.",
        path,
        saved.runs,
        saved.phase_s,
        saved.readers,
        saved.cores,
        calibration.as_deref().unwrap_or("built in (DESIGN.md)"),
        disk_calibration.as_deref().unwrap_or("as the costs'"),
        policy_file
            .as_deref()
            .unwrap_or("the shipped policy/default.json")
    );
    for m in &saved.scenarios {
        let s = match simulated(m, &saved, &costs, &disk) {
            Ok(s) => s,
            Err(why) => {
                println!("\n({}): not predicted: {why}.", m.letter);
                continue;
            }
        };
        let heuristic = baselines::heuristic_policy(&s);
        // The heuristic with some knobs held, as the adapt bench's flags hold them on the mount.
        let forced = |held: &'static [(Head, usize)]| {
            let heuristic = &heuristic;
            move |o: &Observation, c: &Action, k: &Mask, i: usize| {
                held.iter()
                    .fold(heuristic(o, c, k, i), |a, &(head, v)| a.with(head, v))
            }
        };
        let fixed = forced(&[(Head::Codec, 0), (Head::Decoded, 0)]);
        let pixels_raw = forced(&[(Head::Codec, 0), (Head::Decoded, 1)]);
        let pixels_zstd1 = forced(&[(Head::Codec, 2), (Head::Decoded, 1)]);
        let workers_2x = forced(&[(Head::Workers, 3)]);
        println!("\n### ({}) simulated / measured\n", m.letter);
        println!("| mode | phase | img/s | p50 ms | p99 ms | simulated choices |");
        println!("|---|---|---|---|---|---|");
        let mut predicted: Vec<(&str, Figures, Figures)> = Vec::new();
        for (mode, measured) in &m.modes {
            let phase_s = saved.phase_s;
            let (sim, choices) = match mode.as_str() {
                "policy" => predict(&|| guarded(&policy, &heuristic), &s, phase_s),
                "policy-unguarded" => predict(&|| Box::new(&policy), &s, phase_s),
                "heuristic" | "heuristic-again" => predict(&|| Box::new(&heuristic), &s, phase_s),
                "static" => predict(&|| Box::new(&fixed), &s, phase_s),
                "pixels-raw" => predict(&|| Box::new(&pixels_raw), &s, phase_s),
                "pixels-zstd1" => predict(&|| Box::new(&pixels_zstd1), &s, phase_s),
                "workers-2x" => predict(&|| Box::new(&workers_2x), &s, phase_s),
                _ => continue,
            };
            for ph in 0..3 {
                let cell = |k: usize| {
                    format!(
                        "{:.1} / {:.1} ({:.2}x)",
                        sim[ph][k],
                        measured[ph][k],
                        sim[ph][k] / measured[ph][k].max(1e-9)
                    )
                };
                println!(
                    "| {mode} | {} | {} | {} | {} | {} |",
                    ph + 1,
                    cell(0),
                    cell(1),
                    cell(2),
                    choices[ph]
                );
            }
            predicted.push((mode, sim, *measured));
        }
        let find = |name: &str| predicted.iter().find(|(m, ..)| *m == name);
        if let (Some(a), Some(h)) = (find("policy"), find("heuristic")) {
            println!("\n| phase | policy / heuristic img/s, simulated | measured |");
            println!("|---|---|---|");
            for ph in 0..3 {
                println!(
                    "| {} | {:.2}x | {:.2}x |",
                    ph + 1,
                    a.1[ph][0] / h.1[ph][0].max(1e-9),
                    a.2[ph][0] / h.2[ph][0].max(1e-9)
                );
            }
        }
    }
}
