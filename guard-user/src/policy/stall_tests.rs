use std::time::Duration;

use super::*;

fn p(pid: u32) -> ProcState {
    ProcState { id: ProcId { pid, start_ticks: 1 }, euid: 1000, comm: Comm::new(b"spin") }
}

fn cfg() -> StallWatch {
    StallWatch { pegged_cpu: 0.75, pegged_for: Duration::from_secs(300) }
}

/// Feeds `busy[i]` cores for each 60 s interval; returns the bodies of the lines, with the tick.
fn run(busy: &[f64]) -> Vec<(usize, String)> {
    let mut s = StallState::default();
    let mut cpu = 0u64;
    let mut out = Vec::new();
    s.observe(&[(p(7), cpu)], &cfg(), 0.0);
    for (i, b) in busy.iter().enumerate() {
        cpu += (b * 60.0 * 1e9) as u64;
        for l in s.observe(&[(p(7), cpu)], &cfg(), 60.0 * (i + 1) as f64) {
            out.push((i + 1, l.body()));
        }
    }
    out
}

#[test]
fn a_process_busy_in_every_interval_of_the_window_is_told_once_then_recovered() {
    let lines = run(&[1.0, 0.9, 1.0, 0.8, 1.0, 1.0, 1.0, 0.1]);
    assert_eq!(
        lines,
        [
            (5, "PEGGED pid=7 name=spin cpu=0.94 for=300s".to_string()),
            (8, "RECOVERED pid=7 name=spin after=420s".to_string()),
        ]
    );
}

#[test]
fn a_burst_shorter_than_the_window_is_never_told() {
    assert!(run(&[1.0, 1.0, 1.0, 1.0, 0.2, 1.0, 1.0, 1.0, 1.0, 0.0]).is_empty());
}

#[test]
fn a_high_average_with_one_calm_interval_is_not_pegged() {
    // Averages 0.82 over five intervals, but one is calm: "none of them calm" fails.
    assert!(run(&[1.0, 1.0, 0.1, 1.0, 1.0, 1.0, 1.0]).is_empty());
}

#[test]
fn an_incident_that_lasts_is_reminded_every_hour() {
    let lines = run(&[1.0; 130]);
    let at: Vec<usize> = lines.iter().map(|(i, _)| *i).collect();
    assert_eq!(at, [5, 65, 125], "{lines:?}");
    assert_eq!(lines[1].1, "PEGGED pid=7 name=spin cpu=1.00 for=3900s");
}

#[test]
fn a_pegged_process_that_exits_recovers_and_is_forgotten() {
    let mut s = StallState::default();
    for i in 0..=5u64 {
        s.observe(&[(p(7), i * 60_000_000_000)], &cfg(), 60.0 * i as f64);
    }
    assert_eq!(s.pegged().len(), 1);
    let lines = s.observe(&[], &cfg(), 360.0);
    assert_eq!(lines.iter().map(Line::body).collect::<Vec<_>>(), ["RECOVERED pid=7 name=spin after=300s"]);
    assert_eq!(s.tracked(), 0);
}

#[test]
fn a_reused_pid_is_a_new_process() {
    let mut s = StallState::default();
    for i in 0..=5u64 {
        s.observe(&[(p(7), i * 60_000_000_000)], &cfg(), 60.0 * i as f64);
    }
    let other = ProcState { id: ProcId { pid: 7, start_ticks: 99 }, ..p(7) };
    let lines = s.observe(&[(other, 0)], &cfg(), 360.0);
    assert_eq!(lines.len(), 1, "the old one recovered (gone); the new one starts from nothing: {lines:?}");
    assert!(s.pegged().is_empty());
}
