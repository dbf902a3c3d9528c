//! `guard-user validate [FILE]` (docs/operations.md): every problem of a config file, each with its fix;
//! exit 0 when the guard would use the file (warnings allowed), 1 when not. Meant for the CI of
//! the repository the config links into as much as for operators.
use std::{os::unix::ffi::OsStrExt, process::ExitCode};

use super::ValidateArgs;
use crate::{
    config::{self, Problem},
    escape,
    pattern::PatternSetError,
    safefs::FsIdentity,
};

pub fn main(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let (account, home, config_path) = super::run::resolve_account(&args.account)?;
    let path = args.file.clone().unwrap_or(config_path);
    // Read with the account's rights, as the daemon does: a file the guard could not read is
    // not valid for it, whoever runs validate.
    let problems = match config::read(&path, FsIdentity::from(&account)) {
        Ok(bytes) => {
            let mut problems = config::problems(&bytes, &home);
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
    for (i, p) in patterns.iter().enumerate() {
        match matcher.set_patterns(std::slice::from_ref(p)) {
            Ok(()) => {}
            Err(e) => {
                out.push(refused(i, p, &e));
                if let PatternSetError::Worker(_) = e {
                    break;
                }
            }
        }
    }
    out
}
