//! What the policy remembers between ticks, and every rule about that memory
//! (docs/architecture.md, the tick): the flag clocks and the incidents (read from the state file
//! once, then written back only when it is due), the stall watch's tracks, and what is said only
//! once (a matcher outage, each unknown config key).
//!
//! The daemon's tick only does IO around it: gather (`daemon::gather`, which hands the state
//! file to [`Memory::load`] the first time), [`Memory::begin`] → a [`Plan`], signal the plan's
//! targets, [`Plan::finish`] with their outcomes → [`Finished`] (its lines, the state to save,
//! its counts), write. `explain` runs the same [`Memory::begin`] on the same gathered inputs and
//! never finishes: it signals nothing and saves nothing.
use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use super::{
    decide::{after_signals, complete, decide, AccountView, CmdVerdict, TickInput, TickPlan},
    incidents::{self, Incidents},
    stall::StallState,
    time, FlagClocks, Now,
};
use crate::{
    config::{self, Config, StallWatch},
    domain::{NameStatus, Outcome, PeggedProcess, RepeatOffender, State},
    event::{ProcId, ProcState},
    log::{Line, Notice, What},
};

/// The flag clocks and the incidents as the daemon holds them: every time on the monotonic clock
/// ([`time`]). The clocks are the authority; the state file only persists them.
#[derive(Clone, Debug, Default, PartialEq)]
struct Held {
    clocks: FlagClocks,
    incidents: Incidents,
}

impl Held {
    /// The one place a [`State`] becomes clocks and incidents ([`Held::to_state`]: and back).
    fn from_state(s: State) -> Held {
        Held { clocks: s.clocks, incidents: Incidents { warned: s.warned, repeats: s.repeats } }
    }

    fn to_state(&self) -> State {
        State {
            clocks: self.clocks.clone(),
            warned: self.incidents.warned.clone(),
            repeats: self.incidents.repeats.clone(),
        }
    }
}

/// What the policy remembers between ticks (see the module doc).
#[derive(Debug, Default)]
pub struct Memory {
    /// `None` until the state file was read, at the first tick with a valid config.
    held: Option<Held>,
    /// Where the clocks were last written successfully, and the wall clock's offset then
    /// ([`Now::offset`]); another `stateFile`, a failed write, or a step of the wall clock (the
    /// file's wall times would be off by it) makes the next tick write them again.
    persisted_at: Option<(PathBuf, f64)>,
    /// The stall watch's tracks (docs/configuration.md).
    stall: StallState,
    /// Unknown config keys already warned about (once per key per run, not every tick), at most
    /// [`config::MAX_UNKNOWN_KEYS`]: past it, one line says the rest are not reported.
    warned_keys: BTreeSet<String>,
    /// The line saying unknown keys are no longer reported one by one was written.
    unknown_keys_capped: bool,
    /// The sandboxed matcher's outage (warned once per outage).
    matcher: super::outage::Outage,
    /// Keys written more than once already warned about (once per key per run). Only keys guard
    /// knows are tracked ([`config::RepeatedKey`]), so this holds at most one per known key.
    warned_repeats: BTreeSet<String>,
    /// A tick left a command line unread for lack of time (warned once per run).
    cmdlines_unread: bool,
    /// `ERROR` lines said since the last `TICK_COMPLETE` (its `errors=`).
    errors: u32,
}

/// What a tick gathered for [`Memory::begin`] (the clocks and incidents are the memory's).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub view: &'a AccountView,
    pub config: &'a Config,
    pub now: Now,
    /// A verdict for the command line of every process that could be ended.
    pub verdicts: &'a HashMap<ProcId, CmdVerdict>,
    /// `--dry-run`: the plan says to verify its targets, never to signal them.
    pub dry_run: bool,
}

/// One tick's decision, holding the memory until its outcomes are known.
#[derive(Debug)]
pub struct Plan<'a> {
    memory: &'a mut Memory,
    config: &'a Config,
    now: Now,
    decided: TickPlan,
}

/// The state file to write (the tick writes it, then reports back through [`Memory::saved`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Save {
    pub path: PathBuf,
    /// Wall times of now ([`time::to_file`]).
    pub file: State,
    offset: f64,
}

/// `TICK_COMPLETE`'s figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Names at/over the threshold.
    pub flagged: usize,
    /// `KILLED` lines.
    pub kills: u64,
}

/// What a finished tick has left to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// `KILLED`/`DRY_RUN`/`SKIPPED` in target order, then any `REPEAT`.
    pub lines: Vec<Line>,
    /// The state file to write, when it is due.
    pub save: Option<Save>,
    pub counts: Counts,
    /// Status rows (a warned name's row says so) and repeat offenders.
    pub status: Vec<NameStatus>,
    pub offenders: Vec<RepeatOffender>,
    /// The earliest enforcement or warning still ahead (monotonic clock).
    pub next_deadline: Option<f64>,
}

impl Memory {
    /// Whether the state file must be read (once per run, at the first tick with a valid config).
    pub fn needs_state(&self) -> bool {
        self.held.is_none()
    }

    /// The state file as read (wall times). One that cannot be read or breaks a bound is treated
    /// as empty (it delays enforcement by one `timeout`) and said: `ERROR <why>`, the notice the
    /// state file's reader gave (`state_malformed …` or `state_rejected …`).
    pub fn load(&mut self, file: Result<State, Notice>, now: Now) -> Option<Line> {
        let (held, line) = match file {
            Ok(st) => (Held::from_state(time::to_memory(&st, now)), None),
            Err(why) => {
                self.errors += 1;
                (Held::default(), Some(Line::Error(why)))
            }
        };
        self.held = Some(held);
        line
    }

    /// The flag clocks held (the matching round serves the name flagged longest first).
    pub fn clocks(&self) -> &FlagClocks {
        static NONE: FlagClocks = FlagClocks::new();
        self.held.as_ref().map_or(&NONE, |h| &h.clocks)
    }

    /// Whether the sandboxed matcher holds this tick's list (`up`). While it is down every
    /// command line it would have been asked about is protected ([`super::cmdline::route`]);
    /// the outage is said once, when it starts: `WARN pattern_matcher_down reason=worker`.
    pub fn matcher(&mut self, up: bool) -> Option<Line> {
        self.matcher.observe(up, "worker")
    }

    /// Command lines this tick could not read in time (`unread`; `slow` of them because their
    /// own read overran its share): said once per run, at the first tick that leaves one
    /// unread, `WARN cmdline_read_budget unread=<n> slow=<k>`; the status and the metrics count
    /// them at every tick. Once, not per outage: a process that makes its memory slow to read
    /// can do so at every other tick.
    pub fn cmdlines_unread(&mut self, unread: usize, slow: usize) -> Option<Line> {
        let first = unread > 0 && !self.cmdlines_unread;
        self.cmdlines_unread |= unread > 0;
        first.then(|| Line::Warn(Notice::new(What::CmdlineReadBudget).with("unread", unread).with("slow", slow)))
    }

    /// `WARN config_unknown_key` once per key per run, for at most [`config::MAX_UNKNOWN_KEYS`]
    /// keys; then one `WARN config_unknown_keys_unreported`, and the set stops growing. `path`:
    /// the config file's, as bytes.
    pub fn unknown_keys(&mut self, config: &Config, path: &[u8]) -> Vec<Line> {
        let mut lines = Vec::new();
        let mut over = config.unknown_keys_unlisted > 0;
        for key in &config.unknown_keys {
            if self.warned_keys.contains(key) {
                continue;
            }
            if self.warned_keys.len() >= config::MAX_UNKNOWN_KEYS {
                over = true;
                break;
            }
            self.warned_keys.insert(key.clone());
            lines.push(Line::Warn(Notice::new(What::ConfigUnknownKey).with("key", key.as_str()).with("path", path)));
        }
        if over && !self.unknown_keys_capped {
            self.unknown_keys_capped = true;
            lines.push(Line::Warn(
                Notice::new(What::ConfigUnknownKeysUnreported)
                    .with("limit", config::MAX_UNKNOWN_KEYS)
                    .with("path", path),
            ));
        }
        lines
    }

    /// `WARN config_repeated_key key=<k> count=<n> lines=<l,…> path=<config>` once per key per
    /// run: the daemon uses the last occurrence (as every JSON reader does), which the operator
    /// reading the first one may not expect; `validate` refuses the file.
    pub fn repeated_keys(&mut self, config: &Config, path: &[u8]) -> Vec<Line> {
        let mut lines = Vec::new();
        for r in &config.repeated_keys {
            if self.warned_repeats.insert(r.key.clone()) {
                let at: Vec<String> = r.lines.iter().map(|l| l.to_string()).collect();
                lines.push(Line::Warn(
                    Notice::new(What::ConfigRepeatedKey)
                        .with("key", r.key.as_str())
                        .with("count", r.count)
                        .with("lines", at.join(",").as_str())
                        .with("path", path),
                ));
            }
        }
        lines
    }

    /// Decides the tick ([`decide`]) on the clocks and incidents held.
    pub fn begin<'a>(&'a mut self, input: Input<'a>) -> Plan<'a> {
        let Input { view, config, now, verdicts, dry_run } = input;
        let held = self.held.get_or_insert_default();
        let clocks = &held.clocks;
        let decided = decide(&TickInput { view, config, clocks, now, verdicts, incidents: &held.incidents, dry_run });
        Plan { memory: self, config, now, decided }
    }

    /// The save-the-state rule: write when the clocks or incidents changed, when this `stateFile`
    /// does not hold them yet (another path, or the last write failed), or when the wall clock
    /// stepped by more than a second since (the file keeps wall times; slewing drifts far slower).
    fn save_due(&self, next: &Held, path: &Path, now: Now) -> bool {
        let current =
            self.persisted_at.as_ref().is_some_and(|(p, offset)| p == path && (now.offset() - offset).abs() <= 1.0);
        self.held.as_ref() != Some(next) || !current
    }

    /// Whether writing `save` succeeded (`written`). A write that failed is tried again next tick
    /// and said: `ERROR state_unwritable path=<path>` (enforcement goes on from memory; the
    /// shell traces the error itself).
    pub fn saved(&mut self, save: &Save, written: bool) -> Option<Line> {
        match written {
            true => {
                self.persisted_at = Some((save.path.clone(), save.offset));
                None
            }
            false => {
                self.persisted_at = None;
                self.errors += 1;
                let path = save.path.as_os_str().as_encoded_bytes();
                Some(Line::Error(Notice::new(What::StateUnwritable).with("path", path)))
            }
        }
    }

    /// The stall watch is off: its tracks are forgotten (an incident does not outlive it).
    pub fn stall_off(&mut self) {
        self.stall = StallState::default();
    }

    /// One CPU sample of the account's processes: the stall watch's lines (report only).
    pub fn observe_stall(&mut self, samples: &[(ProcState, u64)], cfg: &StallWatch, now: f64) -> Vec<Line> {
        self.stall.observe(samples, cfg, now)
    }

    /// The processes in a stall incident now, for `status`.
    pub fn pegged(&self) -> Vec<PeggedProcess> {
        self.stall.pegged()
    }

    /// `TICK_COMPLETE` for a tick with `counts`, and the errors said since the last one.
    pub fn complete(&mut self, counts: Counts) -> Line {
        complete(counts.flagged, counts.kills, std::mem::take(&mut self.errors))
    }

    /// A tick with an invalid config: `ERROR <reason>`, then `TICK_COMPLETE` with one error
    /// and nothing flagged or ended. Nothing held changes (the clocks survive the outage).
    pub fn config_error(&mut self, what: What, reason: String) -> [Line; 2] {
        self.errors = 0;
        [Line::Error(Notice::reason(what, reason)), complete(0, 0, 1)]
    }
}

impl<'a> Plan<'a> {
    /// The decision: lines to write before any signal, targets, status rows.
    pub fn decided(&self) -> &TickPlan {
        &self.decided
    }

    /// Every process to end (or, in dry run, to verify), across every due name, in one batch.
    pub fn targets(&self) -> Vec<ProcState> {
        self.decided.targets.iter().map(|t| t.proc).collect()
    }

    /// How [`Plan::targets`] are signalled (a dry run verifies them only).
    pub fn signal(&self) -> super::Signal {
        self.decided.signal
    }

    /// The signals' outcomes (`outcomes[i]` belongs to target `i`) → their lines, the
    /// enforcements counted for `REPEAT`, the state to save when it is due, and the memory
    /// holding this tick's clocks and incidents.
    pub fn finish(self, outcomes: &[Outcome]) -> Finished {
        let Plan { memory, config, now, decided } = self;
        let after = after_signals(&decided, outcomes, config, now.mono);
        let held = Held { clocks: decided.clocks, incidents: after.incidents };
        let save = memory.save_due(&held, &config.state_file, now).then(|| Save {
            path: config.state_file.clone(),
            file: time::to_file(&held.to_state(), now),
            offset: now.offset(),
        });
        let offenders = incidents::offenders(&held.incidents, config, now.mono);
        memory.held = Some(held);
        Finished {
            lines: after.lines,
            save,
            counts: Counts { flagged: decided.flagged, kills: after.kills },
            status: decided.status,
            offenders,
            next_deadline: decided.next_deadline,
        }
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
