//! `guard-user validate [FILE]` (docs/operations.md): every problem of a config file, each with its fix;
//! exit 0 when the file is valid, 1 when not. Stricter than the daemon where the daemon would run
//! on silently: an unknown key and a pattern that matches every command line are errors here
//! (the daemon warns and goes on). Meant for the CI of
//! the repository the config links into as much as for operators.
use std::{os::unix::ffi::OsStrExt, process::ExitCode};

use super::ValidateArgs;
use crate::{
    config::{self, Problem},
    escape,
    pattern::{match_all, PatternSetError},
    safefs::FsIdentity,
};

pub fn main(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let (account, home, config_path) = super::run::resolve_account(&args.account)?;
    let path = args.file.clone().unwrap_or(config_path);
    // Read with the account's rights, as the daemon does: a file the guard could not read is
    // not valid for it, whoever runs validate.
    let problems = match config::read(&path, FsIdentity::from(&account)) {
        Ok(bytes) => {
            let mut problems: Vec<Problem> =
                config::problems(&bytes, &home).into_iter().map(unknown_key_is_an_error).collect();
            // Compile the patterns whatever else is wrong, once they passed the static checks.
            let doc = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
            let list = |v: Option<&serde_json::Value>| {
                v.and_then(|v| serde_json::from_value::<Vec<String>>(v.clone()).ok()).unwrap_or_default()
            };
            if !problems.iter().any(|p| p.key.starts_with("excludeCommands")) {
                let patterns = list(doc.as_ref().and_then(|v| v.get("excludeCommands")));
                problems.extend(pattern_problems(&patterns, Problem::refused_pattern));
            }
            if !problems.iter().any(|p| p.key.starts_with("sessions")) {
                let roots = list(doc.as_ref().and_then(|v| v.get("sessions")?.get("roots")));
                problems.extend(pattern_problems(&roots, Problem::refused_root));
            }
            if !problems.iter().any(|p| p.key.starts_with("slots")) {
                if let Ok(c) = config::parse(&bytes, &home) {
                    problems.extend(slot_problems(&c.slots));
                }
            }
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

/// Patterns the sandboxed matcher refuses to compile (invalid, or too costly for its bounds),
/// each compiled alone so every one is reported. A matcher that cannot run is one problem.
fn pattern_problems(patterns: &[String], refused: fn(usize, &str, &PatternSetError) -> Problem) -> Vec<Problem> {
    let mut matcher = crate::daemon::effects::sandboxed_matcher();
    let mut out = Vec::new();
    let probes_until = || std::time::Instant::now() + std::time::Duration::from_secs(5);
    for (i, p) in patterns.iter().enumerate() {
        match matcher.set_patterns(std::slice::from_ref(p)) {
            Ok(()) => {
                if match_all::matches_every_probe(&matcher.classify(match_all::PROBES, probes_until())) {
                    out.push(matches_everything(Some(i), p));
                }
            }
            Err(e) => {
                out.push(refused(i, p, &e));
                if let PatternSetError::Worker(_) = e {
                    break;
                }
            }
        }
    }
    // Together the list can match every command line with no pattern doing so alone (`^$`, `.`).
    if out.is_empty()
        && patterns.len() > 1
        && matcher.set_patterns(patterns).is_ok()
        && match_all::covers_every_probe(&matcher.classify(match_all::PROBES, probes_until()))
    {
        out.push(matches_everything(None, &patterns.join(" ")));
    }
    out
}

/// The slots' patterns the sandboxed matcher refuses, and those that match every command line
/// (every command of the account would take the slot): both errors for the daemon too.
fn slot_problems(slots: &[config::Slot]) -> Vec<Problem> {
    let mut matcher = crate::daemon::effects::sandboxed_matcher();
    let mut out = Vec::new();
    let until = || std::time::Instant::now() + std::time::Duration::from_secs(5);
    for slot in slots {
        for (i, p) in slot.commands.iter().enumerate() {
            let key = format!("slots.{}.commands[{i}]", slot.name);
            let shown = escape::text_capped(p.as_bytes(), 60);
            match matcher.set_patterns(std::slice::from_ref(p)) {
                Ok(()) if match_all::matches_every_command(&matcher.classify(match_all::command_probes(), until())) => {
                    out.push(Problem::validate_only(
                        key,
                        format!("\"{shown}\" matches every command line, so every command of the account would take the slot"),
                        "match the heavy commands' own words, e.g. (^|/)cargo (build|test)( |$) (try it with guard-user match)"
                            .into(),
                    ));
                }
                Ok(()) => {}
                Err(e) => {
                    let mut problem = Problem::refused_pattern(i, p, &e);
                    problem.key = key;
                    out.push(problem);
                    if let PatternSetError::Worker(_) = e {
                        return out;
                    }
                }
            }
        }
    }
    out
}

/// A pattern (or, with `index` `None`, the list) that matches every command line: valid, and
/// honoured by the daemon, but it protects every process of every enforced name, so nothing is
/// ever ended (docs/configuration.md).
fn matches_everything(index: Option<usize>, pattern: &str) -> Problem {
    let key = index.map_or_else(|| "excludeCommands".to_string(), |i| format!("excludeCommands[{i}]"));
    let shown = escape::text_capped(pattern.as_bytes(), 60);
    let what = match index {
        Some(_) => {
            format!("\"{shown}\" matches every command line, so it protects every process of every enforced name")
        }
        None => "together these patterns match every command line, so they protect every process of every \
                 enforced name"
            .to_string(),
    };
    let fix = "to spare a whole name, list it in excludes; otherwise match what sets its command lines apart \
               (try it with guard-user match --pattern)";
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
