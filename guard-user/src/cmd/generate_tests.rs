use std::{
    collections::BTreeSet,
    io::Write as _,
    path::Path,
    process::{Command as Process, Stdio},
};

use clap::{Command, CommandFactory as _};
use clap_complete::Shell;

use super::*;

/// `(hidden, visible)` subcommand names and long options anywhere in the tree.
fn names(cmd: &Command) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut hidden, mut visible) = (BTreeSet::new(), BTreeSet::new());
    fn walk(cmd: &Command, hidden: &mut BTreeSet<String>, visible: &mut BTreeSet<String>) {
        for arg in cmd.get_arguments() {
            if let Some(long) = arg.get_long() {
                let set = if arg.is_hide_set() { &mut *hidden } else { &mut *visible };
                set.insert(format!("--{long}"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.is_hide_set() {
                hidden.insert(sub.get_name().to_string());
            } else {
                visible.insert(sub.get_name().to_string());
                walk(sub, hidden, visible);
            }
        }
    }
    walk(cmd, &mut hidden, &mut visible);
    (hidden, visible)
}

/// roff escapes `-` as `\-`; the reader sees `-`.
fn unroff(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 man page").replace("\\-", "-")
}

#[test]
fn hidden_subcommands_and_options_stay_out_of_the_man_pages_and_completions() {
    let (hidden, _) = names(&Cli::command());
    // The test means nothing unless there is something hidden to leak.
    assert!(hidden.contains("__generate"), "hidden: {hidden:?}");
    assert!(hidden.contains("--ring-bytes"), "hidden: {hidden:?}");
    for file in generate(Path::new("/usr/bin"), "2026-01-01").unwrap() {
        if file.name == install::UNIT_NAME {
            continue;
        }
        let text = unroff(&file.bytes);
        for name in &hidden {
            assert!(!text.contains(name.as_str()), "{} names the hidden {name}", file.name);
        }
        assert!(!file.name.contains("__"), "a page for a hidden subcommand: {}", file.name);
    }
}

#[test]
fn every_visible_subcommand_and_option_is_in_each_completion() {
    let (_, visible) = names(&Cli::command());
    assert!(visible.contains("install") && visible.contains("--dry-run"), "visible: {visible:?}");
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let text = String::from_utf8(completion(shell)).unwrap();
        for name in &visible {
            // fish names long options without their dashes (`-l dry-run`).
            let bare = name.trim_start_matches("--");
            assert!(text.contains(name.as_str()) || text.contains(bare), "{shell:?} lacks {name}");
        }
    }
}

#[test]
fn one_man_page_per_visible_subcommand_and_the_main_page_names_them() {
    let pages = man_pages("2026-01-01").unwrap();
    let got: Vec<&str> = pages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(got[0], "guard-user.8");
    let main = unroff(&pages[0].bytes);
    assert!(main.contains("\n.TH guard-user 8 2026-01-01 \"guard-user "), "{}", &main[..120]);
    for sub in Cli::command().get_subcommands().filter(|s| !s.is_hide_set()) {
        let page = format!("guard-user-{}.8", sub.get_name());
        assert!(got.contains(&page.as_str()), "no {page} in {got:?}");
        assert!(main.contains(&format!("guard-user-{}(8)", sub.get_name())), "guard-user(8) does not name {page}");
    }
    assert!(main.contains(".SH FILES") && main.contains(".SH DESCRIPTION"));
}

#[test]
fn help_and_man_pages_name_nothing_an_operator_lacks() {
    // The contract and the developer notes are not shipped; neither is a checkout's relative path.
    let lacks = ["SPEC", "DEVELOPERS", "../", "/work/"];
    fn helps(cmd: &mut Command, out: &mut Vec<(String, String)>) {
        out.push((cmd.get_name().to_string(), cmd.render_long_help().to_string()));
        for sub in cmd.get_subcommands_mut() {
            helps(sub, out);
        }
    }
    let mut texts = Vec::new();
    let mut cli = Cli::command();
    cli.build();
    helps(&mut cli, &mut texts);
    for page in man_pages("2026-01-01").unwrap() {
        texts.push((page.name.clone(), unroff(&page.bytes)));
    }
    for (name, text) in &texts {
        for word in lacks {
            assert!(!text.contains(word), "{name}'s help or page mentions {word}:\n{text}");
        }
    }
}

#[test]
fn the_packaged_unit_is_installs_unit_for_the_packaged_bin_dir() {
    let files = generate(Path::new("/usr/bin"), "").unwrap();
    let unit = files.iter().find(|f| f.name == "guard-user@.service").expect("a unit");
    let exe = install::escape::Executable::new(Path::new("/usr/bin/guard-user")).unwrap();
    assert_eq!(unit.bytes, install::unit_text(&exe).into_bytes());
    assert!(String::from_utf8_lossy(&unit.bytes).contains("\nExecStart=/usr/bin/guard-user run --user %i\n"));
}

#[test]
fn man_pages_format_without_groff_warnings() {
    // lintian runs the same check (groff-message); groff-base comes with man-db.
    if Process::new("groff").arg("--version").output().is_err() {
        eprintln!("skipped: groff is not installed (apt-get install groff-base)");
        return;
    }
    for page in man_pages("2026-01-01").unwrap() {
        let mut groff = Process::new("groff")
            .args(["-man", "-ww", "-z", "-Tutf8", "-rLL=80n"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        groff.stdin.take().unwrap().write_all(&page.bytes).unwrap();
        let out = groff.wait_with_output().unwrap();
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && warnings.trim().is_empty(), "{}: {warnings}", page.name);
    }
}
