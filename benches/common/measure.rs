//! Small figures the benchmarks report with: the median of samples and the machine's load.
//!
//! Owns nothing but these two functions. Must never measure anything itself.

/// The median of `v` (the mean of the middle two for an even count); `v` must not be empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// The 1, 5 and 15 minute load averages, as /proc/loadavg writes them ("" if unreadable).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
