//! The tick's side of sessions (docs/configuration.md `sessions`): gather (the command lines of
//! pending execs, read through the tick's command-line reader, within its reading time and the
//! pool of bytes it holds for matchers, and matched against `sessions.roots` in their own
//! sandboxed matcher), decide ([`decide_sessions`] and the rules of `policy::roots`, pure), apply
//! (the lineage's answers to the pump, the lines, the signals the plan names through the
//! enforcer's pidfd and identity check, never a wait, then the chase of what the signalled
//! members forked meanwhile, each fork's command line read again and ended only on a verdict of
//! `End`: `policy::sessions_chase`).
//!
//! Roots are matched here, off the pump: reading `/proc/PID/cmdline` can block on a hostile
//! process, and the pump must keep draining. So a root is recognised by the command line a tick
//! reads after its exec (within one interval of it), and the lineage keeps what the process
//! forks meanwhile in a pending session until the tick says whether it is a root.
use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use super::{
    cmdlines::{CmdlineReader, Read},
    effects::Effects,
    keeper::{LineageMode, MAX_CANDIDATES_PER_TICK},
    match_all::RootsWatch,
    pump::PumpHandle,
    verdicts::VerdictCache,
};
use crate::{
    budget::{Held, Pool, HELD_CMDLINE_BYTES},
    config::{self, Config, ConfigError},
    domain::SessionsStatus,
    event::{clock_ticks_per_sec, ProcId, ProcState},
    lineage::{Caps, LineageCmd, SessionsView},
    log::Kind,
    pattern::Resume,
    policy::{
        outage::Outage,
        roots,
        sessions::{
            after_reap, chase, chase_asks, decide_sessions, due_members, record, status, Ages, ReapTarget, RootsRead,
            SessionBook, SessionLimits, SessionsInput,
        },
        CmdVerdict, Now, Signal,
    },
};

/// The lineage a valid config asks for: on while `sessions` names at least one root.
pub fn mode(config: &Config, uid: u32) -> LineageMode {
    match &config.sessions {
        Some(s) if !s.roots.is_empty() => LineageMode::On { uid },
        _ => LineageMode::Off,
    }
}

/// The matching round for roots: at most 2 s, and a quarter of the tick's deadline; it also ends
/// by [`Ctx::roots_by`] (but never before a quarter of that share), so a stop's signals and
/// chase after it fit the deadline after a long verdict round (a candidate not read waits for
/// the next tick).
fn round_budget(deadline: Duration) -> Duration {
    (deadline / 4).min(Duration::from_secs(2))
}

/// The chase after a stop's signals: at most this long, and this many looks.
const CHASE_FOR: Duration = Duration::from_millis(500);
const CHASE_LOOKS: usize = 64;

/// What the tick holds about sessions between ticks.
#[derive(Default)]
pub struct SessionsTick {
    pub book: SessionBook,
    /// The roots matcher's outage (warned once per outage).
    roots_down: Outage,
    /// Whether the roots list compiled at this tick.
    roots_ok: bool,
    /// Roots lists that would make every process a root, checked once per list.
    broad: RootsWatch,
}

/// What one tick's sessions work left for the report.
#[derive(Default)]
pub struct Done {
    pub next_deadline: Option<f64>,
    pub status: Option<SessionsStatus>,
    /// `SKIPPED` and `DRY_RUN` lines logged, for the totals.
    pub skipped: u64,
    pub dry_runs: u64,
    /// Leftovers ended (their sessions' `REAPED` lines at this tick say so).
    pub ended: u64,
}

impl SessionsTick {
    /// Compiles `sessions.roots` in the roots matcher (once per change). A list it refuses, or
    /// one that would make every process a root, is a config error, as for `excludeCommands`; a
    /// matcher that cannot run leaves the pending execs unclassified until it can (no root is
    /// recognised meanwhile: nothing is reaped).
    pub fn set_roots(&mut self, fx: &mut Effects, config: &Config, deadline: Instant) -> Result<(), ConfigError> {
        self.roots_ok = false;
        let Some(s) = config.sessions.as_ref().filter(|s| !s.roots.is_empty()) else {
            self.book = SessionBook { totals: self.book.totals, ..Default::default() };
            return Ok(());
        };
        if let Some(index) = self.broad.check(&mut *fx.roots, &s.roots, deadline) {
            let pattern = index.map_or_else(|| s.roots.join(" "), |i| s.roots[i].clone());
            return Err(config::too_broad_root(index, &pattern).into_error().expect("a refused root is an error"));
        }
        let result = fx.roots.set_patterns(&s.roots);
        if let Err(e) = &result {
            if e.is_config_error() {
                tracing::warn!("sessions.roots refused: {}", e.in_list(config::PatternList::SessionsRoots.source()));
                return Err(config::refused_patterns_of(config::PatternList::SessionsRoots, &s.roots, e));
            }
        }
        self.roots_ok = result.is_ok();
        if let Some(line) = self.roots_down.observe(self.roots_ok, "roots_worker") {
            if let Err(e) = &result {
                tracing::error!("{e}");
            }
            fx.log.write(&line);
        }
        Ok(())
    }

    /// The members whose `excludeCommands` verdicts this tick needs (added to the tick's own
    /// round, so every command line is matched once per tick).
    pub fn due(&self, view: Option<&SessionsView>, config: &Config, now: Now) -> Vec<ProcState> {
        match (view, config.sessions.as_ref()) {
            (Some(v), Some(s)) => due_members(v, &self.book, s, now.mono),
            _ => Vec::new(),
        }
    }

    /// Reads, decides and applies (see the module doc).
    pub fn run(&mut self, ctx: Ctx) -> Done {
        let Ctx { fx, pump, view, config, verdicts, cache, now, dry_run, deadline, roots_by, pool } = ctx;
        let (Some(view), Some(sessions)) = (view, config.sessions.as_ref()) else { return Done::default() };
        let roots = if self.roots_ok { read_roots(fx, pool, view, deadline, roots_by) } else { RootsRead::default() };
        let ages = Ages { boot_unix: fx.procs.boot_unix(), ticks_per_sec: clock_ticks_per_sec() };
        let limits = SessionLimits {
            caps: Caps::DAEMON,
            candidates: MAX_CANDIDATES_PER_TICK,
            command_bytes: HELD_CMDLINE_BYTES,
        };
        let input = SessionsInput {
            view,
            config,
            sessions,
            now,
            dry_run,
            ages,
            roots: &roots,
            verdicts,
            book: &self.book,
            limits,
        };
        let mut plan = decide_sessions(&input);
        // The status shows the lineage after this tick's answers (a root recognised now is listed
        // now, not a tick later).
        let mut after = if plan.commands.is_empty() { None } else { pump.lineage_blocking(plan.commands.clone()) };
        for line in &plan.lines {
            fx.emit(line, now.wall);
        }
        let procs = |t: &[ReapTarget]| t.iter().map(|t| t.proc).collect::<Vec<_>>();
        let term = fx.signals.send(plan.term_signal, &procs(&plan.term));
        let kill = fx.signals.send(Signal::Kill, &procs(&plan.kill));
        let after_lines = after_reap(&mut plan, &term, &kill);
        for line in &after_lines {
            fx.emit(line, now.wall);
        }
        self.book = plan.book;
        if plan.term_signal != Signal::Verify && (!plan.term.is_empty() || !plan.kill.is_empty()) {
            if let Some(v) = self.chase(fx, pump, config, cache, pool) {
                after = Some(v);
            }
        }
        let status = status(after.as_ref().unwrap_or(view), &self.book, sessions, ages, now);
        let count = |kind| plan.lines.iter().chain(&after_lines).filter(|l| l.kind() == kind).count() as u64;
        Done {
            next_deadline: plan.next_deadline,
            status: Some(status),
            skipped: count(Kind::Skipped),
            dry_runs: count(Kind::DryRun),
            ended: plan.ended,
        }
    }

    /// The chase (`policy::sessions::chase`): looks at the lineage again, events drained, and
    /// signals what the members just signalled forked meanwhile, each fork once and only on the
    /// verdict `End` for the command line it has now ([`chase_verdicts`]), until nothing new is
    /// signalled or its time is up. Returns the last look.
    fn chase(
        &mut self,
        fx: &mut Effects,
        pump: &PumpHandle,
        config: &Config,
        cache: &VerdictCache,
        pool: &Pool,
    ) -> Option<SessionsView> {
        let until = Instant::now() + CHASE_FOR;
        let mut last = None;
        let mut doom: Vec<LineageCmd> = Vec::new();
        let mut tried: BTreeSet<ProcId> = BTreeSet::new();
        for _ in 0..CHASE_LOOKS {
            let view = pump.lineage_blocking(std::mem::take(&mut doom))?;
            // Each fork is read and judged once per chase: one left now waits for the next round.
            let asks: Vec<ProcState> =
                chase_asks(&view, &self.book, config).into_iter().filter(|p| tried.insert(p.id)).collect();
            let max = fx.classifier.max_text_bytes();
            let judged = if asks.is_empty() {
                HashMap::new()
            } else {
                let mut reader = CmdlineReader::new(&mut *fx.procs, pool.clone(), until, CHASE_FOR / 8);
                chase_verdicts(&mut reader, max, cache, config, &asks)
            };
            let targets = chase(&view, &self.book, config, &judged);
            last = Some(view);
            if targets.is_empty() || Instant::now() >= until {
                break;
            }
            for signal in [Signal::Term, Signal::Kill] {
                let these: Vec<ReapTarget> =
                    targets.iter().filter(|(_, s)| *s == signal).map(|(t, _)| t.clone()).collect();
                let procs: Vec<ProcState> = these.iter().map(|t| t.proc).collect();
                let outcomes = fx.signals.send(signal, &procs);
                record(&mut self.book, &these, &outcomes);
                doom.extend(these.iter().map(|t| LineageCmd::Doom(t.proc.id)));
            }
        }
        last
    }
}

/// The chase's verdicts on `asks` (`policy::sessions_chase`): `End` for a fork whose command line,
/// read now (within the chase's time), is a text this tick's round settled `End` on (the one it
/// kept from its parent, typically); nothing for any other (rewritten, unread, too long, gone),
/// which the next round reads and matches. Without patterns every live fork is `End`, as in
/// `daemon::verdicts`: an empty list protects nothing.
fn chase_verdicts(
    reader: &mut CmdlineReader,
    max: usize,
    cache: &VerdictCache,
    config: &Config,
    asks: &[ProcState],
) -> HashMap<ProcId, CmdVerdict> {
    if config.exclude_commands.is_empty() {
        return asks.iter().filter(|p| reader.exists(p.id.pid)).map(|p| (p.id, CmdVerdict::End)).collect();
    }
    let ends = cache.end_texts();
    if ends.is_empty() {
        return HashMap::new();
    }
    let mut out = HashMap::new();
    for p in asks {
        let read = reader.read(p.id.pid, max) == Read::Text;
        if read && reader.text().len() <= max && ends.contains(&cache.key(reader.text())) {
            out.insert(p.id, CmdVerdict::End);
        }
    }
    out
}

/// What [`SessionsTick::run`] works with.
pub struct Ctx<'a> {
    pub fx: &'a mut Effects,
    pub pump: &'a PumpHandle,
    pub view: Option<&'a SessionsView>,
    pub config: &'a Config,
    /// `excludeCommands` verdicts, including those of [`SessionsTick::due`]'s members.
    pub verdicts: &'a HashMap<ProcId, CmdVerdict>,
    /// The cache those verdicts were kept in: the chase judges forks by it.
    pub cache: &'a VerdictCache,
    /// Both clocks: the steps are timed on the monotonic one, the status shows wall times.
    pub now: Now,
    pub dry_run: bool,
    /// The tick's deadline; the roots round takes a share of it.
    pub deadline: Duration,
    /// When the roots round ends at the latest: three quarters into the tick, leaving the rest
    /// to a stop's signals (SIGKILL 0.5 s after SIGTERM) and its chase (0.5 s at most).
    pub roots_by: Instant,
    /// The tick's pool of command-line bytes held for a matcher.
    pub pool: &'a Pool,
}

/// [`roots::CandidateReader`] over the tick's [`CmdlineReader`]: a text waiting for the roots'
/// round is held in the tick's pool; one the pool has no room for, or that is not read in time,
/// waits for the next tick.
struct Candidates<'r, 'p> {
    reader: &'r mut CmdlineReader<'p>,
    max: usize,
}

impl roots::CandidateReader for Candidates<'_, '_> {
    type Held = Held;

    fn read(&mut self, pid: u32) -> roots::Got<Held> {
        match self.reader.read(pid, self.max) {
            Read::Text if self.reader.text().len() > self.max => roots::Got::TooLong,
            Read::Text => match self.reader.hold(self.reader.text()) {
                Some(held) => roots::Got::Text(held),
                None => roots::Got::Later,
            },
            Read::Gone => roots::Got::Gone,
            Read::Deferred(_) => roots::Got::Later,
        }
    }

    fn reads_as(&mut self, pid: u32, text: &[u8]) -> bool {
        self.reader.read(pid, self.max) == Read::Text && self.reader.text() == text
    }
}

/// The candidates' command lines, read round-robin through the tick's reader and judged by
/// `policy::roots`; the texts it asks about are matched in one bounded round and dropped after it.
fn read_roots(fx: &mut Effects, pool: &Pool, view: &SessionsView, deadline: Duration, by: Instant) -> RootsRead {
    let max = fx.roots.max_text_bytes();
    let now = Instant::now();
    // Never less than a quarter of its own share: recognition always moves on, even in a tick
    // whose verdict round took all it could.
    let share = round_budget(deadline);
    let ends = (now + share).min(by).max(now + share / 4);
    let mut reader = CmdlineReader::for_phase(&mut *fx.procs, pool.clone(), now, ends);
    let reading = roots::read_candidates(&view.candidates, &mut Candidates { reader: &mut reader, max });
    drop(reader);
    let (read_after, capped) = (reading.read_after, reading.capped);
    let progress = if reading.asked.is_empty() {
        Vec::new()
    } else {
        let texts: Vec<&[u8]> = reading.asked.iter().map(|(_, t)| &**t).collect();
        let from = vec![Resume::default(); texts.len()];
        fx.roots.classify_from(&texts, &from, ends)
    };
    RootsRead { verdicts: roots::verdicts(reading, &progress).into_iter().collect(), read_after, capped }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{budget::Pool, comm::Comm, config::parse, daemon::recording::FakeProcs,
        pattern::{MatchOutcome, Progress},
    };

    fn proc(pid: u32) -> ProcState {
        ProcState { id: ProcId { pid, start_ticks: u64::from(pid) }, euid: 1000, comm: Comm::new(b"worker") }
    }

    /// The chase reads each fork's command line again: only one still a text the tick's round
    /// settled `End` on is `End`; one rewritten since (`setproctitle` to a protected text), gone,
    /// or longer than the matcher takes is left for the next round.
    #[test]
    fn the_chase_judges_a_fork_by_the_command_line_it_has_now() {
        let config = parse(br#"{"excludeCommands": ["--keep"]}"#, std::path::Path::new("/h")).unwrap();
        let mut cache = VerdictCache::default();
        cache.use_list(&config.exclude_commands);
        // The signalled member 201: "worker --run", settled End; 300: "other --keep", matched.
        cache.store(proc(201).id, cache.key(b"worker --run"), Progress::Settled(MatchOutcome::NoMatch));
        cache.store(proc(300).id, cache.key(b"other --keep"), Progress::Settled(MatchOutcome::Matched(0)));
        let mut procs = FakeProcs::default();
        for (pid, text) in [(202, &b"worker --run"[..]), (203, b"worker --keep"), (204, b"other --keep"), (206, b"x")] {
            procs.0.lock().unwrap().insert(pid, text.to_vec());
        }
        let asks = [proc(202), proc(203), proc(204), proc(205), proc(206)];
        let until = Instant::now() + Duration::from_secs(60);
        let mut reader = CmdlineReader::new(&mut procs, Pool::new(1 << 20), until, Duration::from_secs(10));
        let got = chase_verdicts(&mut reader, 1 << 20, &cache, &config, &asks);
        assert_eq!(got, HashMap::from([(proc(202).id, CmdVerdict::End)]));
        // A text over the matcher's bound is never judged on a prefix.
        let got = chase_verdicts(&mut reader, 4, &cache, &config, &asks);
        assert!(got.is_empty(), "{got:?}");
        // Without patterns every live fork is End, read or not (an empty list protects nothing).
        let none = parse(br#"{"excludeCommands": []}"#, std::path::Path::new("/h")).unwrap();
        let got = chase_verdicts(&mut reader, 1 << 20, &cache, &none, &asks);
        let ended: BTreeSet<u32> = got.iter().filter(|(_, v)| **v == CmdVerdict::End).map(|(id, _)| id.pid).collect();
        assert_eq!(ended, BTreeSet::from([202, 203, 204, 206]));
    }
}
