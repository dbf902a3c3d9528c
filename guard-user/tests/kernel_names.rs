//! A process's name is the bytes the kernel keeps in `task->comm` (at most 15), whichever way it
//! got it and whichever source reports it: the BPF events (exec, prctl(PR_SET_NAME), a write to
//! /proc/PID/comm), the task iterator, the /proc scan, and the enforcer's identity check all
//! agree with /proc at every length, and with names made of the bytes that break parsers.
//!
//! Needs root and the ebpf backend (`needs = [root, ebpf]`). Named processes are this test
//! binary re-executed as a helper mode (`guard_test::child`; through a symlink named as the case
//! wants, for exec): the helper names the process, says `ready` and waits for its stdin to
//! close. A `Child` kills and reaps its process on drop.
mod ebpf_harness;

use std::{
    collections::HashMap,
    ffi::OsStr,
    os::unix::ffi::OsStrExt,
    process::Command,
    time::{Duration, Instant},
};

use guard_test::{
    child::{say, wait_for_eof, Child, HELPER_ENV},
    guard_test,
};

use guard::{
    comm::Comm,
    ebpf::{EbpfOptions, EbpfSource},
    enforcer::Enforcer,
    event::ProcState,
    procfs,
    table::{ProcessTable, Scope},
};

const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The helper side (runs in the child instead of the tests).

fn helper_main(mode: &str) {
    match mode.split_once(':') {
        None if mode == "exec" => {}
        Some(("prctl", hex)) => {
            // NUL-terminated; the kernel copies at most 15 bytes of it.
            let mut buf = unhex(hex);
            buf.push(0);
            // SAFETY: PR_SET_NAME reads a NUL-terminated string from a buffer we own.
            assert_eq!(unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr() as libc::c_ulong, 0, 0, 0) }, 0);
        }
        Some(("comm", hex)) => {
            // One write(2) of exactly these bytes (std's write_all makes none for no bytes).
            let name = unhex(hex);
            let f = std::fs::OpenOptions::new().write(true).open("/proc/self/comm").unwrap();
            // SAFETY: writes from a buffer we own to an fd we own.
            let n = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&f), name.as_ptr().cast(), name.len()) };
            assert_eq!(n, name.len() as isize, "{}", std::io::Error::last_os_error());
        }
        _ => panic!("unknown helper mode {mode}"),
    }
    say("ready");
    wait_for_eof();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

// ---------------------------------------------------------------------------------------------
// The test side.

/// How a case's process gets its name.
#[derive(Clone, Copy, Debug)]
enum How {
    /// exec of a file (a symlink to this binary) with that name.
    Exec,
    /// prctl(PR_SET_NAME).
    Prctl,
    /// A write to /proc/self/comm.
    CommWrite,
}

/// One named process.
struct Case {
    how: How,
    given: Vec<u8>,
    child: Child,
}

impl Case {
    /// What the kernel keeps of the name the case gives (none of them holds a NUL).
    fn kept(&self) -> &[u8] {
        &self.given[..self.given.len().min(15)]
    }

    fn label(&self) -> String {
        format!("{:?} of {:?} ({} bytes)", self.how, Comm::new(&self.given), self.given.len())
    }
}

/// Starts one process per (way, name); exec cases run through symlinks in `dir`.
fn spawn_cases(dir: &std::path::Path, names: &[Vec<u8>]) -> Vec<Case> {
    let me = std::env::current_exe().unwrap();
    let mut cases = Vec::new();
    for given in names {
        for how in [How::Exec, How::Prctl, How::CommWrite] {
            let mut cmd = match how {
                // An empty file name cannot be exec'd.
                How::Exec if given.is_empty() => continue,
                How::Exec => {
                    let link = dir.join(OsStr::from_bytes(given));
                    if !link.exists() {
                        std::os::unix::fs::symlink(&me, &link).unwrap();
                    }
                    let mut c = Command::new(link);
                    c.env(HELPER_ENV, "exec");
                    c
                }
                How::Prctl | How::CommWrite => {
                    let mode = if matches!(how, How::Prctl) { "prctl" } else { "comm" };
                    let mut c = Command::new(&me);
                    c.env(HELPER_ENV, format!("{mode}:{}", hex(given)));
                    c
                }
            };
            let mut child = Child::spawn(&mut cmd);
            child.expect_line("ready");
            cases.push(Case { how, given: given.clone(), child });
        }
    }
    cases
}

/// `/proc/PID/comm`: the name and one newline the kernel adds (a name may end in newlines of
/// its own).
fn proc_comm(pid: u32) -> Vec<u8> {
    let mut raw = std::fs::read(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(raw.pop(), Some(b'\n'), "/proc/{pid}/comm ends with the kernel's newline");
    raw
}

/// Every disagreement about the cases' names between /proc, the table the BPF events built,
/// the task iterator, the /proc scan and the enforcer's identity check.
fn disagreements(src: &EbpfSource, table: &ProcessTable, cases: &[Case]) -> Vec<String> {
    let iter: HashMap<u32, ProcState> = src
        .task_iter()
        .expect("the task iterator loads on a kernel with BTF")
        .proc_states()
        .unwrap()
        .into_iter()
        .map(|p| (p.id.pid, p))
        .collect();
    let events: HashMap<u32, ProcState> = table.processes().into_iter().map(|p| (p.id.pid, p)).collect();
    let enforcer = Enforcer::new(0, std::process::id(), Duration::ZERO);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for c in cases {
        let pid = c.child.pid();
        let kept = c.kept();
        let shown = proc_comm(pid);
        if shown != kept {
            out.push(format!("{}: /proc/{pid}/comm shows {:?}, not the 15 bytes kept", c.label(), Comm::new(&shown)));
            continue;
        }
        let Some(scanned) = procfs::read_process(pid, &mut buf) else {
            out.push(format!("{}: the /proc read lost pid {pid}", c.label()));
            continue;
        };
        if scanned.comm.as_bytes() != kept {
            out.push(format!("{}: the /proc read says {:?}", c.label(), scanned.comm));
        }
        if iter.get(&pid) != Some(&scanned) {
            out.push(format!("{}: the task iterator says {:?}, /proc {scanned:?}", c.label(), iter.get(&pid)));
        }
        let Some(tracked) = events.get(&pid) else {
            out.push(format!("{}: no event made pid {pid}", c.label()));
            continue;
        };
        if *tracked != scanned {
            out.push(format!("{}: the BPF events say {tracked:?}, /proc {scanned:?}", c.label()));
        }
        if table.get(pid).is_none_or(|p| p.comm != Comm::new(kept)) {
            out.push(format!("{}: the table does not count pid {pid} under the kept name", c.label()));
        }
        if let Err(r) = enforcer.verify(tracked) {
            out.push(format!("{}: the identity check refuses the tracked {tracked:?}: {r:?}", c.label()));
        }
    }
    out
}

/// Spawns the cases with the BPF programs attached and compares every source once the events
/// are in (bounded: on a disagreement it keeps draining until the deadline, then reports).
fn all_sources_agree(names: &[Vec<u8>]) {
    let mut src = ebpf_harness::load(&EbpfOptions::default());
    if let Some(e) = src.task_iter_problem() {
        panic!("the task iterator did not load on a kernel with BTF: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let cases = spawn_cases(dir.path(), names);
    let mut table = ProcessTable::new(Scope::account(0));
    let deadline = Instant::now() + WAIT;
    loop {
        src.drain(usize::MAX, |e| table.apply(&e.expect("every record decodes")));
        let problems = disagreements(&src, &table, &cases);
        if problems.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("{} of {} named processes disagree:\n{}", problems.len(), cases.len(), problems.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[guard_test(needs = [root, ebpf])]
fn every_source_reports_the_name_the_kernel_keeps_at_every_length() {
    // 0 to 15 bytes, and 20 (the kernel keeps the first 15, the 15-byte case's name).
    let alphabet = b"n123456789abcdefghij";
    let names: Vec<Vec<u8>> = (0..=15).chain([20]).map(|n| alphabet[..n].to_vec()).collect();
    all_sources_agree(&names);
}

#[guard_test(needs = [root, ebpf])]
fn hostile_fifteen_byte_names_round_trip_through_proc_and_the_identity_check() {
    // The bytes that break a /proc parser: `)` and spaces that fake stat's field separator, a
    // newline that fakes a line end (also as the last byte, where /proc/PID/comm adds its own),
    // bytes that are not UTF-8, control characters, and the escape characters of the log.
    let names: Vec<Vec<u8>> = vec![
        b"x) R 9 9\n\xff ( \n)".to_vec(),
        b") S 1 (\xfe\t\x1b=\\ \n\n".to_vec(),
        b"(((((((((((((((".to_vec(),
        b"               ".to_vec(),
    ];
    for n in &names {
        assert_eq!(n.len(), 15, "{n:?}");
    }
    all_sources_agree(&names);
}

guard_test::main!(helpers = helper_main);
