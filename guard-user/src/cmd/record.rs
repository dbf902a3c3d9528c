//! `guard-user record --out FILE --seconds N`: records what the kernel reports about one
//! account's processes into a trace (`crate::trace`) that replays through the daemon without
//! root. Needs the ebpf backend (root).
use std::{
    collections::HashSet,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::Context;

use super::RecordArgs;
use crate::{
    daemon::EventSource,
    ebpf::{EbpfOptions, EbpfSource},
    event::{Event, StateKind},
    procfs,
    trace::{Record, Trace},
};

/// Command-line bytes one recording reads in all (the trace is held until it is written, and the
/// account decides how long its command lines are), and how long one read may take (a process
/// can make its memory slow to read).
const RECORD_CMDLINE_BYTES: usize = 64 << 20;
const ONE_READ_FOR: Duration = Duration::from_millis(250);

/// Reads command lines for the trace within [`RECORD_CMDLINE_BYTES`] and [`ONE_READ_FOR`] each.
struct Texts {
    budget: crate::budget::Budget,
    unread: u64,
}

impl Texts {
    fn read(&mut self, pid: u32) -> Option<Vec<u8>> {
        let max = crate::pattern::Limits::default().max_text_bytes;
        let mut one = self.budget.ending(Instant::now() + ONE_READ_FOR);
        let mut buf = Vec::new();
        let read = procfs::read_cmdline(pid, max, &mut one, &mut buf);
        self.budget = crate::budget::Budget::bytes(one.left());
        match read {
            procfs::CmdRead::Text => Some(buf),
            procfs::CmdRead::Gone => None,
            procfs::CmdRead::Stopped(_) => {
                self.unread += 1;
                None
            }
        }
    }
}

pub fn main(args: RecordArgs) -> anyhow::Result<ExitCode> {
    let (account, _, _) = super::account(&args.account, "record", crate::account::Purpose::Acts)?;
    let seconds = crate::duration::parse_duration(&args.seconds).context("--seconds")?;
    let mut src = EbpfSource::load(&EbpfOptions { ring_bytes: None, ..Default::default() })
        .context("loading the BPF programs")?;
    let uid = account.uid;
    let began = Instant::now();
    let t = || began.elapsed().as_secs_f64();
    let mut texts = Texts { budget: crate::budget::Budget::bytes(RECORD_CMDLINE_BYTES), unread: 0 };
    let mut trace = Trace { uid, note: args.note.clone().unwrap_or_default(), records: Vec::new() };
    let scan = account_scan(uid)?;
    let mut mine: HashSet<u32> = scan.iter().map(|p| p.id.pid).collect();
    trace.records.push((t(), Record::Scan(scan.clone())));
    trace.records.push((t(), parents_of(&scan)));
    for p in &scan {
        if let Some(text) = texts.read(p.id.pid) {
            trace.records.push((t(), Record::Cmdline { pid: p.id.pid, text }));
        }
    }
    {
        use std::io::Write;
        // Scripts start their workload once this line is out: from here on nothing is missed.
        let mut out = std::io::stdout().lock();
        writeln!(out, "recording")?;
        out.flush()?;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let lost_before = src.lost();
    let mut lost_seen = lost_before;
    rt.block_on(async {
        let mut batch = Vec::new();
        while began.elapsed() < seconds {
            let left = seconds.saturating_sub(began.elapsed());
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), src.wait()).await;
            batch.clear();
            EventSource::drain(&mut src, usize::MAX, &mut batch);
            let now = t();
            record_batch(&batch, now, uid, &mut mine, &mut texts, &mut trace);
            let lost_now = src.lost();
            if lost_now > lost_seen {
                let at = t();
                trace.records.push((at, Record::Lost(lost_now - lost_seen)));
                lost_seen = lost_now;
                // What the lost events did is unknown: from here on the truth is a fresh scan,
                // which a replay's rebuild reads (as the daemon's reads /proc). What the ring
                // still holds happened before the scan, so it goes before it (a fork queued
                // there whose exit was lost would otherwise come after the scan and live on in
                // the truth), as the daemon applies what is queued before its scan starts. They
                // carry the loss's time, so the replay has them by the time the loss starts
                // the rebuild.
                for _ in 0..64 {
                    batch.clear();
                    if EventSource::drain(&mut src, usize::MAX, &mut batch) == 0 {
                        break;
                    }
                    record_batch(&batch, at, uid, &mut mine, &mut texts, &mut trace);
                }
                if let Ok(scan) = account_scan(uid) {
                    mine = scan.iter().map(|p| p.id.pid).collect();
                    let parents = parents_of(&scan);
                    trace.records.push((at, Record::Scan(scan)));
                    trace.records.push((at, parents));
                }
            }
        }
    });
    // A command line read right at exec can come back empty (the new image's arguments are not
    // set up yet); read every live process's once more, so a replay classifies what ran.
    let mut last: std::collections::HashMap<u32, Vec<u8>> = std::collections::HashMap::new();
    for (_, r) in &trace.records {
        if let Record::Cmdline { pid, text } = r {
            last.insert(*pid, text.clone());
        }
    }
    let mut live: Vec<u32> = mine.iter().copied().collect();
    live.sort_unstable();
    for pid in live {
        if let Some(text) = texts.read(pid).filter(|t| !t.is_empty()) {
            if last.get(&pid) != Some(&text) {
                trace.records.push((t(), Record::Cmdline { pid, text }));
            }
        }
    }
    if texts.unread > 0 {
        eprintln!(
            "guard-user record: {} command lines were not recorded (over the {} MiB a recording reads, or slower \
             than {} ms to read)",
            texts.unread,
            RECORD_CMDLINE_BYTES >> 20,
            ONE_READ_FOR.as_millis()
        );
    }
    let lost = lost_seen - lost_before;
    if lost > 0 {
        eprintln!(
            "guard-user record: the kernel could not deliver {lost} events; the trace marks where, each with a fresh scan after it"
        );
    }
    let mut out = Vec::new();
    trace.write(&mut out)?;
    std::fs::write(&args.out, out).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("guard-user record: {} records in {}", trace.records.len(), args.out.display());
    Ok(ExitCode::SUCCESS)
}

/// Records one drained batch at `at`: the account's events (and every event of a process that
/// was the account's), and the command line of each exec and fork.
fn record_batch(
    batch: &[crate::event::Event],
    at: f64,
    uid: u32,
    mine: &mut HashSet<u32>,
    texts: &mut Texts,
    trace: &mut Trace,
) {
    for e in batch {
        let Some(state) = e.state() else {
            if mine.remove(&e.id().pid) {
                trace.records.push((at, Record::Event { event: *e, lost: false }));
            }
            continue;
        };
        if state.euid != uid && !mine.contains(&state.id.pid) {
            continue;
        }
        trace.records.push((at, Record::Event { event: *e, lost: false }));
        if state.euid == uid {
            mine.insert(state.id.pid);
        }
        if matches!(e, Event::State { kind: StateKind::Exec, .. } | Event::Fork { .. }) {
            if let Some(text) = texts.read(state.id.pid).filter(|t| !t.is_empty()) {
                trace.records.push((at, Record::Cmdline { pid: state.id.pid, text }));
            }
        }
    }
}

/// The parent links of scanned processes (what the session lineage adopts them by).
fn parents_of(scan: &[crate::event::ProcState]) -> Record {
    let ids: Vec<_> = scan.iter().map(|p| p.id).collect();
    Record::Parents(crate::lineage::parents::read_parents(&ids).into_iter().map(|(id, pp)| (id.pid, pp)).collect())
}

/// The account's processes as /proc shows them now.
fn account_scan(uid: u32) -> std::io::Result<Vec<crate::event::ProcState>> {
    Ok(procfs::snapshot()?.into_iter().filter(|p| p.euid == uid).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_reads_command_lines_within_its_bytes_and_counts_what_it_left() {
        let me = std::process::id();
        let mut texts = Texts { budget: crate::budget::Budget::bytes(RECORD_CMDLINE_BYTES), unread: 0 };
        let whole = texts.read(me).expect("this process's command line");
        assert!(!whole.is_empty() && texts.unread == 0);
        // What is left is charged: a budget a few bytes short of the text stops the read.
        texts.budget = crate::budget::Budget::bytes(whole.len() / 2);
        assert_eq!(texts.read(me), None);
        assert_eq!(texts.unread, 1);
        assert_eq!(texts.read(u32::MAX), None, "a process that is not there");
        assert_eq!(texts.unread, 1, "a gone process is not a command line left unread");
    }
}
