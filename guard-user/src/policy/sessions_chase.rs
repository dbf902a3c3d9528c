//! The chase between a stop's rounds (see [`super::sessions`]): what the members a round just
//! signalled fork meanwhile, signalled before they can fork again.
//!
//! A fork is ended on the same terms as every leftover: never a name in `excludes`, and only on
//! an `excludeCommands` verdict of `End` reached on the command line it has *now*. A fork starts
//! with its parent's command line, whose `End` was just reached, but it can rewrite it without an
//! exec (`setproctitle`, writing over its argv) to one a pattern protects; so the tick reads
//! each fork's command line at the chase, and a fork whose text it cannot judge then (not read in
//! time, or a text no verdict of this tick covers) is left to the next round, which reads and
//! matches it as it does every member.
use std::collections::HashMap;

use super::{
    sessions::{Phase, ReapTarget, SessionBook},
    CmdVerdict, Signal,
};
use crate::{config::Config, event::ProcState, lineage::SessionsView};

/// Every doomed member (see [`crate::lineage::LineageCmd::Doom`]: forked from a member the stop
/// signalled, no exec since) of each session being stopped that nothing signalled yet and that is
/// not protected, with the signal of its session's phase (SIGTERM or SIGKILL). Never in a dry run
/// (nothing is doomed then), never a name in `excludes`.
fn candidates<'v>(
    view: &'v SessionsView,
    book: &'v SessionBook,
    config: &'v Config,
) -> impl Iterator<Item = (ReapTarget, Signal)> + 'v {
    view.sessions.iter().filter(|r| r.ended && !r.reported).flat_map(move |row| {
        let e = book.ended.get(&row.id);
        let signal = e.and_then(|e| match e.phase {
            Phase::Grace => None,
            Phase::Term { .. } => Some(Signal::Term),
            Phase::Kill { .. } => Some(Signal::Kill),
        });
        row.members.iter().filter_map(move |p| {
            let (e, signal) = (e?, signal?);
            let skip = !row.doomed.contains(&p.id)
                || e.signalled.contains(&p.id)
                || e.protected.contains(&p.id)
                || config.is_excluded(&p.comm);
            (!skip).then_some((ReapTarget { proc: *p, session: row.id, root_pid: e.root.root.id.pid }, signal))
        })
    })
}

/// The processes whose `excludeCommands` verdicts [`chase`] needs: its candidates.
pub fn chase_asks(view: &SessionsView, book: &SessionBook, config: &Config) -> Vec<ProcState> {
    candidates(view, book, config).map(|(t, _)| t.proc).collect()
}

/// What the chase signals now, and with which signal: the candidates whose command line, read at
/// the chase, has the verdict `End` in `verdicts`. The rest is left to the next round.
pub fn chase(
    view: &SessionsView,
    book: &SessionBook,
    config: &Config,
    verdicts: &HashMap<crate::event::ProcId, CmdVerdict>,
) -> Vec<(ReapTarget, Signal)> {
    candidates(view, book, config).filter(|(t, _)| verdicts.get(&t.proc.id) == Some(&CmdVerdict::End)).collect()
}
