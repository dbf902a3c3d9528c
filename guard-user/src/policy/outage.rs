//! Said once per outage: a sandboxed matcher (the `excludeCommands` one, or the roots' one) that
//! cannot run is logged when the outage starts (`WARN pattern_matcher_down reason=<which>`), not
//! at every tick it lasts; a tick that finds it running again ends the outage.
use crate::log::{Line, Notice, What};

/// One matcher's outage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outage {
    down: bool,
}

impl Outage {
    /// Whether the matcher runs at this tick (`up`); the line when an outage starts.
    /// `reason`: which matcher (`worker`, `roots_worker`).
    pub fn observe(&mut self, up: bool, reason: &'static str) -> Option<Line> {
        let starts = !up && !self.down;
        self.down = !up;
        starts.then(|| Line::Warn(Notice::new(What::PatternMatcherDown).with("reason", reason)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_said_once_when_it_starts_and_again_only_after_it_ended() {
        let mut o = Outage::default();
        let said: Vec<bool> = [true, false, false, false, true, false]
            .iter()
            .map(|&up| o.observe(up, "roots_worker").is_some())
            .collect();
        assert_eq!(said, [false, true, false, false, false, true]);
        let line = Outage::default().observe(false, "roots_worker").unwrap();
        assert_eq!(line, Line::Warn(Notice::new(What::PatternMatcherDown).with("reason", "roots_worker")));
    }
}
