//! Which log lines become Redis stream entries, and with what fields (docs/log.md, "The Redis
//! stream"), read off the typed [`Line`]: nothing here parses text the log writer rendered.
//! Where the log shows a duration as text (`1.0h`, `2m`, `300s`), the stream carries whole
//! seconds in a field named `…_secs`.
use super::wire::StreamEvent;
use crate::log::Line;

impl StreamEvent {
    /// The stream entry `line` becomes at `now` (unix seconds), if it becomes one. Whether it
    /// does, and under which event, is [`Line::stream`]'s decision alone: this only fills the
    /// fields (test `the_stream_decision_is_line_streams_alone` in tests/log_grammar.rs).
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
                ev.elapsed_secs = Some(e.elapsed_secs.max(0.0) as u64);
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
                    ("due_in_secs", due_in_secs.to_string()),
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
                ev.extra = extra(&[("cpu", format!("{cpu:.2}")), ("for_secs", for_secs.to_string())]);
            }
            Line::Recovered { pid, name, after_secs } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.extra = extra(&[("after_secs", after_secs.to_string())]);
            }
            Line::Leftover { pid, name, root, age_secs } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.extra = extra(&[("root", root.to_string()), ("age_secs", age_secs.to_string())]);
            }
            Line::Reaped { root, name, count, survivors } => {
                ev.name = Some(name.to_string());
                ev.count = Some(*count);
                ev.extra = extra(&[("root", root.to_string()), ("survivors", survivors.to_string())]);
            }
            Line::SlotWait { slot, pid, name, position, mode } => {
                ev.pid = Some(*pid);
                ev.name = Some(name.to_string());
                ev.reason = (*mode).into();
                ev.extra = extra(&[("slot", slot.clone()), ("position", position.to_string())]);
            }
            Line::SlotStart { slot, pid, waited_secs, reason } => {
                ev.pid = Some(*pid);
                ev.reason = (*reason).into();
                ev.extra = extra(&[("slot", slot.clone()), ("waited_secs", waited_secs.to_string())]);
            }
            Line::SlotTimeout { slot, pid, waited_secs } => {
                ev.pid = Some(*pid);
                ev.reason = "max_wait".into();
                ev.extra = extra(&[("slot", slot.clone()), ("waited_secs", waited_secs.to_string())]);
            }
            // No fields of their own: `Line::stream` does not stream them, so they never get
            // here. Nothing is decided in this match; an event, once named, is always written.
            Line::Unflagged { .. }
            | Line::Started { .. }
            | Line::Stopped(_)
            | Line::Reload
            | Line::Resync { .. }
            | Line::TickComplete { .. }
            | Line::Warn(_)
            | Line::Error(_) => {}
        }
        Some(ev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        comm::Comm,
        log::{line::Ended, Notice, What},
    };

    fn fields(ev: &StreamEvent) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(pid) = ev.pid {
            out.push(("pid".into(), pid.to_string()));
        }
        if let Some(count) = ev.count {
            out.push(("count".into(), count.to_string()));
        }
        if let Some(e) = ev.elapsed_secs {
            out.push(("elapsed_secs".into(), e.to_string()));
        }
        out.extend(ev.extra.iter().cloned());
        out
    }

    /// A line, the stream event it becomes and its fields after the name.
    type Case = (Line, &'static str, Vec<(&'static str, &'static str)>);

    #[test]
    fn slot_lines_reach_the_stream_with_their_slot_and_whole_seconds() {
        let cases: Vec<Case> = vec![
            (
                Line::SlotWait { slot: "build".into(), pid: 7, name: Comm::new(b"cargo"), position: 2, mode: "queue" },
                "slot_wait",
                vec![("pid", "7"), ("slot", "build"), ("position", "2")],
            ),
            (
                Line::SlotStart { slot: "build".into(), pid: 7, waited_secs: 61, reason: "turn" },
                "slot_start",
                vec![("pid", "7"), ("slot", "build"), ("waited_secs", "61")],
            ),
            (
                Line::SlotTimeout { slot: "build".into(), pid: 7, waited_secs: 1800 },
                "slot_timeout",
                vec![("pid", "7"), ("slot", "build"), ("waited_secs", "1800")],
            ),
        ];
        for (line, event, want) in cases {
            let ev = StreamEvent::of(&line, 1_700_000_000.7).unwrap();
            assert_eq!(ev.event, event);
            let want: Vec<(String, String)> = want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(fields(&ev), want, "{}", line.body());
        }
    }

    #[test]
    fn durations_reach_the_stream_as_whole_seconds_not_the_logs_text() {
        let name = Comm::new(b"spin");
        let ended = Ended { pid: 7, name, count: 4, elapsed_secs: 5430.9 };
        let cases: Vec<Case> = vec![
            (Line::Killed(ended.clone()), "KILLED", vec![("pid", "7"), ("count", "4"), ("elapsed_secs", "5430")]),
            (Line::DryRun(ended), "DRY_RUN", vec![("pid", "7"), ("count", "4"), ("elapsed_secs", "5430")]),
            (
                Line::Warning { name, count: 4, due_in_secs: 61, ends: 3, skips: 1 },
                "warning",
                vec![("count", "4"), ("due_in_secs", "61"), ("ends", "3"), ("skips", "1")],
            ),
            (
                Line::Pegged { pid: 7, name, cpu: 0.5, for_secs: 300 },
                "pegged",
                vec![("pid", "7"), ("cpu", "0.50"), ("for_secs", "300")],
            ),
            (Line::Recovered { pid: 7, name, after_secs: 42 }, "recovered", vec![("pid", "7"), ("after_secs", "42")]),
            (
                Line::Leftover { pid: 7, name, root: 2, age_secs: 30 },
                "leftover",
                vec![("pid", "7"), ("root", "2"), ("age_secs", "30")],
            ),
            (
                Line::Reaped { root: 2, name, count: 3, survivors: 1 },
                "reaped",
                vec![("count", "3"), ("root", "2"), ("survivors", "1")],
            ),
        ];
        for (line, event, want) in cases {
            let ev = StreamEvent::of(&line, 1_700_000_000.7).unwrap_or_else(|| panic!("{} not streamed", line.body()));
            assert_eq!(ev.event, event);
            assert_eq!(ev.ts, 1_700_000_000);
            assert_eq!(ev.name.as_deref(), Some("spin"));
            let want: Vec<(String, String)> = want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(fields(&ev), want, "{}", line.body());
            for (_, v) in fields(&ev) {
                assert!(v.parse::<f64>().is_ok(), "{v} is a number, not text with a unit");
            }
        }
    }

    #[test]
    fn a_name_is_streamed_escaped_as_in_the_log_and_a_flag_only_on_its_first_tick() {
        let name = Comm::new(b"a b\n\xff");
        let ev = StreamEvent::of(&Line::Flagged { name, count: 5, minutes_ago: None }, 1.0).unwrap();
        assert_eq!((ev.event.as_str(), ev.reason.as_str(), ev.count), ("FLAGGED", "threshold", Some(5)));
        assert_eq!(ev.name.as_deref(), Some(r"a b\n\xff"));
        assert_eq!(StreamEvent::of(&Line::Flagged { name, count: 5, minutes_ago: Some(1) }, 1.0), None);
        let skipped = StreamEvent::of(&Line::Skipped { pid: 3, name, reason: "identity_changed" }, 1.0).unwrap();
        assert_eq!((skipped.pid, skipped.reason.as_str()), (Some(3), "identity_changed"));
        assert_eq!(StreamEvent::of(&Line::Warn(Notice::new(What::RedisUnreachable)), 1.0), None);
    }
}
