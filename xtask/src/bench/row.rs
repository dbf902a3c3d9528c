//! One line of the bench's table, and the statistics every figure's samples go through
//! (median, spread, the way numbers are shown).
use serde_json::{json, Value};

/// One line of the table.
pub(super) struct Row {
    pub(super) figure: String,
    samples: Vec<f64>,
    unit: &'static str,
    target: String,
    /// None: informational, no target.
    pass: Option<bool>,
}

impl Row {
    pub(super) fn info(figure: impl Into<String>, samples: Vec<f64>, unit: &'static str) -> Row {
        Row { figure: figure.into(), samples, unit, target: "-".into(), pass: None }
    }
    pub(super) fn at_most(figure: impl Into<String>, samples: Vec<f64>, unit: &'static str, max: f64) -> Row {
        let pass = Some(median(&samples) <= max);
        Row { figure: figure.into(), samples, unit, target: format!("≤ {}", fmt(max)), pass }
    }
    pub(super) fn at_least(figure: impl Into<String>, samples: Vec<f64>, unit: &'static str, min: f64) -> Row {
        let pass = Some(median(&samples) >= min);
        Row { figure: figure.into(), samples, unit, target: format!("≥ {}", fmt(min)), pass }
    }
    pub(super) fn value(&self) -> String {
        let (lo, hi) = spread(&self.samples);
        format!("{} {} ({}–{})", fmt(median(&self.samples)), self.unit, fmt(lo), fmt(hi))
    }
    pub(super) fn verdict(&self) -> &'static str {
        match self.pass {
            None => "info",
            Some(true) => "met",
            Some(false) => "MISSED",
        }
    }
    pub(super) fn to_json(&self) -> Value {
        let (lo, hi) = spread(&self.samples);
        json!({"figure": self.figure, "unit": self.unit, "median": median(&self.samples), "min": lo, "max": hi,
               "samples": self.samples, "target": self.target, "verdict": self.verdict()})
    }
}

pub(super) fn ms(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| x * 1e3).collect()
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

pub(super) fn spread(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

pub(super) fn fmt(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

pub(super) fn print_table(rows: &[Row]) {
    let w = rows.iter().map(|r| r.figure.chars().count()).max().unwrap_or(10);
    let v = rows.iter().map(|r| r.value().chars().count()).max().unwrap_or(10);
    println!("\n{:<w$} | {:<v$} | {:<8} | verdict", "figure", "value: median (min–max)", "target");
    println!("{}", "-".repeat(w + v + 24));
    for r in rows {
        println!("{:<w$} | {:<v$} | {:<8} | {}", r.figure, r.value(), r.target, r.verdict());
    }
    println!("(ratios and spreads over the repetitions of one run; ms of CPU per tick or per pass)");
}
