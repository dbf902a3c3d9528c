//! The files a package ships that derive from guard-user's command line: the man pages
//! (clap_mangen, plus the sections an operator looks for that clap knows nothing of) and the
//! bash/zsh/fish completions (clap_complete). Both are rendered from the `guard-cli` crate, the
//! same command tree the binary parses with, so the daemon binary carries no generator and the
//! pages cannot describe options the binary lacks.
//!
//! Hidden subcommands and options (internal workers, test knobs) stay out: clap_mangen skips
//! them on its own, clap_complete does not, so the completions are generated from a copy of the
//! command tree without them ([`visible_tree`]).
use std::{fmt::Write as _, io};

use clap::{Arg, ArgAction, Command, CommandFactory as _};
use clap_complete::Shell;
use guard_cli::Cli;

/// The binary's name, as installed and as the shells complete it.
pub const BIN: &str = "guard-user";
/// The config's man page, `guard-config.json(5)`: hand-written roff (a file format has no clap
/// tree), checked against the config's keys by guard-user's `tests/doc_claims.rs`.
pub const CONFIG_PAGE: &str = "packaging/man/guard-config.json.5";

/// What the man pages describe beyond `about`; written for operators (clap's `about` is one line).
const DESCRIPTION: &str = "\
guard-user guards one account on a workstation. It keeps a live table of the account's processes \
from kernel events (BPF programs on the fork, exec, exit and rename tracepoints, with /proc as a \
fallback), counts them per process name on every tick, and when one name stays at or over the \
configured threshold for the configured timeout it ends that name's processes: SIGTERM, then \
SIGKILL half a second later. Names listed in excludes, and processes whose command line matches \
an excludeCommands pattern (a bash extended regular expression), are never ended.

Without a subcommand guard-user runs the daemon (guard-user run). One instance guards one account; \
under systemd it runs as guard-user@ACCOUNT.service, set up by guard-user install, with the flags \
of /etc/default/guard-user. Run by hand as root, it needs --user (or sudo, which sets SUDO_USER): \
it never guards root by default.";

/// One generated file: its name and its bytes.
pub struct Generated {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// guard-user(8) and one page per visible subcommand, guard-user-<sub>(8), which the main page's
/// COMMANDS section names (clap_mangen's cross-reference convention, as git and cargo do).
pub fn man_pages(date: &str, version: &str) -> io::Result<Vec<Generated>> {
    let mut root = Cli::command().long_about(DESCRIPTION).disable_help_subcommand(true);
    root.build();
    let source = format!("{BIN} {version}");
    let page = |cmd: Command| {
        clap_mangen::Man::new(cmd).section("8").date(date).source(&source).manual("System Administration")
    };
    let subs: Vec<Command> = root.get_subcommands().filter(|s| !s.is_hide_set()).cloned().collect();
    let mut pages = Vec::new();
    for sub in &subs {
        let man = page(sub.clone());
        let mut bytes = Vec::new();
        man.render_title(&mut bytes)?;
        man.render_name_section(&mut bytes)?;
        bytes.extend_from_slice(synopsis_section(&[sub]).as_bytes());
        man.render_description_section(&mut bytes)?;
        man.render_options_section(&mut bytes)?;
        bytes.extend_from_slice(exit_status_section(Some(sub.get_name())).as_bytes());
        bytes.extend_from_slice(sub_see_also(sub.get_name()).as_bytes());
        pages.push(Generated { name: man.get_filename(), bytes });
    }
    let man = page(root.clone());
    let mut bytes = Vec::new();
    man.render_title(&mut bytes)?;
    man.render_name_section(&mut bytes)?;
    let mut forms: Vec<&Command> = vec![&root];
    forms.extend(subs.iter().filter(|s| s.get_name() != "run"));
    bytes.extend_from_slice(synopsis_section(&forms).as_bytes());
    man.render_description_section(&mut bytes)?;
    man.render_options_section(&mut bytes)?;
    man.render_subcommands_section(&mut bytes)?;
    bytes.extend_from_slice(configuration_section().as_bytes());
    bytes.extend_from_slice(MAIN_SECTIONS.as_bytes());
    bytes.extend_from_slice(exit_status_section(None).as_bytes());
    bytes.extend_from_slice(main_see_also(&subs).as_bytes());
    man.render_version_section(&mut bytes)?;
    pages.insert(0, Generated { name: man.get_filename(), bytes });
    Ok(pages)
}

/// SYNOPSIS with one line per form, each option with its value placeholder
/// (`[--user NAME|UID]`; clap_mangen's own synopsis shows bare `[--user]`).
fn synopsis_section(forms: &[&Command]) -> String {
    let mut s = String::from(".SH SYNOPSIS\n");
    for (i, cmd) in forms.iter().enumerate() {
        if i > 0 {
            s.push_str(".br\n");
        }
        s.push_str(&synopsis_line(cmd));
        s.push('\n');
    }
    s
}

/// `\fBguard-user\fR \fBstatus\fR [\fB\-\-user\fR \fINAME|UID\fR] …` for one command (the root
/// command's line reads `guard-user [run] …`: bare guard-user is guard-user run).
fn synopsis_line(cmd: &Command) -> String {
    let mut line = format!("\\fB{}\\fR", roff(BIN));
    if cmd.get_name() == BIN {
        line.push_str(" [\\fBrun\\fR]");
    } else {
        let _ = write!(line, " \\fB{}\\fR", roff(cmd.get_name()));
    }
    // --help and --version are in OPTIONS; a synopsis shows what a run is made of.
    let visible = cmd.get_arguments().filter(|a| !a.is_hide_set() && !matches!(a.get_long(), Some("help" | "version")));
    let (positional, options): (Vec<&Arg>, Vec<&Arg>) = visible.partition(|a| a.is_positional());
    for arg in options.iter().chain(&positional) {
        line.push(' ');
        line.push_str(&synopsis_arg(arg));
    }
    line
}

fn synopsis_arg(arg: &Arg) -> String {
    let value = arg.get_value_names().map(|v| v.join(" ")).unwrap_or_else(|| arg.get_id().to_string());
    let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values())
        && !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count);
    let text = match arg.get_long() {
        Some(long) if takes_value => format!("\\fB\\-\\-{}\\fR \\fI{}\\fR", roff(long), roff(&value)),
        Some(long) => format!("\\fB\\-\\-{}\\fR", roff(long)),
        None => format!("\\fI{}\\fR", roff(&value)),
    };
    let text = if arg.is_required_set() { text } else { format!("[{text}]") };
    if matches!(arg.get_action(), ArgAction::Append) {
        format!("{text}...")
    } else {
        text
    }
}

/// Text for roff: a `-` that is a hyphen-minus is written `\-` (what clap_mangen does too), so
/// it renders as the character an operator types.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// The main page's sections beyond clap's: the configuration in brief, files, environment,
/// exit statuses. The paths are the daemon's defaults (relative to the account's home) and the
/// package's; the options above say how to move them.
const MAIN_SECTIONS: &str = r#".SH FILES
.TP
\fI~/guard\-config.json\fR
The account's configuration; guard\-user install makes it a link to the config source.
.TP
\fI~/guard\-daemon.log\fR
The log: one line per decision (FLAGGED, WARNING, KILLED, DRY_RUN, SKIPPED, TICK_COMPLETE, ...),
rotated to \fI~/guard\-daemon.log.1\fR at logMaxSizeMB.
.TP
\fI~/guard\-daemon\-state.json\fR
Flag times (config key stateFile), written atomically.
.TP
\fI~/guard\-status.json\fR
The status guard\-user status and guard\-user check read, beside the state file.
.TP
\fI/run/guard\-user/\fR
The one\-instance locks (root's, mode 0700).
.TP
\fI/usr/share/guard\-user/guard\-config.json\fR
The default configuration shipped by the package (install's default config source).
.TP
\fI/etc/default/guard\-user\fR, \fI/etc/default/guard\-user@ACCOUNT\fR
GUARD_ARGS, flags the unit adds to every instance's run (the second file, read after the first,
for one instance); root's, read at each start. guard\-user check shows the flags in force.
.TP
\fI/lib/systemd/system/guard\-user@.service\fR
The systemd unit template; one instance per guarded account, whose drop\-in
\fI/etc/systemd/system/guard\-user@ACCOUNT.service.d/home.conf\fR guard\-user install writes.
.SH ENVIRONMENT
.TP
\fBSUDO_USER\fR
The account when \-\-user is not given and guard\-user runs as root through sudo. With neither,
as root, the subcommands that act (run, install, uninstall, holders \-\-stop) or print command
lines (match, explain) refuse with exit 2 and ask for \-\-user; the others say they read root's.
.TP
\fBGUARD_LOG\fR
The level of the daemon's diagnostics on standard error (error, warn, info, debug, trace, off;
default info), or target=level directives such as guard=debug,warn.
.TP
\fBAGENTIHOOKS_HIVE_REDIS_URL\fR, \fBAGENTIHOOKS_SWARM_REDIS_URL\fR, \fBAGENTIHOOKS_LEDGER_MODE\fR
The optional swarm Redis the daemon mirrors its heartbeat and events to (the first of the two
URLs that is set, the hive one unless AGENTIHOOKS_LEDGER_MODE=local; else
redis://127.0.0.1:6379/0). Without a Redis the log says WARN redis_unreachable once, and the
guard goes on guarding.
"#;

/// CONFIGURATION, from guard-cli's list of the keys ([`guard_cli::CONFIG_KEYS`], which
/// guard-user's tests hold to the config parser's keys and defaults).
fn configuration_section() -> String {
    let mut s = String::from(
        ".SH CONFIGURATION\nThe account's \\fI~/guard\\-config.json\\fR is a JSON object, read again on every tick; \
         \\fBguard\\-config.json\\fR(5) describes every key, its bounds and its errors. A key left out takes its \
         default. An invalid config ends nothing until it is fixed; \\fBguard\\-user validate\\fR lists every \
         problem with its fix. The keys:\n",
    );
    for k in guard_cli::CONFIG_KEYS {
        let _ = writeln!(s, ".TP\n\\fB{}\\fR (default: {})\n{}.", roff(k.key), roff(k.default), roff(k.meaning));
    }
    s
}

/// EXIT STATUS, rendered from guard-cli's table ([`guard_cli::EXIT_STATUSES`], which
/// guard-user's tests hold to the binary): one subcommand's statuses on its page, every
/// subcommand's on the main page, each code once with what it means for each command.
fn exit_status_section(command: Option<&str>) -> String {
    let mut s = String::from(".SH \"EXIT STATUS\"\n");
    let rows = match command {
        Some(c) => guard_cli::exit_statuses(c),
        None => {
            let mut all = guard_cli::EXIT_STATUSES.to_vec();
            all.sort_by_key(|r| r.code);
            all
        }
    };
    let mut codes: Vec<u8> = rows.iter().map(|r| r.code).collect();
    codes.dedup();
    for code in codes {
        let _ = writeln!(s, ".TP\n.B {code}");
        let lines: Vec<String> = rows
            .iter()
            .filter(|r| r.code == code)
            .map(|r| match (command, r.command) {
                (None, c) if c != "*" => format!("{}: {}.", roff(c), roff(r.meaning)),
                _ => format!("{}{}.", roff(&r.meaning[..1].to_uppercase()), roff(&r.meaning[1..])),
            })
            .collect();
        s.push_str(&lines.join("\n.br\n"));
        s.push('\n');
    }
    s
}

fn main_see_also(subs: &[Command]) -> String {
    let mut s = String::from(".SH \"SEE ALSO\"\n\\fBguard\\-config.json\\fR(5), ");
    for sub in subs {
        let _ = write!(s, "\\fBguard\\-user\\-{}\\fR(8), ", roff(sub.get_name()));
    }
    s.push_str(
        "\\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1), and the documentation in \
         \\fI/usr/share/doc/guard\\-user/\\fR.\n",
    );
    s
}

fn sub_see_also(name: &str) -> String {
    let config = matches!(name, "run" | "validate" | "install" | "check" | "explain" | "match");
    format!(
        ".SH \"SEE ALSO\"\n\\fBguard\\-user\\fR(8){}, and the documentation in \\fI/usr/share/doc/guard\\-user/\\fR.\n",
        if config { ", \\fBguard\\-config.json\\fR(5)" } else { "" }
    )
}

/// The completion script for `shell`, without hidden subcommands or options.
///
/// Bash: clap_complete (4.6) spells the states of a hyphenated binary's subcommands one way in
/// its dispatch loop (`guard__user__subcmd__run`) and another in its case labels
/// (`guard__subcmd__user__subcmd__run`), so nothing after a subcommand ever completed
/// (clap-rs/clap#6421). The script is generated for the hyphen-free name `guard_user`, whose
/// states agree, and only the `complete` registration names the real `guard-user`. The
/// function is then `_guard_user`, which also loads in POSIX-mode bash (clap-rs/clap#6468).
/// Two more things clap's bash script cannot do are added ([`bash_extras`]): `--user` completes
/// account names, and `explain NAME` the names of live processes.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut cmd = visible_tree(&Cli::command());
    let mut out = Vec::new();
    if shell == Shell::Fish {
        clap_complete::generate(shell, &mut cmd, BIN, &mut out);
        let text = String::from_utf8(out).expect("clap_complete writes UTF-8");
        return fish_extras(&text).expect("clap_complete's fish script has the shape fish_extras expects").into_bytes();
    }
    if shell != Shell::Bash {
        clap_complete::generate(shell, &mut cmd, BIN, &mut out);
        return out;
    }
    clap_complete::generate(shell, &mut cmd, BASH_INNER, &mut out);
    let text = String::from_utf8(out).expect("clap_complete writes UTF-8");
    let mut fixed = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        // The registration lines end in the command they complete, e.g.
        // `complete -F _guard_user -o nosort -o bashdefault -o default guard_user`.
        match line.trim_end().strip_suffix(&format!(" {BASH_INNER}")) {
            Some(head) if line.trim_start().starts_with("complete ") => {
                fixed.push_str(&format!("{head} {BIN}\n"));
            }
            _ => fixed.push_str(line),
        }
    }
    bash_extras(&fixed, &cmd).expect("clap_complete's bash script has the shape bash_extras expects").into_bytes()
}

/// fish: clap_complete's `__fish_guard_user_needs_command` runs `argparse` over the words typed
/// so far and gives up when it fails, which it does while an option of bare `guard-user` waits
/// for its value (`guard-user --backend `): then no completion of the top level applies and fish
/// offers file names instead of `auto ebpf procfs`. A failed parse means no subcommand has been
/// typed yet, so it answers that. `None` when the script does not have the expected shape (a
/// clap_complete upgrade then fails the package build instead of silently dropping the fix).
fn fish_extras(script: &str) -> Option<String> {
    let before = "    argparse -s (__fish_guard_user_global_optspecs) -- $cmd 2>/dev/null\n    or return\n";
    let after = "    argparse -s (__fish_guard_user_global_optspecs) -- $cmd 2>/dev/null\n    \
                 # An option still waiting for its value fails the parse: no subcommand yet.\n    or return 0\n";
    script.contains(before).then(|| script.replacen(before, after, 1))
}

/// The name bash's script is generated under (see [`completion`]).
const BASH_INNER: &str = "guard_user";

/// `--user` (a `ValueHint::Username`) completes account names (`compgen -u`; clap's bash script
/// offers file names), and `explain`'s NAME the names of the machine's live processes (what
/// `ps -e -o comm=` prints; clap's script offers nothing for a free positional). `None` when the
/// script does not have the shape these edits expect, so a clap_complete upgrade that changes it
/// fails the package build instead of silently dropping them.
fn bash_extras(script: &str, cmd: &Command) -> Option<String> {
    let mut out = script.to_string();
    let files = "COMPREPLY=($(compgen -f \"${cur}\"))";
    // Every option that takes an account (ValueHint::Username), anywhere in the tree.
    let mut accounts: Vec<&str> = std::iter::once(cmd)
        .chain(cmd.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .filter(|a| a.get_value_hint() == clap::ValueHint::Username)
        .filter_map(|a| a.get_long())
        .collect();
    accounts.sort_unstable();
    accounts.dedup();
    if accounts.is_empty() {
        return None;
    }
    for long in accounts {
        let before = format!("--{long})\n                    {files}");
        let after = format!("--{long})\n                    COMPREPLY=($(compgen -u -- \"${{cur}}\"))");
        if !out.contains(&before) {
            return None;
        }
        out = out.replace(&before, &after);
    }
    let explain = cmd.get_subcommands().find(|s| s.get_name() == "explain")?;
    let valued: Vec<String> = explain
        .get_arguments()
        .filter(|a| a.get_num_args().is_some_and(|n| n.takes_values()) && !a.is_positional())
        .filter_map(|a| a.get_long().map(|l| format!("${{prev}} != --{l}")))
        .collect();
    let state = format!("        {BASH_INNER}__subcmd__explain)\n            opts=");
    let at = out.find(&state)?;
    let line_end = at + state.len() + out[at + state.len()..].find('\n')? + 1;
    let names = format!(
        "            # NAME: the names of live processes, unless an option or an option's value is due.\n\
         \x20           if [[ ${{cur}} != -* && {} ]] ; then\n\
         \x20               COMPREPLY=( $(compgen -W \"$(ps -e -o comm= 2>/dev/null | LC_ALL=C sort -u)\" -- \"${{cur}}\") )\n\
         \x20               return 0\n\
         \x20           fi\n",
        valued.join(" && ")
    );
    out.insert_str(line_end, &names);
    Some(out)
}

/// A copy of `cmd` (recursively) without hidden arguments and subcommands. clap has no way to
/// remove them in place; argument groups are left out (they only tie the derive's fields
/// together and would name the removed arguments).
pub fn visible_tree(cmd: &Command) -> Command {
    let mut out = Command::new(cmd.get_name().to_string())
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(visible_tree))
        .args_conflicts_with_subcommands(cmd.is_args_conflicts_with_subcommands_set());
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_string());
    }
    out
}

#[cfg(test)]
#[path = "generate_tests.rs"]
mod tests;
