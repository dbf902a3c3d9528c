//! The shell completions tried the way a shell uses them, not only parsed: bash's completion
//! function is called on real command lines (as readline would: `COMP_WORDS`, `COMP_CWORD`, the
//! function's three arguments) and its `COMPREPLY` read back; fish answers `complete -C LINE`;
//! zsh loads the script under `compinit` and must have registered it for `guard-user`.
//! `cargo xtask dist --check` runs this on the packaged scripts, and xtask's unit tests on freshly
//! generated ones. A shell that is not installed is reported as skipped, never as passed.
use std::{path::Path, process::Command};

use anyhow::{bail, Context as _};

use crate::build_ebpf::which;

/// A command line as typed before TAB (a trailing space means "complete a new word"), and words
/// the shell must offer for it (`!word`: a word it must not offer).
pub struct Case {
    pub line: &'static str,
    pub offers: &'static [&'static str],
}

/// What each shell is asked. Top-level subcommands, a subcommand's options (what
/// clap-rs/clap#6421 broke for hyphenated binaries), an option's values, and explain's NAME,
/// which completes from the names of live processes (`bash` is one: the test itself runs in bash).
pub const BASH_CASES: &[Case] = &[
    Case { line: "guard-user ", offers: &["install", "status", "explain", "!__unit", "!__pattern-worker"] },
    Case { line: "guard-user --dry", offers: &["--dry-run"] },
    Case { line: "guard-user run --back", offers: &["--backend"] },
    Case { line: "guard-user run --backend ", offers: &["auto", "ebpf", "procfs", "!Cargo.toml"] },
    // Bare `guard-user` is `run`: the same values, and never file names (the test runs where a
    // Cargo.toml is).
    Case { line: "guard-user --backend ", offers: &["auto", "ebpf", "procfs", "!Cargo.toml"] },
    Case { line: "guard-user ", offers: &["!record"] },
    Case { line: "guard-user run --", offers: &["--metrics-file", "--dry-run", "--user", "!--ring-bytes"] },
    Case { line: "guard-user explain --j", offers: &["--json"] },
    Case { line: "guard-user explain ba", offers: &["bash"] },
    Case { line: "guard-user status --user ro", offers: &["root"] },
    Case { line: "guard-user validate --", offers: &["--user", "--home", "--config"] },
];

pub const FISH_CASES: &[Case] = &[
    Case { line: "guard-user ", offers: &["install", "status", "explain", "!__unit"] },
    Case { line: "guard-user run --back", offers: &["--backend"] },
    Case { line: "guard-user run --backend ", offers: &["auto", "ebpf", "procfs", "!Cargo.toml"] },
    // Bare `guard-user` is `run`: the same values, and never file names (the test runs where a
    // Cargo.toml is).
    Case { line: "guard-user --backend ", offers: &["auto", "ebpf", "procfs", "!Cargo.toml"] },
    Case { line: "guard-user ", offers: &["!record"] },
    Case { line: "guard-user explain --j", offers: &["--json"] },
];

/// Runs every case against the three scripts; returns one line per shell saying what ran.
pub fn check(bash: &Path, zsh: &Path, fish: &Path) -> anyhow::Result<Vec<String>> {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    match which("bash") {
        None => report.push("bash completion not tried: bash is not installed".to_string()),
        Some(_) => {
            for case in BASH_CASES {
                let offered = bash_complete(bash, case.line)?;
                failures.extend(missing(case, &offered).map(|m| format!("bash: {m}")));
            }
            report.push(format!("bash completes {} command lines as expected", BASH_CASES.len()));
        }
    }
    match which("fish") {
        None => report.push("fish completion not tried: fish is not installed (apt-get install fish)".into()),
        Some(_) => {
            for case in FISH_CASES {
                let offered = fish_complete(fish, case.line)?;
                failures.extend(missing(case, &offered).map(|m| format!("fish: {m}")));
            }
            report.push(format!("fish completes {} command lines as expected", FISH_CASES.len()));
        }
    }
    match which("zsh") {
        None => report.push("zsh completion not loaded: zsh is not installed (apt-get install zsh)".into()),
        Some(_) => match zsh_load(zsh) {
            Ok(()) => report.push("zsh loads the completion under compinit and binds it to guard-user".into()),
            Err(e) => failures.push(format!("zsh: {e:#}")),
        },
    }
    if !failures.is_empty() {
        bail!("the completions do not work:\n  {}", failures.join("\n  "));
    }
    Ok(report)
}

/// What `case` expected and `offered` lacks (or holds against a `!word`).
fn missing<'a>(case: &'a Case, offered: &'a [String]) -> impl Iterator<Item = String> + 'a {
    case.offers.iter().filter_map(move |want| {
        let (word, present) = match want.strip_prefix('!') {
            Some(w) => (w, false),
            None => (*want, true),
        };
        (offered.iter().any(|o| o == word) != present).then(|| {
            let verb = if present { "does not offer" } else { "offers" };
            format!("{:?} + TAB {verb} {word} (offered: {})", case.line, offered.join(" "))
        })
    })
}

/// `COMPREPLY` of the script's completion function for `line`, called as bash's programmable
/// completion calls it: `COMP_WORDS`/`COMP_CWORD`/`COMP_LINE`/`COMP_POINT` set, and the command,
/// the word being completed and the word before it as arguments. The function is the one the
/// script registers for `guard-user` (`complete -F <function> … guard-user`).
pub fn bash_complete(script: &Path, line: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(script).with_context(|| format!("reading {}", script.display()))?;
    let function = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("complete -F "))
        .find(|rest| rest.split_whitespace().last() == Some("guard-user"))
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("{} registers no function for guard-user", script.display()))?
        .to_string();
    let mut words: Vec<&str> = line.split(' ').collect();
    if words.last() == Some(&"") {
        words.pop();
        words.push("");
    }
    let cword = words.len() - 1;
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let prev = if cword > 0 { words[cword - 1] } else { "" };
    let program = format!(
        "source \"$1\" || exit 3\n\
         COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}\n\
         {function} guard-user '{cur}' '{prev}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words = quoted.join(" "),
        point = line.len(),
        cur = words[cword],
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program, "bash"])
        .arg(script)
        .output()
        .context("running bash")?;
    if !out.status.success() {
        bail!("bash completion of {line:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(str::to_string).collect())
}

/// The words fish offers for `line` (`complete -C`), descriptions dropped.
pub fn fish_complete(script: &Path, line: &str) -> anyhow::Result<Vec<String>> {
    let out = Command::new("fish")
        .args(["--no-config", "-c", "source $argv[1]; or exit 3; complete -C $argv[2]"])
        .arg(script)
        .arg(line)
        .output()
        .context("running fish")?;
    if !out.status.success() || !out.stderr.is_empty() {
        bail!("fish completion of {line:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(|l| l.split('\t').next().unwrap_or("").to_string()).collect())
}

/// zsh sources the script after `compinit` without a word on standard error, and the completion
/// system then knows `_guard-user` as the completer of `guard-user`.
pub fn zsh_load(script: &Path) -> anyhow::Result<()> {
    let home = tempfile_dir()?;
    let out = Command::new("zsh")
        .args([
            "-f",
            "-c",
            "autoload -Uz compinit && compinit -u -D || exit 3; source $1 || exit 4; print -r -- ${_comps[guard-user]}",
            "zsh",
        ])
        .arg(script)
        .env("HOME", &home)
        .env("ZDOTDIR", &home)
        .output()
        .context("running zsh")?;
    let _ = std::fs::remove_dir_all(&home);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !out.stderr.is_empty() || stdout.trim() != "_guard-user" {
        bail!(
            "loading {} ({}): the completer of guard-user is {:?}; stderr: {}",
            script.display(),
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A private empty directory for zsh's HOME (compinit writes nothing with -D, but zsh reads
/// dotfiles from HOME without -f semantics in some builds).
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("guard-zsh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
