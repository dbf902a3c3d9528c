//! The daemon's side of [`crate::pattern::match_all`]: once per `excludeCommands` list, the
//! sandboxed matcher is asked whether one pattern matches every command line, and the log says so
//! once (`WARN pattern_matches_all index=<i>`). The pattern is honoured all the same: it protects
//! what it matches, as the operator wrote.
use std::time::Instant;

use super::effects::Classifier;
use crate::pattern::{
    match_all::{list_verdict, matches_every_probe, roots_verdict, too_broad_for_roots, ListVerdict, PROBES},
    MatchOutcome, Progress, Resume,
};

/// The last list checked, so a list costs one check, not one per tick. Bounded by the config's
/// own bounds on the list (256 patterns of 1024 bytes).
#[derive(Default)]
pub struct MatchAllWatch {
    checked: Option<Vec<String>>,
}

impl MatchAllWatch {
    /// For a list not checked yet: the index of a pattern that matches every command line. `None`
    /// for a list already checked, one the matcher refuses (the tick reports that itself), or one
    /// where no pattern does.
    ///
    /// Costs one classification of the short [`PROBES`] against the compiled list; only when the
    /// list as a whole matches every probe, by different patterns, are the later patterns compiled
    /// and asked one by one, until `deadline`. The classifier is left holding whichever list it
    /// compiled last: the tick sets the config's list right after (a no-op when it is that list).
    pub fn check(&mut self, classifier: &mut dyn Classifier, patterns: &[String], deadline: Instant) -> Option<usize> {
        if patterns.is_empty() || self.checked.as_deref() == Some(patterns) {
            return None;
        }
        classifier.set_patterns(patterns).ok()?;
        self.checked = Some(patterns.to_vec());
        match list_verdict(&probe(classifier, deadline)) {
            ListVerdict::Found(index) => Some(index),
            ListVerdict::None => None,
            ListVerdict::From(first) => (first..patterns.len()).take_while(|_| Instant::now() < deadline).find(|&i| {
                classifier.set_patterns(std::slice::from_ref(&patterns[i])).is_ok()
                    && matches_every_probe(&probe(classifier, deadline))
            }),
        }
    }
}

/// `sessions.roots`, checked once per list: a pattern (or the list together) that matches the
/// empty command line or every other one is refused (`ERROR config_malformed sessions.roots`),
/// and the answer is kept, so a refused list stays refused without asking the matcher again.
#[derive(Default)]
pub struct RootsWatch {
    checked: Option<(Vec<String>, Option<Option<usize>>)>,
}

impl RootsWatch {
    /// `Some(Some(i))`: pattern `i` is too broad; `Some(None)`: the list together is; `None`: the
    /// list names roots (or the matcher refuses it, which the tick reports itself, or could not
    /// decide by `deadline`, which is asked again next tick). Leaves the classifier holding
    /// whichever list it compiled last, as [`MatchAllWatch::check`] does.
    pub fn check(
        &mut self,
        classifier: &mut dyn Classifier,
        patterns: &[String],
        deadline: Instant,
    ) -> Option<Option<usize>> {
        if let Some((list, verdict)) = &self.checked {
            if list == patterns {
                return *verdict;
            }
        }
        classifier.set_patterns(patterns).ok()?;
        let verdict = match roots_verdict(&probe(classifier, deadline)) {
            ListVerdict::Found(index) => Some(Some(index)),
            ListVerdict::None => None,
            ListVerdict::From(first) => {
                let mut alone = None;
                for (i, pattern) in patterns.iter().enumerate().skip(first) {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    if classifier.set_patterns(std::slice::from_ref(pattern)).is_ok()
                        && too_broad_for_roots(&probe(classifier, deadline))
                    {
                        alone = Some(i);
                        break;
                    }
                }
                Some(alone)
            }
        };
        self.checked = Some((patterns.to_vec(), verdict));
        verdict
    }
}

/// The verdict on each probe, from scratch (a probe left unsettled at the deadline is `Budget`,
/// which decides nothing).
fn probe(classifier: &mut dyn Classifier, deadline: Instant) -> Vec<MatchOutcome> {
    let from = [Resume::default(); PROBES.len()];
    classifier.classify_from(PROBES, &from, deadline).into_iter().map(Progress::outcome).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::daemon::recording::InProcessClassifier;

    fn list(patterns: &[&str]) -> Vec<String> {
        patterns.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_pattern_matching_everything_is_named_once_per_list() {
        let mut watch = MatchAllWatch::default();
        let mut classifier = InProcessClassifier::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        let shipped = list(crate::config::DEFAULT_EXCLUDE_COMMANDS);
        assert_eq!(watch.check(&mut classifier, &shipped, deadline), None);
        let mut with_all = shipped.clone();
        with_all.push("a||b".into());
        assert_eq!(watch.check(&mut classifier, &with_all, deadline), Some(4));
        // The same list again: said once.
        assert_eq!(watch.check(&mut classifier, &with_all, deadline), None);
        // Hidden behind patterns that answer some probes first, and found by asking them alone.
        assert_eq!(watch.check(&mut classifier, &list(&["^$", "x", ".*"]), deadline), Some(2));
        // Together but not alone: no single pattern to name.
        assert_eq!(watch.check(&mut classifier, &list(&["^$", "."]), deadline), None);
        // A list the matcher refuses is not checked (the tick reports the error) nor remembered.
        assert_eq!(watch.check(&mut classifier, &list(&["(unclosed"]), deadline), None);
        assert!(watch.checked.as_deref() == Some(&list(&["^$", "."])[..]));
    }

    #[test]
    fn a_roots_list_that_makes_every_process_a_root_is_named_and_stays_refused() {
        let mut watch = RootsWatch::default();
        let mut classifier = InProcessClassifier::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(watch.check(&mut classifier, &list(&["(^|/)agent-wrapper( |$)"]), deadline), None);
        assert_eq!(watch.check(&mut classifier, &list(&["(^|/)agent-wrapper( |$)", "^"]), deadline), Some(Some(1)));
        assert_eq!(watch.check(&mut classifier, &list(&["(^|/)agent-wrapper( |$)", "^"]), deadline), Some(Some(1)));
        assert_eq!(watch.check(&mut classifier, &list(&["x", "^[^a-z]", "^[a-z]"]), deadline), Some(None));
        assert_eq!(watch.check(&mut classifier, &list(&["x", "^[^a-z]", "y", "."]), deadline), Some(Some(3)));
    }
}
