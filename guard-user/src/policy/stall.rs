//! The stall watch (docs/configuration.md): report-only. Every tick samples the CPU time of the account's
//! processes; a process that used at least `peggedCpu` of a core in *every* sample interval for
//! `peggedFor` ("none of them calm") is reported once per incident (`PEGGED`), reminded every
//! hour while the incident lasts, and `RECOVERED` once an interval is calm (or it is gone). A
//! short burst is never told. Nothing here signals anything. Pure: the tick passes samples and
//! the time in.
use std::collections::HashMap;

use crate::log::Line;
use crate::{comm::Comm, config::StallWatch, domain::PeggedProcess, event::ProcId, event::ProcState};

/// How often an incident that lasts is told again.
pub const REMINDER: f64 = 3600.0;

#[derive(Clone, Debug)]
struct Track {
    name: Comm,
    /// The previous sample: (unix seconds, group CPU ns).
    last: (f64, u64),
    /// Start of the current run of busy intervals, and the CPU used since.
    hot: Option<(f64, u64)>,
    /// When the incident was told (`PEGGED`), and when last (for the hourly reminder).
    told: Option<(f64, f64)>,
}

/// What the stall watch remembers between ticks: one track per live process of the account.
#[derive(Clone, Debug, Default)]
pub struct StallState {
    tracks: HashMap<ProcId, Track>,
}

fn pegged_line(pid: u32, name: Comm, cpu: f64, secs: f64) -> Line {
    Line::Pegged { pid, name, cpu, for_secs: secs as u64 }
}

fn recovered_line(pid: u32, name: Comm, after: f64) -> Line {
    Line::Recovered { pid, name, after_secs: after.max(0.0) as u64 }
}

impl StallState {
    /// One sample of every live process of the account (group CPU time in ns). Returns the lines.
    pub fn observe(&mut self, samples: &[(ProcState, u64)], cfg: &StallWatch, now: f64) -> Vec<Line> {
        let need = cfg.pegged_for.as_secs_f64();
        let mut lines = Vec::new();
        let mut seen = std::collections::HashSet::with_capacity(samples.len());
        for &(p, cpu) in samples {
            seen.insert(p.id);
            let Some(t) = self.tracks.get_mut(&p.id) else {
                self.tracks.insert(p.id, Track { name: p.comm, last: (now, cpu), hot: None, told: None });
                continue;
            };
            let (t0, c0) = t.last;
            let dt = now - t0;
            if dt <= 0.0 {
                continue;
            }
            let used = cpu.saturating_sub(c0);
            t.last = (now, cpu);
            t.name = p.comm;
            if used as f64 / 1e9 / dt >= cfg.pegged_cpu {
                let (since, total) = t.hot.get_or_insert((t0, 0));
                *total += used;
                let (since, total) = (*since, *total);
                let span = now - since;
                if span + 1e-6 >= need {
                    let cpu = total as f64 / 1e9 / span;
                    match t.told {
                        None => {
                            t.told = Some((since, now));
                            lines.push(pegged_line(p.id.pid, p.comm, cpu, span));
                        }
                        Some((start, last)) if now - last >= REMINDER => {
                            t.told = Some((start, now));
                            lines.push(pegged_line(p.id.pid, p.comm, cpu, span));
                        }
                        Some(_) => {}
                    }
                }
            } else {
                // A calm interval ends the run, and any incident.
                if let Some((start, _)) = t.told.take() {
                    lines.push(recovered_line(p.id.pid, p.comm, t0 - start));
                }
                t.hot = None;
            }
        }
        // Gone (or no longer the account's): an incident ends with the process.
        let gone: Vec<ProcId> = self.tracks.keys().filter(|id| !seen.contains(id)).copied().collect();
        for id in gone {
            if let Some(t) = self.tracks.remove(&id) {
                if let Some((start, _)) = t.told {
                    lines.push(recovered_line(id.pid, t.name, t.last.0 - start));
                }
            }
        }
        lines
    }

    /// The processes in an incident now, for `status`.
    pub fn pegged(&self) -> Vec<PeggedProcess> {
        let mut v: Vec<PeggedProcess> = self
            .tracks
            .iter()
            .filter_map(|(id, t)| {
                let (start, _) = t.told?;
                let (since, total) = t.hot?;
                let span = (t.last.0 - since).max(1e-9);
                Some(PeggedProcess {
                    pid: id.pid,
                    name: t.name.to_string(),
                    cpu: total as f64 / 1e9 / span,
                    for_secs: t.last.0 - start,
                })
            })
            .collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// Processes tracked (for the benchmark and tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn tracked(&self) -> usize {
        self.tracks.len()
    }
}

#[cfg(test)]
#[path = "stall_tests.rs"]
mod tests;
