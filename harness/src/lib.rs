//! guard's test harness: the runner of every integration test binary (`guard-user/tests/*.rs`,
//! `tests/tests/*.rs`) and the helpers they share.
//!
//! libtest decides before a test runs whether it is ignored, and only from the source, so a
//! test that needs root could only print "skipped" and pass. Here each test declares what it
//! needs, the harness looks, and a test whose need is missing is **ignored** (libtest's summary
//! counts it, and the reason is printed once), or **fails** with the reason when the run requires
//! that need (`GUARD_TESTS_REQUIRE`, see [`need`]):
//!
//! ```ignore
//! use guard_test::guard_test;
//!
//! #[guard_test(needs = [root, ebpf])]
//! fn a_pile_is_ended() { … }
//!
//! guard_test::main!();
//! ```
//!
//! The test binary's target says `harness = false` in its Cargo.toml; the runner is
//! libtest-mimic, which takes libtest's arguments (filters, `--exact`, `--skip`, `--ignored`,
//! `--include-ignored`, `--list`, `--test-threads`). Unlike libtest it does not capture a test's
//! output.
//!
//! # Layout
//! - [`need`]: the needs, how each is found, `GUARD_TESTS_REQUIRE`;
//! - [`child`]: a child process of the test binary itself running a helper mode, killed on drop;
//! - [`rng`]: the one deterministic generator fuzz-style tests draw from;
//! - [`wait`]: waiting on a condition, with a bound that fails with a message;
//! - [`serial`]: the host-wide lock every test that runs processes as the test accounts holds.
use std::{collections::HashMap, process::ExitCode};

pub mod child;
pub mod need;
pub mod rng;
pub mod serial;
pub mod wait;

pub use guard_test_macros::guard_test;
#[doc(hidden)]
pub use linkme;
pub use need::{Facts, Need};

/// One registered test (written by `#[guard_test]`).
pub struct Test {
    /// The function's name.
    pub name: &'static str,
    /// `module_path!()` where it is written: the crate's name, then any modules.
    pub module: &'static str,
    pub needs: &'static [Need],
    /// Ignored whatever the machine has (`ignore = "why"`), like libtest's `#[ignore]`.
    pub ignore: Option<&'static str>,
    pub run: fn(),
}

impl Test {
    /// The name libtest would give it: the module path below the crate, then the function.
    pub fn full_name(&self) -> String {
        match self.module.split_once("::") {
            Some((_, modules)) => format!("{modules}::{}", self.name),
            None => self.name.to_string(),
        }
    }
}

/// Every test of this binary.
#[linkme::distributed_slice]
pub static TESTS: [Test];

/// The test binary's `main`. With `helpers = f`, a run of the binary with
/// `GUARD_TEST_HELPER=<mode>` in its environment is a helper process: `f(mode)` runs instead of
/// the tests ([`child::Child::helper`]).
///
/// It also fails a build that forgot `harness = false` (the target's tests would otherwise never
/// run): libtest would run the `#[test]` below, which only exists in that case.
#[macro_export]
macro_rules! main {
    () => {
        $crate::main!(@with ::core::option::Option::None);
    };
    (helpers = $helpers:path) => {
        $crate::main!(@with ::core::option::Option::Some($helpers as fn(&str)));
    };
    (@with $helpers:expr) => {
        fn main() -> ::std::process::ExitCode {
            $crate::run($helpers, $crate::Facts { bpf_object: ::guard::ebpf::object_embedded() })
        }

        #[test]
        fn this_test_target_needs_harness_false() {
            panic!(
                "{} runs under guard_test's harness: add `[[test]] name = \"…\" harness = false` for it to its Cargo.toml",
                file!()
            );
        }
    };
}

/// What [`run`] was told about this build.
static FACTS: std::sync::OnceLock<Facts> = std::sync::OnceLock::new();

/// Why `need` is missing here (with the way to get it), or `None` when it is there: for a test
/// that adapts to the machine (e.g. runs both backends where it can) and must say what it did.
pub fn missing(need: Need) -> Option<String> {
    need.missing(FACTS.get().expect("guard_test::missing is for tests run by guard_test::main!"))
}

/// Whether this run requires `need` (`GUARD_TESTS_REQUIRE`): an adapting test then fails
/// where it would have done less.
pub fn required(need: Need) -> bool {
    need::required().is_ok_and(|r| r.contains(&need))
}

/// `None` when `need` is here; else its reason, and a panic when the run requires it.
pub fn adapt(need: Need) -> Option<String> {
    let why = missing(need)?;
    assert!(!required(need), "{why} (this run requires `{}`: {})", need.name(), need::REQUIRE_ENV);
    Some(why)
}

/// Runs the registered tests (or the helper mode the environment names).
pub fn run(helpers: Option<fn(&str)>, facts: Facts) -> ExitCode {
    let _ = FACTS.set(facts);
    if let (Some(helpers), Ok(mode)) = (helpers, std::env::var(child::HELPER_ENV)) {
        helpers(&mode);
        std::process::exit(0);
    }
    // libtest takes any number of name filters (a test runs when one matches), libtest-mimic
    // one: more than one are applied here.
    let (flags, filters) = split_filters(std::env::args().skip(1));
    let mut args = libtest_mimic::Arguments::from_iter(std::iter::once("test".to_string()).chain(flags));
    let several = filters.len() > 1;
    if !several {
        args.filter = filters.first().cloned();
    }
    let required = match need::required() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("guard-test: {e}");
            return ExitCode::from(101);
        }
    };
    // Each need is looked for once (a Python start-up, a PATH walk), whatever the number of tests.
    let mut looked: HashMap<Need, Option<String>> = HashMap::new();
    let mut tests: Vec<&Test> = TESTS.iter().collect();
    tests.sort_by_key(|t| t.full_name());
    let mut notes = Vec::new();
    let trials = tests
        .into_iter()
        .map(|t| {
            let name = t.full_name();
            let verdict = decide(t.needs, |n| looked.entry(n).or_insert_with(|| n.missing(&facts)).clone(), &required);
            match verdict {
                Verdict::Run => {
                    let run = t.run;
                    libtest_mimic::Trial::test(name, move || {
                        run();
                        Ok(())
                    })
                    .with_ignored_flag(t.ignore.is_some())
                }
                Verdict::Fail(message) => libtest_mimic::Trial::test(name, move || Err(message.into())),
                Verdict::Ignore(why) => {
                    notes.push((name.clone(), why.clone()));
                    libtest_mimic::Trial::test(name, move || Err(why.into())).with_ignored_flag(true)
                }
            }
        })
        .collect::<Vec<_>>();
    let trials: Vec<libtest_mimic::Trial> = match several {
        true => trials
            .into_iter()
            .filter(|t| filters.iter().any(|f| if args.exact { t.name() == f } else { t.name().contains(f.as_str()) }))
            .collect(),
        false => trials,
    };
    if !args.list {
        for (name, why) in &notes {
            let shown = trials.iter().find(|t| t.name() == name).is_some_and(|t| !args.is_filtered_out(t));
            if shown {
                eprintln!("ignored {name}: {why}");
            }
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}

/// What the runner does with a test: what [`decide`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every need is here.
    Run,
    /// A need is missing and the run does not require it: ignored (libtest's summary counts
    /// it), with the reason.
    Ignore(String),
    /// A need the run requires is missing: a failed test, with the reason.
    Fail(String),
}

/// The rule for a test that needs `needs`, where `missing(n)` says why `n` is missing (`None`:
/// here) and the run requires `required` (`GUARD_TESTS_REQUIRE`). A skip is never a pass: a
/// missing need makes the test ignored, or failed where the run requires that need. Also
/// `cargo xtask test`'s rule for the unit tests of a `mod needs_<need>` ([`need::declared`]).
pub fn decide(needs: &[Need], mut missing: impl FnMut(Need) -> Option<String>, required: &[Need]) -> Verdict {
    let absent: Vec<(Need, String)> = needs.iter().filter_map(|&n| missing(n).map(|why| (n, why))).collect();
    let Some((_, first)) = absent.first() else { return Verdict::Run };
    match absent.iter().find(|(n, _)| required.contains(n)) {
        Some((n, why)) => {
            let named = required.iter().map(|n| n.name()).collect::<Vec<_>>().join(",");
            Verdict::Fail(format!("{why} (this run requires `{}`: {}={named})", n.name(), need::REQUIRE_ENV))
        }
        None => Verdict::Ignore(first.clone()),
    }
}

/// libtest's arguments apart from its name filters (the words that are not options or their
/// values).
fn split_filters(argv: impl Iterator<Item = String>) -> (Vec<String>, Vec<String>) {
    const WITH_VALUE: &[&str] = &["--test-threads", "--skip", "--format", "--color", "--logfile", "-Z"];
    let (mut flags, mut filters) = (Vec::new(), Vec::new());
    let mut argv = argv.peekable();
    while let Some(arg) = argv.next() {
        if !arg.starts_with('-') {
            filters.push(arg);
            continue;
        }
        let takes_value = WITH_VALUE.contains(&arg.as_str());
        flags.push(arg);
        if takes_value {
            flags.extend(argv.next());
        }
    }
    (flags, filters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_need_is_ignored_or_failed_where_required_and_never_run() {
        let no_btf = |n: Need| (n == Need::Btf).then(|| "needs BTF".to_string());
        assert_eq!(decide(&[Need::Root, Need::Btf], no_btf, &[]), Verdict::Ignore("needs BTF".into()));
        assert_eq!(decide(&[Need::Root, Need::Btf], no_btf, &[Need::Root]), Verdict::Ignore("needs BTF".into()));
        let Verdict::Fail(why) = decide(&[Need::Root, Need::Btf], no_btf, &[Need::Root, Need::Btf]) else {
            panic!("a required need that is missing must fail the test")
        };
        assert!(why.starts_with("needs BTF (this run requires `btf`: GUARD_TESTS_REQUIRE=root,btf)"), "{why}");
        assert_eq!(decide(&[Need::Root], no_btf, &[Need::Root, Need::Btf]), Verdict::Run);
        assert_eq!(decide(&[], no_btf, &[Need::Btf]), Verdict::Run);
        // The first missing need is the reason; a required one among them decides the failure.
        let none = |n: Need| Some(format!("no {}", n.name()));
        assert_eq!(decide(&[Need::Groff, Need::Shells], none, &[]), Verdict::Ignore("no groff".into()));
        let Verdict::Fail(why) = decide(&[Need::Groff, Need::Shells], none, &[Need::Shells]) else { panic!() };
        assert!(why.starts_with("no shells (this run requires `shells`"), "{why}");
    }

    #[test]
    fn filters_are_the_words_that_are_no_option_or_value() {
        let argv = ["--test-threads", "1", "a", "--exact", "--skip", "x", "b", "--format=json"];
        let (flags, filters) = split_filters(argv.into_iter().map(String::from));
        assert_eq!(flags, ["--test-threads", "1", "--exact", "--skip", "x", "--format=json"]);
        assert_eq!(filters, ["a", "b"]);
    }
}
