//! The state file's bounds: what the reader takes, what it rejects, what the writer writes.
use std::{collections::BTreeMap, fmt::Write as _};

use super::*;

/// The `i`-th distinct name of 15 bytes that all escape (`\xNN` each): the longest a key gets.
fn long_name(i: usize) -> Comm {
    let mut b = [0xffu8; 15];
    b[0] = 0x80 | (i & 0x3f) as u8;
    b[1] = 0x80 | ((i >> 6) & 0x3f) as u8;
    b[2] = 0x80 | ((i >> 12) & 0x3f) as u8;
    Comm::new(&b)
}

/// `{"version":2,"flagged":{<n entries>}, <extra>}` with short distinct names.
fn flagged_json(n: usize, t: f64, extra: &str) -> String {
    let mut s = String::from(r#"{"version":2,"flagged":{"#);
    for i in 0..n {
        let _ = write!(s, r#"{}"n{i}":{t}"#, if i == 0 { "" } else { "," });
    }
    s + "}" + extra + "}"
}

fn history(entries: usize, t: f64) -> String {
    let list: Vec<String> = (0..entries).map(|_| format!("[{t},1]")).collect();
    format!(r#"{{"enforcements":[{}]}}"#, list.join(","))
}

fn rejected(text: &str) -> Option<Rejection> {
    match parse_checked(text.as_bytes()) {
        Err(ParseError::Rejected(r)) => Some(r),
        _ => None,
    }
}

#[test]
fn a_state_at_every_bound_loads_and_one_past_any_bound_is_rejected() {
    let at = flagged_json(MAX_FLAGGED_NAMES, 5.0, "");
    assert_eq!(parse_checked(at.as_bytes()).unwrap().clocks.len(), MAX_FLAGGED_NAMES);
    assert_eq!(rejected(&flagged_json(MAX_FLAGGED_NAMES + 1, 5.0, "")), Some(Rejection::TooManyFlagged));

    let warned = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!(r#""w{i}":1"#)).collect();
        flagged_json(1, 1.0, &format!(r#","warned":{{{}}}"#, list.join(",")))
    };
    assert_eq!(parse_checked(warned(MAX_FLAGGED_NAMES).as_bytes()).unwrap().warned.len(), MAX_FLAGGED_NAMES);
    assert_eq!(rejected(&warned(MAX_FLAGGED_NAMES + 1)), Some(Rejection::TooManyWarned));

    let repeats = |names: usize, each: usize| {
        let list: Vec<String> = (0..names).map(|i| format!(r#""r{i}":{}"#, history(each, 7.0))).collect();
        flagged_json(1, 1.0, &format!(r#","repeats":{{{}}}"#, list.join(",")))
    };
    assert_eq!(parse_checked(repeats(MAX_REPEAT_NAMES, 16).as_bytes()).unwrap().repeats.len(), MAX_REPEAT_NAMES);
    assert_eq!(rejected(&repeats(MAX_REPEAT_NAMES + 1, 0)), Some(Rejection::TooManyRepeats));
    let one = parse_checked(repeats(1, MAX_REPEAT_ENTRIES).as_bytes()).unwrap();
    assert_eq!(one.repeats.values().next().unwrap().enforcements.len(), MAX_REPEAT_ENTRIES);
    assert_eq!(rejected(&repeats(1, MAX_REPEAT_ENTRIES + 1)), Some(Rejection::HistoryTooLong));
    // 17 names × 1000 enforcements: each history within its bound, the whole over its own.
    assert_eq!(rejected(&repeats(17, 1000)), Some(Rejection::TooManyEnforcements));

    // The legacy flat map has the clocks' bound too.
    let flat: Vec<String> = (0..=MAX_FLAGGED_NAMES).map(|i| format!(r#""n{i}":1"#)).collect();
    assert_eq!(rejected(&format!("{{{}}}", flat.join(","))), Some(Rejection::TooManyFlagged));
}

#[test]
fn a_planted_file_of_hundreds_of_thousands_of_entries_is_rejected_at_the_first_one_over() {
    // What made the daemon need more than 64 MiB at every start: ~4 MiB of valid clocks, times
    // in the future.
    let text = flagged_json(440_000, 9e12, "");
    assert_eq!(rejected(&text), Some(Rejection::TooManyFlagged));
    // `version` last (as the writer sorts it) changes nothing.
    let late = text.replacen(r#""version":2,"#, "", 1).replacen("}}", r#"},"version":2}"#, 1);
    assert_eq!(rejected(&late), Some(Rejection::TooManyFlagged));
    let one_history = flagged_json(1, 1.0, &format!(r#","repeats":{{"x":{}}}"#, history(300_000, 9e12)));
    assert_eq!(rejected(&one_history), Some(Rejection::HistoryTooLong));
}

#[test]
fn a_key_longer_than_any_name_is_never_kept_and_keeps_its_old_meaning() {
    let long = "k".repeat(100_000);
    // Version 2: a key that is not a name makes the file malformed, as before.
    let v2 = format!(r#"{{"version":2,"flagged":{{"{long}":1}}}}"#);
    assert_eq!(parse_checked(v2.as_bytes()), Err(ParseError::Malformed));
    // Version 1 and the flat map: a plain key longer than a name is dropped, as before.
    let v1 = format!(r#"{{"version":1,"flagged":{{"{long}":1,"ok":2}}}}"#);
    assert_eq!(parse(v1.as_bytes()).unwrap(), FlagClocks::from([(Comm::new(b"ok"), 2.0)]));
    let flat = format!(r#"{{"{long}":1,"ok":2}}"#);
    assert_eq!(parse(flat.as_bytes()).unwrap(), FlagClocks::from([(Comm::new(b"ok"), 2.0)]));
}

#[test]
fn the_largest_state_the_daemon_writes_is_read_back() {
    let clocks: FlagClocks = (0..MAX_FLAGGED_NAMES).map(|i| (long_name(i), 1_800_000_000.123 + i as f64)).collect();
    let names = MAX_REPEAT_TOTAL / MAX_REPEAT_ENTRIES;
    let repeats: BTreeMap<Comm, RepeatHistory> = (0..MAX_REPEAT_NAMES)
        .map(|i| {
            let each = if i < names { MAX_REPEAT_ENTRIES } else { 0 };
            let enforcements = (0..each).map(|k| (1_800_000_000.123 + k as f64, 4_000_000_000)).collect();
            (long_name(i), RepeatHistory { enforcements, reported: Some(1_800_000_000.123) })
        })
        .collect();
    let state = State { warned: clocks.clone(), clocks, repeats };
    assert_eq!(bounded(&state).as_ref(), &state, "this state is within every bound");
    let bytes = render_state("a-user-name-of-thirty-two-bytes", &state);
    assert!(bytes.len() as u64 <= MAX_STATE_BYTES, "{} bytes", bytes.len());
    assert_eq!(parse_state(&bytes).unwrap(), state);
}

#[test]
fn the_writer_keeps_the_oldest_clocks_when_more_names_are_flagged_than_a_file_holds() {
    let clocks: FlagClocks = (0..MAX_FLAGGED_NAMES + 10).map(|i| (long_name(i), 100.0 + i as f64)).collect();
    let state = State { warned: clocks.clone(), clocks, ..Default::default() };
    let back = parse_state(&render_state("u", &state)).unwrap();
    assert_eq!(back.clocks.len(), MAX_FLAGGED_NAMES);
    assert!(back.clocks.contains_key(&long_name(0)) && !back.clocks.contains_key(&long_name(MAX_FLAGGED_NAMES)));
    assert_eq!(back.warned, back.clocks);
}

#[test]
fn repeat_histories_are_capped_oldest_first_in_n_log_n() {
    // 170,000 names, each reported in the future: a quadratic prune took 261 s on this.
    let mut repeats: BTreeMap<Comm, RepeatHistory> = (0..170_000usize)
        .map(|i| {
            let name = Comm::new(format!("n{i}").as_bytes());
            (name, RepeatHistory { enforcements: vec![(i as f64, 1)], reported: Some(9e12 + i as f64) })
        })
        .collect();
    let began = std::time::Instant::now();
    cap_repeats(&mut repeats);
    eprintln!("cap_repeats of 170,000 names: {:?}", began.elapsed());
    assert_eq!(repeats.len(), MAX_REPEAT_NAMES);
    assert!(repeats.contains_key(&Comm::new(b"n169999")) && !repeats.contains_key(&Comm::new(b"n0")));

    // Past the total, the oldest enforcements go, exactly as many as are over, ties included.
    let mut many: BTreeMap<Comm, RepeatHistory> = (0..20usize)
        .map(|i| {
            let enforcements = (0..1000).map(|k| (k as f64, 1)).collect();
            (Comm::new(format!("m{i}").as_bytes()), RepeatHistory { enforcements, reported: None })
        })
        .collect();
    cap_repeats(&mut many);
    let total: usize = many.values().map(|h| h.enforcements.len()).sum();
    assert_eq!(total, MAX_REPEAT_TOTAL);
    assert!(many.values().all(|h| h.enforcements.last() == Some(&(999.0, 1))), "the newest stay");
}

#[test]
fn a_rejected_file_says_which_bound_and_is_moved_aside_replacing_a_planted_link() {
    let dir = tempfile::tempdir().unwrap();
    let who = FsIdentity::current();
    let path = dir.path().join("state.json");
    std::fs::write(&path, flagged_json(MAX_FLAGGED_NAMES + 1, 1.0, "")).unwrap();
    let e = load_state(&path, who).unwrap_err().to_string();
    assert_eq!(e, format!("state_rejected path={} reason=too_many_flagged limit=4096", path.display()));
    assert!(path.exists(), "reading never moves the file (explain reads it too)");
    // An older .rejected is a link to something precious: replaced, never written through.
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "keep").unwrap();
    std::os::unix::fs::symlink(&precious, rejected_path(&path)).unwrap();
    let to = set_aside(&path, who).unwrap();
    assert_eq!(to, dir.path().join("state.json.rejected"));
    assert!(!path.exists());
    assert!(!std::fs::symlink_metadata(&to).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
    // A link in the state file's place is moved itself, not what it points to.
    std::os::unix::fs::symlink(&precious, &path).unwrap();
    set_aside(&path, who).unwrap();
    assert!(std::fs::symlink_metadata(&to).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
}
