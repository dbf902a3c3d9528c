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
    let o = guard().args(["status", "--home"]).arg(dir.path()).output().unwrap();
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
        assert!(err.contains("no account to guard") && err.contains("--user"), "{args:?}: {err}");
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
    assert!(text(&o.stdout).contains("\nExecStart=/usr/bin/guard-user run --user %i\n"));
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
        names: vec![guard::status::NameStatus {
            name: "sleep".into(),
            flagged_since: Some(2.0),
            time_left_secs: Some(2.0),
            ..Default::default()
        }],
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

guard_test::main!();
