//! The sessions part of the status file (`status`, `guard-user tree`, the metrics and the
//! heartbeat): the lineage after a tick's answers, with what the tick's book remembers.
use super::{
    sessions::{Ages, Phase, SessionBook, KILL_CHECK, STOP_WAIT},
    Now,
};
use crate::{
    config::Sessions,
    domain::{SessionCaps, SessionProcess, SessionStatus, SessionsStatus},
    lineage::SessionsView,
};

/// Live sessions listed in the status file (`tree`); the rest are counted. An ended session
/// (in its grace, being stopped, or with reported leftovers) is always listed, with every one of
/// its processes, so the log is never the only list of leftovers: the lineage's own caps
/// (1,024 sessions, 1,024 reported, 16,384 members, each root's command cut to 256 bytes) bound
/// that list to a few MiB, inside what `tree` and `status` read.
pub const MAX_STATUS_SESSIONS: usize = 64;
/// Processes listed per live session in the status file; the rest are counted.
pub const MAX_STATUS_PROCESSES: usize = 256;

/// The status of `view` (the lineage after this tick's answers) with what `book` remembers.
pub fn status(view: &SessionsView, book: &SessionBook, sessions: &Sessions, ages: Ages, now: Now) -> SessionsStatus {
    let grace = sessions.grace.as_secs_f64();
    let wall = |mono: f64| now.wall_of(mono);
    let c = view.counts;
    let mut rows = Vec::new();
    let (mut live_listed, mut live_omitted) = (0, 0u64);
    for row in &view.sessions {
        // Leftovers (ended sessions) are listed whole; live sessions up to the caps.
        let whole = row.ended || row.reported;
        if !whole {
            if live_listed == MAX_STATUS_SESSIONS {
                live_omitted += 1;
                continue;
            }
            live_listed += 1;
        }
        let listed = if whole { row.members.len() } else { MAX_STATUS_PROCESSES };
        let ended = book.ended.get(&row.id);
        let info = match ended {
            Some(e) => Some(&e.root),
            None => book.roots.get(&row.id).or(book.reported.get(&row.id)),
        };
        let root = row.root_state.or(info.map(|i| i.root));
        let (stage, due_at) = match ended.map(|e| (e.ended_at, e.phase)) {
            _ if row.reported => ("reported", None),
            None if row.ended => ("grace", Some(now.wall + grace)),
            None => ("live", None),
            Some((at, Phase::Grace)) => ("grace", Some(wall(at + grace))),
            Some((_, Phase::Term { at })) => ("stopping", Some(wall(at + STOP_WAIT))),
            Some((_, Phase::Kill { at, .. })) => ("stopping", Some(wall(at + KILL_CHECK))),
        };
        rows.push(SessionStatus {
            root_pid: row.root.pid,
            root_start: row.root.start_ticks,
            root_name: root.map(|r| r.comm.to_string()).unwrap_or_default(),
            command: info.map(|i| crate::escape::text(&i.command)).unwrap_or_default(),
            command_omitted_bytes: info.map_or(0, |i| i.command_len.saturating_sub(i.command.len()) as u64),
            since: info.map(|i| i.since),
            root_age_secs: row.root_state.map(|r| ages.of(&r, now.wall)),
            stage: stage.into(),
            ended_at: ended.map(|e| wall(e.ended_at)),
            due_at,
            processes: row
                .members
                .iter()
                .take(listed)
                .map(|p| SessionProcess { pid: p.id.pid, start: p.id.start_ticks, name: p.comm.to_string() })
                .collect(),
            processes_omitted: row.members.len().saturating_sub(listed) as u64,
        });
    }
    let leftovers_of = |reported: bool| {
        view.sessions.iter().filter(|r| r.ended && r.reported == reported).map(|r| r.members.len() as u64).sum::<u64>()
    };
    let caps = SessionCaps {
        sessions: c.caps.sessions,
        members: c.caps.members,
        nodes: c.caps.nodes,
        pending_execs: c.caps.pending_execs,
        reported: c.caps.reported,
        candidates: book.reading.candidates,
        command_bytes: book.reading.command_bytes,
    };
    SessionsStatus {
        leftovers: sessions.leftovers.token().into(),
        grace_secs: grace,
        live: c.live,
        ended: c.ended,
        reported: c.reported,
        pending_leftovers: leftovers_of(false),
        reported_leftovers: leftovers_of(true),
        leftovers_total: book.totals.leftovers,
        reaped_total: book.totals.reaped,
        stopped_total: book.totals.stopped,
        tracked: c.nodes,
        pending_execs: c.pending,
        untracked_total: c.untracked_total,
        unclassified_total: c.unclassified_total,
        roots_refused_total: c.roots_refused_total,
        caps,
        sessions_omitted: live_omitted,
        sessions: rows,
    }
}
