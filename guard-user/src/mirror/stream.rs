//! Which log lines become Redis stream entries, and with what fields (docs/log.md, "The Redis
//! stream"), read off the typed [`Line`]: nothing here parses text the log writer rendered.
use super::wire::StreamEvent;
use crate::log::{line::hours_one_decimal, Line};

impl StreamEvent {
    /// The stream entry `line` becomes at `now` (unix seconds), if it becomes one
    /// ([`Line::stream`]).
    pub fn of(line: &Line, now: f64) -> Option<StreamEvent> {
        let event = line.stream()?;
        let mut ev = StreamEvent { event: event.into(), ts: now as i64, ..Default::default() };
        let extra = |pairs: &[(&str, String)]| pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        match line {
            Line::Flagged { name, count, .. } => {
                ev.name = Some(name.to_string());
                ev.reason = "threshold".into();
                ev.count = Some(u64::from(*count));
            }
            Line::Killed(e) | Line::DryRun(e) => {
                ev.pid = Some(e.pid);
                ev.name = Some(e.name.to_string());
                ev.reason = "ghost_detected".into();
                ev.count = Some(u64::from(e.count));
                ev.elapsed = Some(format!("{}h", hours_one_decimal(e.elapsed_secs)));
            }
            Line::DryRunLeftover { pid, name, root } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.reason = "leftover".into();
                ev.extra = extra(&[("root", root.to_string())]);
            }
            Line::Skipped { pid, name, reason } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.reason = (*reason).into();
            }
            Line::Warning { name, count, due_in_secs, ends, skips } => {
                ev.name = Some(name.to_string());
                ev.count = Some(u64::from(*count));
                ev.extra = extra(&[
                    ("due_in", format!("{}m", due_in_secs.div_ceil(60))),
                    ("ends", ends.to_string()),
                    ("skips", skips.to_string()),
                ]);
            }
            Line::Repeat { name, enforcements_24h, kills_24h } => {
                ev.name = Some(name.to_string());
                ev.extra =
                    extra(&[("enforcements_24h", enforcements_24h.to_string()), ("kills_24h", kills_24h.to_string())]);
            }
            Line::Pegged { pid, name, cpu, for_secs } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.extra = extra(&[("cpu", format!("{cpu:.2}")), ("for", format!("{for_secs}s"))]);
            }
            Line::Recovered { pid, name, after_secs } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.extra = extra(&[("after", format!("{after_secs}s"))]);
            }
            Line::Leftover { pid, name, root, age_secs } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.extra = extra(&[("root", root.to_string()), ("age", format!("{age_secs}s"))]);
            }
            Line::Reaped { root, name, count, survivors } => {
                ev.name = Some(name.to_string());
                ev.count = Some(*count);
                ev.extra = extra(&[("root", root.to_string()), ("survivors", survivors.to_string())]);
            }
            // Not streamed (`Line::stream` said so above).
            Line::Unflagged { .. }
            | Line::Started { .. }
            | Line::Stopped(_)
            | Line::Reload
            | Line::Resync { .. }
            | Line::TickComplete { .. }
            | Line::Warn(_)
            | Line::Error(_) => return None,
        }
        Some(ev)
    }
}
