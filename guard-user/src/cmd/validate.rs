//! `guard-user validate [FILE]` (docs/operations.md): every problem of a config file, each with its fix;
//! exit 0 when the file is valid, 1 when not. Stricter than the daemon where the daemon would run
//! on silently: an unknown key and a pattern that matches every command line are errors here
//! (the daemon warns and goes on). Meant for the CI of
//! the repository the config links into as much as for operators.
use std::{os::unix::ffi::OsStrExt, process::ExitCode};

use super::ValidateArgs;
use crate::{
    account::Purpose,
    config::{self, PatternList, Problem},
    escape,
    pattern::{match_all, PatternSetError},
    safefs::FsIdentity,
};

pub fn main(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let (account, home, config_path) = super::account(&args.account, "validate", Purpose::Reads)?;
    let path = args.file.clone().unwrap_or(config_path);
    // Read with the account's rights, as the daemon does: a file the guard could not read is
    // not valid for it, whoever runs validate.
    let problems = match config::read(&path, FsIdentity::from(&account)) {
        Ok(bytes) => {
            let mut problems: Vec<Problem> =
                config::problems(&bytes, &home).into_iter().map(unknown_key_is_an_error).collect();
            let doc = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
            // Every pattern the static checks let through is compiled, whatever else is wrong:
            // a costly or malformed pattern never hides an invalid one behind it.
            let excludes = doc.as_ref().and_then(|v| v.get("excludeCommands"));
            let roots = doc.as_ref().and_then(|v| v.get("sessions")?.get("roots"));
            let mut found = Vec::new();
            for (list, value) in [(PatternList::ExcludeCommands, excludes), (PatternList::SessionsRoots, roots)] {
                found.extend(pattern_problems(list, &checkable(list, value, &problems)));
            }
            problems.extend(found);
            // Whatever else is wrong: the stateFile as the daemon would expand it.
            if let Some(state_file) = doc.as_ref().and_then(|v| v.get("stateFile")?.as_str()) {
                if !problems.iter().any(|p| p.key == "stateFile") {
                    problems.extend(state_file_problem(&config::expand_tilde(state_file, &home), &home));
                }
            }
            // Every slot's string commands too, as the slots' matcher would take them, whatever
            // else is wrong (a pattern another problem names is left to it).
            let slots = doc.as_ref().and_then(|v| v.get("slots")?.as_object());
            let excludes_ok = !problems.iter().any(|p| p.key.starts_with("excludeCommands"));
            let found = slot_problems(&slot_commands(slots, &problems), excludes.filter(|_| excludes_ok));
            problems.extend(found);
            problems
        }
        Err(e) => vec![Problem::from_error(e)],
    };
    let errors = problems.iter().filter(|p| !p.warning).count();
    let warnings = problems.len() - errors;
    // Errors first (in the order the daemon meets them), then the warnings.
    for p in problems.iter().filter(|p| !p.warning) {
        println!("{p}");
    }
    for p in problems.iter().filter(|p| p.warning) {
        println!("warning: {p}");
    }
    let shown = escape::text(path.as_os_str().as_bytes());
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    if errors == 0 {
        match warnings {
            0 => println!("{shown} is valid"),
            n => println!("{shown} is valid, with {}", plural(n, "warning")),
        }
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{shown} is invalid: {}", plural(errors, "problem"));
        Ok(ExitCode::from(1))
    }
}

/// The patterns of `list` to compile, with their indices: the string elements without a
/// problem of their own (`excludeCommands[2]` too long, too costly), none when the list itself
/// is wrong (not an array, too many).
fn checkable(list: PatternList, value: Option<&serde_json::Value>, problems: &[Problem]) -> Vec<(usize, String)> {
    let key = list.key();
    let Some(items) = value.and_then(|v| v.as_array()) else { return Vec::new() };
    if problems.iter().any(|p| p.key == key) {
        return Vec::new();
    }
    items
        .iter()
        .enumerate()
        .filter(|(i, _)| !problems.iter().any(|p| p.key == format!("{key}[{i}]")))
        .filter_map(|(i, v)| Some((i, v.as_str()?.to_string())))
        .collect()
}

/// Patterns the sandboxed matcher refuses to compile (invalid, or too costly for its bounds),
/// each compiled alone so every one is reported; valid ones that match every command line, and
/// valid ones written in another dialect's syntax ([`Problem::habits`]). A matcher that cannot
/// run is one problem.
fn pattern_problems(list: PatternList, patterns: &[(usize, String)]) -> Vec<Problem> {
    // What makes a pattern (or the list) too broad for its list, and how that is said: a root
    // pattern that matches the empty command line, or every other one, makes every process a
    // session root (the daemon refuses it too: `ERROR config_malformed sessions.roots`).
    type Broad = fn(&[crate::pattern::MatchOutcome]) -> bool;
    type TooBroad = fn(PatternList, Option<usize>, &str) -> Problem;
    let (broad, too_broad): (Broad, TooBroad) = match list {
        // Slots' patterns are checked by slot_problems, named by their slot.
        PatternList::ExcludeCommands | PatternList::SlotCommands => (match_all::covers_every_probe, matches_everything),
        PatternList::SessionsRoots => (match_all::too_broad_for_roots, |_, i, p| config::too_broad_root(i, p)),
    };
    let mut matcher = crate::daemon::effects::sandboxed_matcher();
    let mut out = Vec::new();
    let probes_until = || std::time::Instant::now() + std::time::Duration::from_secs(5);
    for (i, p) in patterns {
        match matcher.set_patterns(std::slice::from_ref(p)) {
            Ok(()) => {
                if broad(&matcher.classify(match_all::PROBES, probes_until())) {
                    out.push(too_broad(list, Some(*i), p));
                }
                out.extend(Problem::habits(list, *i, p));
            }
            Err(e) => {
                out.push(match list {
                    PatternList::ExcludeCommands | PatternList::SlotCommands => Problem::refused_pattern(*i, p, &e),
                    PatternList::SessionsRoots => Problem::refused_root(*i, p, &e),
                });
                if let PatternSetError::Worker(_) = e {
                    break;
                }
            }
        }
    }
    // Together the list can match every command line with no pattern doing so alone (`^$`, `.`).
    let all: Vec<String> = patterns.iter().map(|(_, p)| p.clone()).collect();
    if !out.iter().any(|p| !p.warning)
        && all.len() > 1
        && matcher.set_patterns(&all).is_ok()
        && broad(&matcher.classify(match_all::PROBES, probes_until()))
    {
        out.push(too_broad(list, None, &all.join(" ")));
    }
    out
}

/// Each slot's string `commands` from the raw document (`slots.<name>.commands[i]`, the
/// pattern), but those a problem already names, alone or as their list or slot.
fn slot_commands(slots: Option<&serde_json::Map<String, serde_json::Value>>, problems: &[Problem]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, spec) in slots.into_iter().flatten() {
        let shown = escape::text_capped(name.as_bytes(), 60);
        let list = format!("slots.{shown}.commands");
        let Some(items) = spec.get("commands").and_then(|c| c.as_array()) else { continue };
        if problems.iter().any(|p| p.key == list || p.key == format!("slots.{shown}")) {
            continue;
        }
        for (i, v) in items.iter().enumerate() {
            let key = format!("{list}[{i}]");
            if let Some(p) = v.as_str().filter(|_| !problems.iter().any(|p| p.key == key)) {
                out.push((key, p.to_string()));
            }
        }
    }
    out
}

/// The slots' patterns the slots' matcher (`Limits::slots`, as the daemon's) refuses or that
/// match every command line, each named by its slot; and, when each compiles alone, whether
/// `excludeCommands` and all of them compile together there, as the daemon compiles them.
fn slot_problems(patterns: &[(String, String)], excludes: Option<&serde_json::Value>) -> Vec<Problem> {
    let mut matcher = crate::pattern::Matcher::new("/proc/self/exe".into(), crate::pattern::Limits::slots());
    let mut out = Vec::new();
    let until = || std::time::Instant::now() + std::time::Duration::from_secs(5);
    for (i, (key, p)) in patterns.iter().enumerate() {
        let shown = escape::text_capped(p.as_bytes(), 60);
        match matcher.set_patterns(std::slice::from_ref(p)) {
            Ok(()) if match_all::matches_every_command(&matcher.classify(match_all::command_probes(), until())) => {
                out.push(Problem::validate_only(
                    key.clone(),
                    format!("\"{shown}\" matches every command line, so every command of the account would take the slot"),
                    "match the heavy commands' own words, e.g. (^|/)cargo (build|test)( |$) (try it with guard-user match)"
                        .into(),
                ));
            }
            Ok(()) => {}
            Err(e) => {
                let mut problem = Problem::refused_pattern(i, p, &e);
                problem.key = key.clone();
                out.push(problem);
                if let PatternSetError::Worker(_) = e {
                    return out;
                }
            }
        }
    }
    let mut all: Vec<String> =
        excludes.and_then(|v| v.as_array()).into_iter().flatten().filter_map(|v| Some(v.as_str()?.to_string())).collect();
    all.extend(patterns.iter().map(|(_, p)| p.clone()));
    if out.is_empty() && !patterns.is_empty() && matcher.set_patterns(&all).is_err() {
        out.push(Problem::validate_only(
            "slots".into(),
            format!(
                "excludeCommands and every slot's commands, compiled together by the slots' matcher ({} MiB of heap), \
                 are too costly",
                matcher.limits().memory_bytes >> 20
            ),
            "use fewer or smaller repeats ({m,n} with a large n is the usual cause) in excludeCommands or the slots' \
             commands, or fewer patterns"
                .into(),
        ));
    }
    out
}

/// A `stateFile` outside the home: the shipped unit makes only the home writable
/// (`ReadWritePaths=<home>`), so the daemon would log `ERROR state_unwritable` every tick there
/// and keep its flag clocks only in memory. Judged on the path as written (`..` resolved, `~`
/// being the home validate checks for) and, where the directory exists, on where it leads.
fn state_file_problem(state_file: &std::path::Path, home: &std::path::Path) -> Option<Problem> {
    use std::path::{Component, PathBuf};
    let lexical = |p: &std::path::Path| {
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::CurDir => {}
                other => out.push(other),
            }
        }
        out
    };
    let (file, home_l) = (lexical(state_file), lexical(home));
    let canonical = |p: &std::path::Path| p.canonicalize().ok();
    let inside = file.starts_with(&home_l)
        && match (file.parent().and_then(canonical), canonical(home)) {
            (Some(dir), Some(home)) => dir.starts_with(home),
            _ => true,
        };
    if inside {
        return unwritable_dir(state_file, &file, home);
    }
    let what = format!(
        "{} is outside the home {}: the systemd unit makes only the home writable, so the daemon could not save \
         its flag clocks there (ERROR state_unwritable every tick)",
        escape::text(state_file.as_os_str().as_bytes()),
        escape::text(home.as_os_str().as_bytes())
    );
    let fix = "keep it in the home, e.g. \"~/guard-daemon-state.json\" (or leave stateFile out)".to_string();
    Some(Problem::validate_only("stateFile".into(), what, fix))
}

/// A `stateFile` in the home whose directory is missing or not the account's to write: the
/// daemon writes it as the account and creates no directory, so it would log
/// `ERROR state_unwritable` every tick. Judged only where the home exists (validate of a
/// repository's config for another machine has none); the account is the home's owner.
fn unwritable_dir(state_file: &std::path::Path, file: &std::path::Path, home: &std::path::Path) -> Option<Problem> {
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(home).ok().filter(|m| m.is_dir())?.uid();
    let dir = file.parent()?;
    let shown = |p: &std::path::Path| escape::text(p.as_os_str().as_bytes());
    let why = match std::fs::metadata(dir) {
        Err(_) => "does not exist, and the daemon creates no directory",
        Ok(m) if !m.is_dir() => "is not a directory",
        Ok(m) if !((m.uid() == owner && m.mode() & 0o200 != 0) || m.mode() & 0o002 != 0) => {
            "is not writable by the home's owner, whom the daemon writes it as"
        }
        Ok(_) => return None,
    };
    let what = format!(
        "{}: its directory {} {why}, so the daemon could not save its flag clocks there (ERROR state_unwritable \
         every tick)",
        shown(state_file),
        shown(dir)
    );
    let fix = format!("create {} as the account, or keep it in the home, e.g. \"~/guard-daemon-state.json\"", shown(dir));
    Some(Problem::validate_only("stateFile".into(), what, fix))
}

/// A pattern (or, with `index` `None`, the list) that matches every command line. In
/// `excludeCommands` it is valid and honoured by the daemon, but it protects every process of
/// every enforced name, so nothing is ever ended; in `sessions.roots` the daemon refuses it
/// (every orphan would be a leftover) and keeps sessions off (docs/configuration.md).
fn matches_everything(list: PatternList, index: Option<usize>, pattern: &str) -> Problem {
    let key = index.map_or_else(|| list.key().to_string(), |i| format!("{}[{i}]", list.key()));
    let shown = escape::text_capped(pattern.as_bytes(), 60);
    let (subject, verb, it) = match index {
        Some(_) => (format!("\"{shown}\""), "matches", "it protects"),
        None => ("together these patterns".to_string(), "match", "they protect"),
    };
    let (what, fix) = match list {
        PatternList::SlotCommands => (
            format!("{subject} {verb} every command line, so every command of the account would take the slot"),
            "match the heavy commands' own words, e.g. (^|/)cargo (build|test)( |$) (try it with guard-user match)",
        ),
        PatternList::ExcludeCommands => (
            format!("{subject} {verb} every command line, so {it} every process of every enforced name"),
            "to spare a whole name, list it in excludes; otherwise match what sets its command lines apart \
             (try it with guard-user match --pattern)",
        ),
        PatternList::SessionsRoots => (
            format!(
                "{subject} {verb} every command line, which would make every orphan a leftover: the daemon refuses \
                 it and keeps sessions off"
            ),
            "match the command line of the session roots only (try it with guard-user match --pattern)",
        ),
    };
    Problem::validate_only(key, what, fix.to_string())
}

/// An unknown key is an error here, a warning for the daemon (docs/configuration.md): the daemon
/// runs on, with that setting at its default, so a misspelt key would otherwise pass CI silently.
/// The warnings `config::problems` gives are all unknown keys (named, or counted past its cap);
/// the daemon's wording ("so it is ignored") is turned into what it means for this file.
fn unknown_key_is_an_error(mut p: Problem) -> Problem {
    if p.warning {
        p.warning = false;
        if p.what == "is not a key guard knows, so it is ignored" {
            p.what = "is not a key guard knows: the daemon would ignore it and keep that setting at its default".into();
        }
        p.fix = p.fix.trim_end_matches(" (an unknown key is ignored)").to_string();
    }
    p
}
