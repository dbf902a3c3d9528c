//! What the operator docs and the man pages claim, held against the binary and the library, so a
//! claim that stops being true fails a test instead of misleading an operator: the `validate`
//! transcripts of docs/configuration.md, the message `status` gives without a status file, the
//! metrics file name rule, whom a bare `run` guards, what the machine's process count counts, the
//! packaged unit and its man pages, the config's man page, the demo config of the README, and
//! the monitoring examples' metric names.
use guard_test::guard_test;
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use guard::{comm::Comm, config, install, metrics};

fn guard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_guard-user"))
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn read(rel: &str) -> String {
    fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One `$ cat NAME` + file + `$ guard-user validate … NAME` + output transcript of a doc.
struct Transcript {
    name: String,
    file: String,
    output: Vec<String>,
    exit: Option<i32>,
}

/// The transcripts in the console blocks of `doc` whose file is shown with `cat` (the others
/// depend on a file the reader cannot see).
fn transcripts(doc: &str) -> Vec<Transcript> {
    let mut out = Vec::new();
    for block in doc.split("```console\n").skip(1) {
        let block = block.split("\n```").next().unwrap();
        let mut files: Vec<(String, String)> = Vec::new();
        let mut lines = block.lines().peekable();
        while let Some(line) = lines.next() {
            let Some(cmd) = line.strip_prefix("$ ") else { continue };
            let mut body = Vec::new();
            while let Some(next) = lines.peek() {
                if next.starts_with("$ ") {
                    break;
                }
                body.push(lines.next().unwrap().to_string());
            }
            if let Some(name) = cmd.strip_prefix("cat ") {
                files.push((name.to_string(), body.join("\n") + "\n"));
            } else if let Some(args) = cmd.strip_prefix("guard-user validate ") {
                let name = args.split_whitespace().last().unwrap().to_string();
                let Some((_, file)) = files.iter().find(|(n, _)| *n == name) else { continue };
                let exit = match lines.peek() {
                    Some(&"$ echo $?") => {
                        lines.next();
                        lines.next().map(|code| code.trim().parse().unwrap())
                    }
                    _ => None,
                };
                out.push(Transcript { name, file: file.clone(), output: body, exit });
            }
        }
    }
    out
}

#[guard_test]
fn the_validate_transcripts_of_the_configuration_doc_are_what_validate_prints() {
    let doc = read("docs/configuration.md");
    let transcripts = transcripts(&doc);
    // The doc shows at least the three broken configs and the one with a pattern that matches
    // every command line; a parser that found none would pass vacuously.
    assert!(transcripts.len() >= 4, "found {} transcripts", transcripts.len());
    let dir = tempfile::tempdir().unwrap();
    for t in &transcripts {
        fs::write(dir.path().join(&t.name), &t.file).unwrap();
        let o = guard().arg("validate").arg("--home").arg(dir.path()).arg(&t.name).current_dir(dir.path()).output();
        let o = o.unwrap();
        let got: Vec<String> = text(&o.stdout).lines().map(str::to_string).collect();
        assert_eq!(
            got,
            t.output,
            "docs/configuration.md's validate transcript of {} (stderr: {})",
            t.name,
            text(&o.stderr)
        );
        if let Some(code) = t.exit {
            assert_eq!(o.status.code(), Some(code), "{}", t.name);
        }
    }
}

#[guard_test]
fn status_without_a_status_file_says_what_operations_md_quotes() {
    let doc = read("docs/operations.md");
    let quoted = doc
        .split("Without a status file, `status` says\n`")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .expect("docs/operations.md quotes status' message without a status file");
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() }.to_string();
    let o = guard().args(["status", "--user", &me, "--home"]).arg(dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let path = dir.path().join("guard-status.json");
    let want = quoted.replace("\n", " ").replace("<path>", &path.display().to_string());
    assert_eq!(text(&o.stderr).trim_end(), want);
}

#[guard_test]
fn a_metrics_file_node_exporter_would_not_read_is_refused_before_the_daemon_starts() {
    let dir = tempfile::tempdir().unwrap();
    let me = unsafe { libc::getuid() }.to_string();
    for name in ["guard.txt", "guard.prom.tmp", ".prom", "guard.PROM"] {
        let o = guard()
            .args(["run", "--user", &me, "--backend", "procfs", "--home"])
            .arg(dir.path())
            .arg("--metrics-file")
            .arg(dir.path().join(name))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{name}: {o:?}");
        let err = text(&o.stderr);
        assert!(err.contains("--metrics-file") && err.contains("ends in .prom"), "{name}: {err}");
        assert!(!dir.path().join("guard-daemon.log").exists(), "{name}: the daemon started");
    }
}

#[guard_test(needs = [root])]
fn a_bare_run_as_root_asks_for_an_account_instead_of_guarding_root() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["run", "--dry-run"][..], &["--dry-run"][..], &[][..]] {
        let o = guard().args(args).arg("--home").arg(dir.path()).env_remove("SUDO_USER").output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        let err = text(&o.stderr);
        assert!(err.contains("no account named") && err.contains("--user"), "{args:?}: {err}");
        assert!(!dir.path().join("guard-daemon.log").exists(), "{args:?}: the daemon started");
        // sudo by root (SUDO_USER=root) is root too.
        let o = guard().args(args).arg("--home").arg(dir.path()).env("SUDO_USER", "root").output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?} with SUDO_USER=root: {o:?}");
    }
}

/// The processes `ps -e` lists: the numeric entries of /proc.
fn listed_by_ps() -> u64 {
    let numeric = |e: &fs::DirEntry| e.file_name().to_str().is_some_and(|s| s.parse::<u32>().is_ok());
    fs::read_dir("/proc").unwrap().flatten().filter(numeric).count() as u64
}

#[guard_test]
fn the_machine_process_count_is_what_ps_e_lists_as_metrics_md_says() {
    let doc = read("docs/metrics.md");
    assert!(
        doc.contains("as `ps -e` counts them") && doc.contains("kernel threads and zombies included"),
        "docs/metrics.md says what guard_machine_processes counts"
    );
    // Processes come and go: the guard's count, bracketed by two listings that agree.
    let mut machine = guard::machine::MachineCount::default();
    for _ in 0..50 {
        let before = listed_by_ps();
        let counted = machine.read().expect("/proc's link count");
        if listed_by_ps() == before {
            assert_eq!(counted, before, "guard_machine_processes and the processes ps -e lists differ");
            eprintln!("{counted} processes, as ps -e lists them");
            return;
        }
    }
    panic!("/proc never held still for two listings in a row");
}

#[guard_test]
fn the_packaged_unit_is_what_the_binary_prints_and_names_the_man_pages() {
    let o = guard().args(["__unit", "--bin-dir", "/usr/bin"]).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let exe = install::escape::Executable::new(Path::new("/usr/bin/guard-user")).unwrap();
    assert_eq!(text(&o.stdout), install::unit_text(&exe));
    assert!(text(&o.stdout).contains("\nDocumentation=man:guard-user(8) man:guard-config.json(5)\n"));
    assert!(text(&o.stdout).contains("\nExecStart=/usr/bin/guard-user run --user %i $GUARD_ARGS\n"));
    // A source install has no man page to point at (systemd-analyze verify would fail on it).
    let o = guard().args(["__unit", "--bin-dir", "/opt/bin"]).output().unwrap();
    assert!(!text(&o.stdout).contains("man:"), "{}", text(&o.stdout));
}

#[guard_test]
fn the_config_man_page_and_doc_name_every_key_with_its_default() {
    let page = read("packaging/man/guard-config.json.5");
    let doc = read("docs/configuration.md");
    for key in config::KNOWN_KEYS {
        assert!(page.contains(&format!(".TP\n\\fB{key}\\fR (")), "guard-config.json(5) has no entry for {key}");
        assert!(doc.contains(&format!("### `{key}`")), "docs/configuration.md has no section for {key}");
    }
    let defaults = [
        format!("default \\fB{}\\fR", config::DEFAULT_THRESHOLD),
        format!("default \\fB\"{}h\"\\fR", config::DEFAULT_TIMEOUT.as_secs() / 3600),
        format!("default \\fB\"{}m\"\\fR", config::DEFAULT_WARN_BEFORE.as_secs() / 60),
        format!("default \\fB{}\\fR", config::DEFAULT_REPEAT_AFTER),
        format!("default \\fB{}\\fR", config::DEFAULT_LOG_MAX_MB),
        format!("default \\fB\"{}\"\\fR", config::DEFAULT_STATE_FILE.replace('-', "\\-")),
    ];
    for d in &defaults {
        assert!(page.contains(d.as_str()), "guard-config.json(5) lacks {d}");
    }
    let excludes: Vec<String> = config::DEFAULT_EXCLUDES.iter().map(|e| format!("\"{e}\"")).collect();
    assert!(page.contains(&format!("default \\fB[{}]\\fR", excludes.join(", "))), "the default excludes");
}

#[guard_test]
fn the_readme_demo_config_is_valid_and_shows_a_pile_within_two_minutes() {
    let bytes = fs::read(repo("config/demo-config.json")).unwrap();
    let c = config::parse(&bytes, Path::new("/home/guard-demo")).unwrap();
    assert!(c.unknown_keys.is_empty());
    // Six processes flag it; one minute flagged at ten-second ticks ends them well within two
    // minutes of the pile; the warning comes in between.
    assert!(c.threshold <= 6, "the README starts six processes");
    assert!(c.timeout.as_secs() + 10 < 120, "enforcement due {}s after the pile", c.timeout.as_secs() + 10);
    assert!(c.warn_before > std::time::Duration::ZERO && c.warn_before < c.timeout);
    let readme = read("README.md");
    assert!(readme.contains("config/demo-config.json") && readme.contains("--interval 10s"));
    assert!(readme.contains("for i in 1 2 3 4 5 6;"), "the README's pile");
}

#[guard_test]
fn the_monitoring_examples_name_only_metrics_guard_writes() {
    let status = guard::status::Status {
        user: "alice".into(),
        last_tick: 3.0,
        names: vec![guard::domain::NameStatus {
            name: "sleep".into(),
            flagged_since: Some(2.0),
            time_left_secs: Some(2.0),
            ..Default::default()
        }],
        // Sessions and slots on: their families are written only then.
        sessions: Some(Default::default()),
        slots: Some(guard::status::SlotsStatus {
            slots: vec![guard::status::SlotStatus { name: "build".into(), max: 2, ..Default::default() }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let input = metrics::MetricsInput {
        names: vec![(Comm::new(b"sleep"), 31)],
        threshold: Some(30),
        timeout_secs: Some(3600.0),
        ..Default::default()
    };
    let written: BTreeSet<String> = metrics::render(&status, &input)
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    assert!(written.contains("guard_config_error") && written.contains("guard_repeat_offenders"));
    let mut used = BTreeSet::new();
    for file in ["guard-dashboard.json", "guard-alerts.yml", "guard-alerts.test.yml"] {
        let text = read(&format!("packaging/monitoring/{file}"));
        for (at, _) in text.match_indices("guard_") {
            let name: String =
                text[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit()).collect();
            // `guard_user` is the bash function, `guard-user` the program: neither is a metric.
            if name.len() > "guard_".len() && !text[..at].ends_with(|c: char| c.is_ascii_alphanumeric()) {
                used.insert((file, name));
            }
        }
    }
    assert!(used.len() >= 15, "{used:?}");
    for (file, name) in &used {
        assert!(written.contains(name), "{file} uses {name}, which guard-user does not write");
    }
}

/// The exit statuses the man pages render (guard-cli's table) are the binary's: each row is
/// driven into being here where that is quick, or names the test that drives it (which must
/// exist); docs/operations.md's table is the same table.
#[guard_test]
fn every_documented_exit_status_is_what_the_binary_returns() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_str().unwrap();
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() }.to_string();
    let run = |args: &[&str]| guard().args(args).env_remove("SUDO_USER").output().unwrap().status.code();
    let mine = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--user", &me, "--home", home]);
        run(&all)
    };
    fs::write(dir.path().join("ok.json"), "{}").unwrap();
    fs::write(dir.path().join("bad.json"), r#"{"threshold": 0}"#).unwrap();
    let ok = dir.path().join("ok.json");
    let bad = dir.path().join("bad.json");
    let mut driven: Vec<(&str, u8, Option<i32>)> = vec![
        ("match", 0, run(&["match", "--pattern", "a", "--cmdline", "a"])),
        ("match", 2, run(&["match", "--pattern", "(a", "--cmdline", "a"])),
        ("explain", 1, mine(&["explain", "sleep"])),
        ("status", 1, mine(&["status"])),
        ("tree", 1, mine(&["tree"])),
        ("validate", 0, mine(&["validate", ok.to_str().unwrap()])),
        ("validate", 1, mine(&["validate", bad.to_str().unwrap()])),
        // An account with nothing to hide from root (the caller's own may include a process root
        // cannot read, e.g. a pid 1 with more capabilities: that is exit 2, "not read completely").
        ("holders", 0, run(&["holders", home, "--user", "nobody"])),
        ("holders", 2, run(&["holders", &format!("{home}/not-there"), "--user", &me])),
        ("*", 2, run(&["run", "--interval", "soon"])),
    ];
    fs::copy(&ok, dir.path().join("guard-config.json")).unwrap();
    driven.push(("explain", 0, mine(&["explain", "sleep"])));
    // Elsewhere, where a daemon, a unit or a pipe is needed: file and test.
    let elsewhere: &[(&str, u8, &str, &str)] = &[
        ("run", 0, "guard-user/tests/operator_output.rs", "fn a_closed_stderr_never_ends_the_daemon"),
        ("run", 70, "tests/tests/supervise.rs", "fn a_hung_tick_warns_once_then_exits_70"),
        ("run", 75, "tests/tests/supervise.rs", "fn a_second_daemon_for_the_same_account_and_home_exits_75"),
        ("status", 0, "guard-user/tests/status_view.rs", "fn both_views_exit_one_when_the_status_is_stale"),
        ("tree", 0, "guard-user/tests/json_schema.rs", "fn tree_json_has_exactly_the_documented_fields"),
        ("holders", 1, "tests/tests/holders.rs", "fn exit_status_says_none_some_or_error"),
        ("check", 0, "tests/tests/install.rs", "fn check_reports_every_drift_and_install_brings_it_in_sync"),
        ("check", 1, "tests/tests/install.rs", "fn check_reports_every_drift_and_install_brings_it_in_sync"),
        ("install", 0, "tests/tests/install.rs", "fn check_reports_every_drift_and_install_brings_it_in_sync"),
        (
            "install",
            1,
            "tests/tests/install.rs",
            "fn install_without_systemd_links_and_says_the_guard_is_not_scheduled",
        ),
        (
            "uninstall",
            0,
            "tests/tests/install.rs",
            "fn uninstall_removes_the_unit_and_binary_but_keeps_the_link_and_log",
        ),
        ("*", 141, "guard-user/tests/operator_output.rs", "fn a_reader_that_goes_away_ends_a_subcommand_quietly"),
    ];
    for row in guard_cli::EXIT_STATUSES {
        let key = (row.command, row.code);
        if let Some((_, _, got)) = driven.iter().find(|(c, code, _)| (*c, *code) == key) {
            assert_eq!(*got, Some(i32::from(row.code)), "{} exits {:?}, documented {}", row.command, got, row.code);
        } else {
            let (_, _, file, test) = elsewhere
                .iter()
                .find(|(c, code, _, _)| (*c, *code) == key)
                .unwrap_or_else(|| panic!("exit {} of {} is neither driven here nor named", row.code, row.command));
            assert!(read(file).contains(test), "{file} has no `{test}` for exit {} of {}", row.code, row.command);
        }
    }
    // docs/operations.md carries the same table, row for row.
    let doc = read("docs/operations.md");
    let table = doc.split("<!-- exit statuses: guard-cli/src/exit_status.rs -->\n").nth(1).expect("the marker");
    let rows: Vec<String> = table.lines().skip(2).take_while(|l| l.starts_with('|')).map(str::to_string).collect();
    let want: Vec<String> = guard_cli::EXIT_STATUSES
        .iter()
        .map(|r| {
            let cmd = if r.command == "*" { "every command".to_string() } else { format!("`{}`", r.command) };
            format!("| {cmd} | {} | {} |", r.code, r.meaning)
        })
        .collect();
    assert_eq!(rows, want, "docs/operations.md's exit statuses differ from guard-cli's table");
}

/// guard-user(8)'s CONFIGURATION list (guard-cli's CONFIG_KEYS) is the parser's: the same keys
/// in the same order, each with the parser's default.
#[guard_test]
fn the_main_man_page_lists_every_config_key_with_the_parsers_default() {
    let keys: Vec<&str> = guard_cli::CONFIG_KEYS.iter().map(|k| k.key).collect();
    assert_eq!(keys, config::KNOWN_KEYS);
    let d = config::Config::defaults(Path::new("/h"));
    let default = |key: &str| guard_cli::CONFIG_KEYS.iter().find(|k| k.key == key).unwrap().default;
    assert_eq!(default("threshold"), d.threshold.to_string());
    assert_eq!(default("timeout"), format!("\"{}h\"", d.timeout.as_secs() / 3600));
    assert_eq!(default("logMaxSizeMB"), (d.log_max_bytes >> 20).to_string());
    assert_eq!(default("stateFile"), format!("\"{}\"", config::DEFAULT_STATE_FILE));
    assert_eq!(default("warnBefore"), format!("\"{}m\"", d.warn_before.as_secs() / 60));
    assert_eq!(default("repeatAfter"), d.repeat_after.to_string());
    let s = d.stall_watch.unwrap();
    assert_eq!(
        default("stallWatch"),
        format!(r#"{{"peggedCpu": {}, "peggedFor": "{}m"}}"#, s.pegged_cpu, s.pegged_for.as_secs() / 60)
    );
    assert_eq!(default("sessions"), if d.sessions.is_none() { "off" } else { "on" });
    for name in &d.excludes {
        assert!(default("excludes").split([' ', ',']).any(|w| w == name), "the excludes default lacks {name}");
    }
    assert!(default("excludeCommands").contains(&format!("the {} ", d.exclude_commands.len())));
}

/// `/etc/default/guard-user` as the package ships it: GUARD_ARGS empty, and every flag its
/// comments suggest is one `run` starts with.
#[guard_test]
fn the_packaged_defaults_file_is_valid_and_its_examples_are_flags_run_takes() {
    use clap::Parser as _;
    let text = read("packaging/debian/default");
    assert_eq!(install::defaults::env_file_value(&text, "GUARD_ARGS").as_deref(), Some(""));
    let examples: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("#   --")).map(|l| l.split("  ").next().unwrap().trim()).collect();
    assert!(examples.len() >= 3, "{examples:?}");
    for e in examples {
        let mut argv = vec!["guard-user".to_string(), "run".into()];
        argv.extend(install::defaults::split_words(&format!("--{e}")));
        let cli = guard_cli::Cli::try_parse_from(&argv).unwrap_or_else(|err| panic!("--{e}: {err}"));
        let Some(guard_cli::Command::Run(args)) = cli.command else { panic!("--{e}") };
        guard::daemon::flags::run_flags(&args, "alice").unwrap_or_else(|err| panic!("--{e}: {err}"));
    }
}

/// What docs/operations.md says `status --fleet` answers for a `rediss://` endpoint is what it
/// answers.
#[guard_test]
fn a_tls_endpoint_is_refused_in_the_words_operations_md_quotes() {
    let o = guard()
        .args(["status", "--fleet"])
        .env_remove("AGENTIHOOKS_HIVE_REDIS_URL")
        .env("AGENTIHOOKS_SWARM_REDIS_URL", "rediss://127.0.0.1:1/0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    let doc = read("docs/operations.md").replace('\n', " ");
    let quoted = "is not usable: TLS (rediss://) is not supported; use redis:// on a trusted network or a unix socket";
    assert!(doc.contains(quoted) && err.contains(quoted), "{err}");
}

/// README's Usage block shows every subcommand an operator has (`--help`'s list, hidden ones
/// left out), and none it lacks.
#[guard_test]
fn the_readme_usage_shows_every_visible_subcommand() {
    use clap::CommandFactory as _;
    let readme = read("README.md");
    let usage = readme.split("## Usage").nth(1).unwrap().split("```").nth(1).unwrap();
    let shown: BTreeSet<&str> = usage
        .lines()
        .filter_map(|l| l.strip_prefix("guard-user "))
        .flat_map(|rest| rest.split_whitespace().next())
        .flat_map(|w| w.trim_matches(['[', ']']).split('|'))
        .filter(|w| !w.starts_with('-'))
        .collect();
    let cli = guard_cli::Cli::command();
    let visible: BTreeSet<&str> = cli.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name()).collect();
    assert_eq!(shown, visible, "README's Usage against the subcommands of --help");
}

/// README's Usage never shows `holders --stop` without the `--user` it requires (as root, a stop
/// without it would be refused; the hint it prints always carries it).
#[guard_test]
fn the_readme_usage_shows_holders_stop_with_its_user() {
    let readme = read("README.md");
    let usage = readme.split("## Usage").nth(1).unwrap().split("```").nth(1).unwrap();
    let holders: Vec<&str> = usage.lines().filter(|l| l.starts_with("guard-user holders ")).collect();
    assert!(!holders.is_empty());
    for l in &holders {
        assert!(l.starts_with("guard-user holders PATH "), "PATH may be a file: {l}");
        let args = l.split('#').next().unwrap();
        if args.contains("--stop") {
            assert!(args.contains("--user NAME --stop") || args.contains("--user NAME] --stop"), "{l}");
            assert!(!args.contains("[--user"), "--stop needs --user: {l}");
        }
    }
    assert!(holders.iter().any(|l| l.contains("--stop")), "{holders:?}");
}

/// guard-config.json(5) names the keys the packaged config sets; the file sets exactly those.
#[guard_test]
fn the_config_man_page_says_which_keys_the_packaged_config_sets() {
    let page = read("packaging/man/guard-config.json.5");
    let claim = page.split("The default configuration shipped by the package: ").nth(1).expect("the FILES entry");
    let claim = claim.split(" at their defaults").next().unwrap().replace('\n', " ");
    let named: BTreeSet<String> =
        claim.split([',', ' ']).filter(|w| !w.is_empty() && *w != "and").map(String::from).collect();
    let shipped: serde_json::Value = serde_json::from_str(&read("config/guard-config.json")).unwrap();
    let keys: BTreeSet<String> = shipped.as_object().unwrap().keys().cloned().collect();
    assert_eq!(named, keys);
    let c = config::parse(read("config/guard-config.json").as_bytes(), Path::new("/h")).unwrap();
    assert_eq!(c, config::Config::defaults(Path::new("/h")), "the packaged config is the defaults");
}

guard_test::main!();
