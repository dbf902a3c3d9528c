//! The daemon's two clocks (docs/architecture.md, "Time").
//!
//! Elapsed time — how long a name has been flagged, when its enforcement or warning is due, the
//! 24 h of `REPEAT`, the stall watch's windows — is measured on a monotonic clock, so a step of
//! the wall clock (NTP, a manual `date`) never makes an enforcement due early and never loses a
//! clock. Wall time is only what the state file keeps across restarts and what people read
//! (`status`' "flagged since").
//!
//! The daemon holds its [`State`] with every time on the monotonic clock. [`to_memory`] maps a
//! file's wall times there (as long ago as the wall clock says, a time in the future read as
//! now); [`to_file`] maps them back with the wall clock of the moment of writing, so a file
//! written after a step tells the next daemon the elapsed times this one measured.
use super::FlagClocks;
use crate::domain::State;

/// "Now" on both clocks, read together. Seconds: unix time on the wall clock, any origin on the
/// monotonic one (only differences count).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Now {
    pub wall: f64,
    pub mono: f64,
}

impl Now {
    /// Both clocks at `t`: a one-shot reader (`explain`) and tests, where no step can happen.
    #[cfg(any(test, feature = "testing"))]
    pub fn same(t: f64) -> Now {
        Now { wall: t, mono: t }
    }

    /// Wall minus monotonic: changes only when the wall clock is stepped (or slewed).
    pub fn offset(&self) -> f64 {
        self.wall - self.mono
    }

    /// A wall time on the monotonic clock: as long before now as it is on the wall clock; a time
    /// in the future is read as now.
    pub fn mono_of(&self, wall: f64) -> f64 {
        self.mono - (self.wall - wall).max(0.0)
    }

    /// A monotonic instant as wall time now (ms precision, what the file keeps).
    pub fn wall_of(&self, mono: f64) -> f64 {
        ((self.wall - (self.mono - mono)) * 1000.0).round() / 1000.0
    }
}

fn map_times(state: &State, f: impl Fn(f64) -> f64) -> State {
    let clocks = |m: &FlagClocks| -> FlagClocks { m.iter().map(|(k, t)| (*k, f(*t))).collect() };
    let mut repeats = state.repeats.clone();
    for h in repeats.values_mut() {
        for e in &mut h.enforcements {
            e.0 = f(e.0);
        }
        h.reported = h.reported.map(&f);
    }
    State { clocks: clocks(&state.clocks), warned: clocks(&state.warned), repeats }
}

/// A state file's state (wall times) as the daemon holds it (monotonic; the future read as now).
pub fn to_memory(file: &State, now: Now) -> State {
    map_times(file, |t| now.mono_of(t))
}

/// The daemon's state (monotonic) as the state file keeps it (wall times of now).
pub fn to_file(memory: &State, now: Now) -> State {
    map_times(memory, |t| now.wall_of(t))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{comm::Comm, domain::RepeatHistory};

    #[test]
    fn a_file_time_keeps_its_age_and_a_future_one_is_read_as_now() {
        let now = Now { wall: 1_800_000_000.0, mono: 5_000.0 };
        assert_eq!(now.mono_of(1_800_000_000.0 - 600.0), 4_400.0);
        assert_eq!(now.mono_of(1_800_000_000.0 + 3.0 * 3600.0), 5_000.0, "the future is now");
        assert_eq!(now.mono_of(f64::MAX), 5_000.0);
        assert_eq!(now.wall_of(4_400.0), 1_800_000_000.0 - 600.0);
    }

    #[test]
    fn a_state_written_after_a_wall_step_keeps_the_elapsed_times_it_measured() {
        let name = Comm::new(b"pile");
        let file = State {
            clocks: FlagClocks::from([(name, 1_000.0)]),
            warned: FlagClocks::from([(name, 1_000.0)]),
            repeats: BTreeMap::from([(name, RepeatHistory { enforcements: vec![(900.0, 2)], reported: Some(9e12) })]),
        };
        let before = Now { wall: 1_600.0, mono: 50.0 };
        let mem = to_memory(&file, before);
        assert_eq!(mem.clocks[&name], -550.0);
        assert_eq!(mem.warned[&name], mem.clocks[&name], "the warning still names the same incident");
        assert_eq!(mem.repeats[&name].reported, Some(50.0), "a report in the future is read as now");
        // 100 s later the wall clock has been stepped 3 h forward: the file says what was measured.
        let after = Now { wall: 1_700.0 + 3.0 * 3600.0, mono: 150.0 };
        let back = to_file(&mem, after);
        assert_eq!(after.wall - back.clocks[&name], 700.0, "flagged 700 s ago, not 3 h 700 s");
        assert_eq!(back.warned[&name], back.clocks[&name]);
        let unstepped = to_memory(&file, Now { wall: 1_700.0, mono: 150.0 });
        assert_eq!(to_memory(&back, after).clocks, unstepped.clocks, "a restart after the step sees the same age");
    }
}
