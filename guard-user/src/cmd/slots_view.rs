//! Heavy-command slots as `status`, `tree` and `explain` show them: each slot with its holders
//! and its queue, from the running guard's last status (the slots live in the daemon only). The
//! status file is the account's to rewrite: every text is shown escaped.
use std::{
    fmt::Write as _,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use crate::{duration::human, escape, status::SlotsStatus};

/// Where one process stands in a slot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Place {
    pub slot: String,
    /// `holding` or `waiting`.
    pub state: &'static str,
    /// In line (1 = next), while waiting.
    pub position: Option<usize>,
    /// Since it holds or waits (unix seconds).
    pub since_unix: f64,
}

/// The slot `pid` (started at `start`) holds or waits for, if any: as the head of a tree
/// (the matching exec). A process of the tree under another pid is not found here.
pub fn place_of(s: &SlotsStatus, pid: u32, start: u64) -> Option<Place> {
    s.slots.iter().find_map(|slot| {
        let is = |t: &&crate::status::SlotTree| t.pid == pid && t.start_ticks == start;
        if let Some(t) = slot.holders.iter().find(is) {
            return Some(Place { slot: slot.name.clone(), state: "holding", position: None, since_unix: t.since_unix });
        }
        let (i, t) = slot.waiting.iter().enumerate().find(|(_, t)| is(t))?;
        Some(Place { slot: slot.name.clone(), state: "waiting", position: Some(i + 1), since_unix: t.since_unix })
    })
}

/// One line for `explain`: `slot build: waiting, 2nd in line, for 1m05s`.
pub fn place_text(p: &Place, now: f64) -> String {
    let long = human(Duration::from_secs_f64((now - p.since_unix).clamp(0.0, 1e9)));
    match p.position {
        Some(n) => format!("slot {}: waiting, {} in line, for {long}", text(&p.slot), ordinal(n)),
        None => format!("slot {}: holding it for {long}", text(&p.slot)),
    }
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn text(s: &str) -> String {
    escape::printable(s).into_owned()
}

/// The `slots` row of `status`: counts only.
pub fn summary(s: &SlotsStatus) -> String {
    let holding: u64 = s.slots.iter().map(|x| x.holders_count).sum();
    let waiting: u64 = s.slots.iter().map(|x| x.waiting_count).sum();
    let mut out = format!(
        "{} slot{}: {holding} holding, {waiting} waiting; {} waited, {} let go by maxWait since start",
        s.slots.len(),
        if s.slots.len() == 1 { "" } else { "s" },
        s.waits_total,
        s.timeouts_total
    );
    if let Some(why) = &s.unavailable {
        let _ = write!(out, " (REPORT ONLY: nothing can be held here, {})", text(why));
    }
    out
}

/// Every slot with its holders and its queue (`status`, `tree`).
pub fn render(out: &mut String, s: &SlotsStatus, now: SystemTime) {
    let now = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let long = |since: f64| human(Duration::from_secs_f64((now - since).clamp(0.0, 1e9)));
    for slot in &s.slots {
        let _ = writeln!(
            out,
            "\nSLOT {}  {}, max {}, maxWait {}: {} holding, {} waiting",
            text(&slot.name),
            text(&slot.mode),
            slot.max,
            human(Duration::from_secs_f64(slot.max_wait_secs.clamp(0.0, 1e9))),
            slot.holders_count,
            slot.waiting_count
        );
        if slot.holders.is_empty() && slot.waiting.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {:<8} {:>8}  {:<16} {:>9} {:>10}", "STATE", "PID", "NAME", "PROCESSES", "FOR");
        for t in &slot.holders {
            let _ = writeln!(
                out,
                "  {:<8} {:>8}  {:<16} {:>9} {:>10}",
                "holding",
                t.pid,
                text(&t.name),
                t.processes,
                long(t.since_unix)
            );
        }
        for (i, t) in slot.waiting.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:<8} {:>8}  {:<16} {:>9} {:>10}",
                format!("wait #{}", i + 1),
                t.pid,
                text(&t.name),
                t.processes,
                long(t.since_unix)
            );
        }
        let unlisted =
            (slot.holders_count + slot.waiting_count).saturating_sub((slot.holders.len() + slot.waiting.len()) as u64);
        if unlisted > 0 {
            let _ = writeln!(out, "  … and {unlisted} more");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{SlotStatus, SlotTree};

    fn tree(pid: u32, name: &str, since: f64) -> SlotTree {
        SlotTree { pid, start_ticks: u64::from(pid), name: name.into(), since_unix: since, processes: 1 }
    }

    #[test]
    fn holders_and_the_queue_are_listed_in_order_and_escaped() {
        let s = SlotsStatus {
            slots: vec![SlotStatus {
                name: "build".into(),
                max: 1,
                max_wait_secs: 1800.0,
                mode: "queue".into(),
                holders: vec![tree(10, "cargo", 100.0)],
                holders_count: 1,
                waiting: vec![tree(11, "cargo", 150.0), tree(12, "evil\nSLOT x", 160.0)],
                waiting_count: 2,
            }],
            waits_total: 2,
            ..Default::default()
        };
        let mut out = String::new();
        render(&mut out, &s, SystemTime::UNIX_EPOCH + Duration::from_secs(220));
        assert!(out.contains("SLOT build  queue, max 1, maxWait 30m00s: 1 holding, 2 waiting"), "{out}");
        assert!(out.contains("holding        10  cargo"), "{out}");
        assert!(out.contains("wait #2        12  evil\\x0aSLOT x"), "{out}");
        assert_eq!(out.lines().filter(|l| l.starts_with("SLOT")).count(), 1, "{out}");
        let p = place_of(&s, 12, 12).unwrap();
        assert_eq!((p.state, p.position), ("waiting", Some(2)));
        assert_eq!(place_text(&p, 220.0), "slot build: waiting, 2nd in line, for 1m00s");
        assert_eq!(place_of(&s, 12, 13), None, "another process on that pid");
        assert_eq!(summary(&s), "1 slot: 1 holding, 2 waiting; 2 waited, 0 let go by maxWait since start");
    }
}
