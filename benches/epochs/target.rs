//! A target of the epochs benchmark, evaluated, and the median every target is judged on.
//!
//! Shared by the modules that evaluate targets (report, prefetch, views_report) so none of them
//! imports another for it. Owns no numbers: evaluations live with the runs they judge.

use serde::Serialize;

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
