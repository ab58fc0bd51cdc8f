//! Stall diagnosis: what kept readers waiting in a pass, and what would help.
//!
//! Owns: turning one pass's figures (its time, fetch and prep stall, source bytes, working set)
//! and the cache's capacity into answers to DS-Analyzer's questions: how much of the pass readers
//! waited on the source and on preprocessing, how the bytes fetched compare with the never-evict
//! optimum for this capacity, what cache budget would remove the fetch stall, and a verdict with
//! one sentence of advice. Must never measure or lock anything: it is arithmetic over figures
//! the planner hands it, so it can be tested on made-up passes.

use serde_json::{Value, json};

use crate::cache::metrics::CacheFigures;

/// Share of a pass that readers may wait on prepfs before it counts as a stall worth acting on.
const STALLED: f64 = 0.05;
/// Bytes fetched above the never-evict optimum, as a share of the working set, that still count
/// as reaching it (block rounding, files that changed, stragglers of the pass before).
const OPTIMUM_SLACK: f64 = 0.05;
/// Budgets, as multiples of the current RAM budget, that the what-if estimate is given for.
const WHAT_IF: [f64; 2] = [1.5, 2.0];

/// One complete pass, whole mount.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassFigures {
    /// Which pass (1 = the first, cold one).
    pub epoch: u64,
    /// Wall time of the pass.
    pub seconds: f64,
    /// Seconds reads waited on the source, summed over readers.
    pub fetch_stall_seconds: f64,
    /// Seconds reads waited for view renders, summed over readers.
    pub prep_stall_seconds: f64,
    /// Bytes read from the source during the pass.
    pub source_bytes: u64,
    /// Bytes of the distinct files the pass opened; `None` when unknown (views' file sets).
    pub working_set_bytes: Option<u64>,
}

/// How much content the cache can hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct Capacity {
    /// RAM budget (stored bytes).
    pub ram_budget: u64,
    /// Content bytes per stored byte in the RAM tier now.
    pub ram_ratio: f64,
    /// Disk budget (stored bytes), if there is a disk tier.
    pub disk_budget: Option<u64>,
    /// Content bytes per stored byte in the disk tier now.
    pub disk_ratio: f64,
}

impl Capacity {
    /// The capacity of tiers holding `now`.
    pub fn of(now: &CacheFigures) -> Capacity {
        let ratio = |logical: u64, stored: u64| {
            if stored == 0 {
                1.0
            } else {
                (logical as f64 / stored as f64).max(1.0)
            }
        };
        Capacity {
            ram_budget: now.ram.budget_bytes,
            ram_ratio: ratio(now.ram.logical_bytes, now.ram.bytes),
            disk_budget: now.disk.map(|d| d.budget_bytes),
            disk_ratio: now.disk.map_or(1.0, |d| ratio(d.logical_bytes, d.bytes)),
        }
    }

    /// Content bytes the cache holds when full. Every block fetched is offered to both tiers,
    /// so the larger tier bounds what the source need not serve again.
    pub fn content_bytes(&self) -> u64 {
        let ram = self.ram_budget as f64 * self.ram_ratio;
        let disk = self.disk_budget.unwrap_or(0) as f64 * self.disk_ratio;
        ram.max(disk) as u64
    }
}

/// The diagnosis of `pass` for a cache of `capacity`, as the `diagnosis` object of stats.json.
pub fn diagnose(pass: &PassFigures, capacity: &Capacity) -> Value {
    let share = |s: f64| {
        if pass.seconds > 0.0 {
            s / pass.seconds
        } else {
            0.0
        }
    };
    let (fetch, prep) = (
        share(pass.fetch_stall_seconds),
        share(pass.prep_stall_seconds),
    );
    let holds = capacity.content_bytes();
    let working = pass.working_set_bytes;
    // Never-evict optimum: a cold pass reads everything once; later passes read what does not fit.
    let optimal = working.map(|w| {
        if pass.epoch <= 1 {
            w
        } else {
            w.saturating_sub(holds)
        }
    });
    let needed = working.map(|w| (w as f64 / capacity.ram_ratio).ceil() as u64);
    let missed = working.map_or(0, |w| w.saturating_sub(holds));
    let what_if: Vec<Value> = WHAT_IF
        .iter()
        .map(|m| (capacity.ram_budget as f64 * m) as u64)
        .chain(needed)
        .map(|budget| {
            let holds_then = (budget as f64 * capacity.ram_ratio) as u64;
            let fetch_then = working.map(|w| {
                if missed == 0 {
                    0.0
                } else {
                    // Fetch stall scales with the bytes that miss (each miss waits alike).
                    pass.fetch_stall_seconds * w.saturating_sub(holds.max(holds_then)) as f64
                        / missed as f64
                }
            });
            json!({"ram_budget_bytes": budget, "fetch_stall_seconds": fetch_then})
        })
        .collect();
    let (verdict, advice) = verdict(pass, fetch, prep, working, holds, optimal, needed);
    json!({
        "epoch": pass.epoch,
        "fetch_stall_share": fetch,
        "prep_stall_share": prep,
        "working_set_bytes": working,
        "cache_content_bytes": holds,
        "source_bytes": pass.source_bytes,
        "optimal_source_bytes": optimal,
        "ram_budget_needed_bytes": needed,
        "what_if": if working.is_some() { Value::from(what_if) } else { Value::Null },
        "verdict": verdict,
        "advice": advice,
    })
}

fn verdict(
    pass: &PassFigures,
    fetch: f64,
    prep: f64,
    working: Option<u64>,
    holds: u64,
    optimal: Option<u64>,
    needed: Option<u64>,
) -> (&'static str, String) {
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    if fetch + prep < STALLED {
        return (
            "none",
            format!(
                "readers waited on prepfs for {} of the pass: input is not what slows this job",
                pct(fetch + prep)
            ),
        );
    }
    if prep > fetch {
        return (
            "cpu",
            format!(
                "readers waited on view renders for {} of the pass: more CPU cores, more \
                 --render-threads or decoded-pixel caching would help; more cache would not",
                pct(prep)
            ),
        );
    }
    let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    match (working, optimal, needed) {
        (Some(w), _, Some(n)) if w > holds => (
            "cache",
            format!(
                "readers waited on the source for {} of the pass; its files ({}) exceed what the \
                 cache holds ({}): a RAM budget of {} would hold them all",
                pct(fetch),
                gib(w),
                gib(holds),
                gib(n)
            ),
        ),
        (Some(w), Some(o), _)
            if pass.source_bytes as f64 > o as f64 + OPTIMUM_SLACK * w as f64
                || pass.epoch <= 1 =>
        {
            (
                "warming",
                format!(
                    "readers waited on the source for {} of the pass, though its files ({}) fit \
                     in the cache: it was still filling; `prepfs warm` fills it before training",
                    pct(fetch),
                    gib(w)
                ),
            )
        }
        _ => (
            "source",
            format!(
                "readers waited on the source for {} of the pass for what the cache cannot \
                 hold: faster storage, or prefetch that knows the order (--order-file), would help",
                pct(fetch)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn capacity(ram: u64) -> Capacity {
        Capacity {
            ram_budget: ram,
            ram_ratio: 1.0,
            disk_budget: None,
            disk_ratio: 1.0,
        }
    }

    #[test]
    fn a_dataset_larger_than_the_cache_asks_for_more_cache_and_prices_it() {
        let pass = PassFigures {
            epoch: 3,
            seconds: 100.0,
            fetch_stall_seconds: 40.0,
            prep_stall_seconds: 2.0,
            source_bytes: 6 * GIB,
            working_set_bytes: Some(10 * GIB),
        };
        let d = diagnose(&pass, &capacity(4 * GIB));
        assert_eq!(d["verdict"], "cache");
        assert_eq!(d["fetch_stall_share"], 0.4);
        assert_eq!(d["optimal_source_bytes"], 6 * GIB);
        assert_eq!(d["ram_budget_needed_bytes"], 10 * GIB);
        // 1.5x (6 GiB) leaves 4 of 6 GiB missing, 2x leaves 2 of 6, the needed budget none.
        let stall: Vec<f64> = d["what_if"]
            .as_array()
            .expect("what_if")
            .iter()
            .map(|w| w["fetch_stall_seconds"].as_f64().expect("seconds"))
            .collect();
        assert_eq!(stall.len(), 3);
        assert!((stall[0] - 40.0 * 4.0 / 6.0).abs() < 1e-9, "{stall:?}");
        assert!((stall[1] - 40.0 * 2.0 / 6.0).abs() < 1e-9, "{stall:?}");
        assert_eq!(stall[2], 0.0);
    }

    #[test]
    fn compression_and_a_disk_tier_count_toward_what_the_cache_holds() {
        let cap = Capacity {
            ram_budget: 2 * GIB,
            ram_ratio: 2.0,
            disk_budget: Some(3 * GIB),
            disk_ratio: 1.5,
        };
        assert_eq!(cap.content_bytes(), 4 * GIB + GIB / 2);
        let pass = PassFigures {
            epoch: 2,
            seconds: 10.0,
            fetch_stall_seconds: 3.0,
            source_bytes: GIB,
            working_set_bytes: Some(4 * GIB),
            ..PassFigures::default()
        };
        let d = diagnose(&pass, &cap);
        assert_eq!(d["optimal_source_bytes"], 0);
        assert_eq!(d["ram_budget_needed_bytes"], 2 * GIB);
        assert_eq!(d["verdict"], "warming", "{d}");
    }

    #[test]
    fn preprocessing_waits_ask_for_cpu_and_short_waits_for_nothing() {
        let mut pass = PassFigures {
            epoch: 2,
            seconds: 10.0,
            fetch_stall_seconds: 0.5,
            prep_stall_seconds: 4.0,
            working_set_bytes: Some(GIB),
            ..PassFigures::default()
        };
        assert_eq!(diagnose(&pass, &capacity(GIB))["verdict"], "cpu");
        pass.prep_stall_seconds = 0.1;
        pass.fetch_stall_seconds = 0.2;
        assert_eq!(diagnose(&pass, &capacity(GIB))["verdict"], "none");
    }

    #[test]
    fn fetch_waits_at_the_optimum_blame_the_source_and_unknown_sets_skip_the_what_if() {
        let pass = PassFigures {
            epoch: 4,
            seconds: 10.0,
            fetch_stall_seconds: 3.0,
            source_bytes: 0,
            working_set_bytes: Some(GIB),
            ..PassFigures::default()
        };
        assert_eq!(diagnose(&pass, &capacity(2 * GIB))["verdict"], "source");
        let views = PassFigures {
            working_set_bytes: None,
            ..pass
        };
        let d = diagnose(&views, &capacity(2 * GIB));
        assert_eq!(d["verdict"], "source");
        assert!(d["what_if"].is_null() && d["ram_budget_needed_bytes"].is_null());
    }
}
