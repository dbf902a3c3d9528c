//! Reading a trace back and replaying it through the daemon: test support (the replay tests,
//! `guard-user/tests/replay*.rs`), compiled with the `testing` feature and in unit tests only.
//! The shipped binary writes traces (`guard-user record`) and never reads one.
use std::{
    collections::HashMap,
    io::{self, BufRead},
    path::Path,
    sync::{Arc, Mutex},
};

use serde_json::{Map, Value};

use super::{Record, Trace};
use crate::{
    comm::Comm,
    daemon::source::{EventSource, Scanner},
    event::{Event, ProcId, ProcState, StateKind},
    table::{ProcessTable, Scope},
};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} line {line}: {what}")]
    Format { path: String, line: usize, what: String },
}

fn get_bytes(m: &Map<String, Value>, key: &str) -> Option<Vec<u8>> {
    if let Some(s) = m.get(key).and_then(Value::as_str) {
        return Some(s.as_bytes().to_vec());
    }
    m.get(&format!("{key}_bytes"))?.as_array()?.iter().map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok())).collect()
}

/// A `<proc>`; its `comm` must be a name the kernel can hold (docs/architecture.md), never cut
/// to one: a cut name would be another process's name.
fn proc_from(m: &Map<String, Value>, incomplete: &'static str) -> Result<ProcState, &'static str> {
    let n = |k: &str| m.get(k).and_then(Value::as_u64);
    let comm = get_bytes(m, "comm").ok_or(incomplete)?;
    Ok(ProcState {
        id: ProcId {
            pid: n("pid").and_then(|p| u32::try_from(p).ok()).ok_or(incomplete)?,
            start_ticks: n("start").ok_or(incomplete)?,
        },
        euid: n("euid").and_then(|u| u32::try_from(u).ok()).ok_or(incomplete)?,
        comm: Comm::exact(&comm).ok_or("a comm has more than 15 bytes or a NUL byte, which no kernel name has")?,
    })
}

impl Record {
    fn from_json(m: &Map<String, Value>) -> Result<(f64, Record), String> {
        let t = m.get("t").and_then(Value::as_f64).filter(|t| t.is_finite() && *t >= 0.0).ok_or("no valid \"t\"")?;
        if let Some(scan) = m.get("scan") {
            let procs = scan
                .as_array()
                .ok_or("\"scan\" is not an array")?
                .iter()
                .map(|p| {
                    let incomplete = "a scanned process is incomplete";
                    p.as_object().ok_or(incomplete).and_then(|m| proc_from(m, incomplete))
                })
                .collect::<Result<_, _>>()?;
            return Ok((t, Record::Scan(procs)));
        }
        if let Some(kind) = m.get("ev").and_then(Value::as_str) {
            let lost = m.get("lost").and_then(Value::as_bool).unwrap_or(false);
            let state = || proc_from(m, "the event's process is incomplete");
            let event = match kind {
                "fork" => Event::Fork {
                    child: state()?,
                    parent_pid: m.get("parent").and_then(Value::as_u64).unwrap_or(0) as u32,
                },
                "exit" => {
                    let n = |k: &str| m.get(k).and_then(Value::as_u64).ok_or("an exit needs pid and start");
                    Event::Exit(ProcId { pid: n("pid")? as u32, start_ticks: n("start")? })
                }
                other => match StateKind::from_token(other) {
                    Some(kind) => Event::State { kind, state: state()? },
                    None => return Err(format!("unknown event {other:?}")),
                },
            };
            return Ok((t, Record::Event { event, lost }));
        }
        if m.contains_key("cmdline") || m.contains_key("cmdline_bytes") {
            let pid = m.get("pid").and_then(Value::as_u64).ok_or("a cmdline needs a pid")? as u32;
            return Ok((t, Record::Cmdline { pid, text: get_bytes(m, "cmdline").ok_or("bad cmdline")? }));
        }
        if let Some(n) = m.get("lost").and_then(Value::as_u64) {
            return Ok((t, Record::Lost(n)));
        }
        if let Some(links) = m.get("parents") {
            let pair = |v: &Value| -> Option<(u32, u32)> {
                let a = v.as_array().filter(|a| a.len() == 2)?;
                Some((u32::try_from(a[0].as_u64()?).ok()?, u32::try_from(a[1].as_u64()?).ok()?))
            };
            let links = links.as_array().ok_or("\"parents\" is not an array")?;
            let links = links.iter().map(pair).collect::<Option<Vec<_>>>().ok_or("a parent link is not [pid, ppid]")?;
            return Ok((t, Record::Parents(links)));
        }
        Err("not a scan, an event, a cmdline, a lost count or parent links".into())
    }
}

impl Trace {
    pub fn parse(path: &str, reader: impl BufRead) -> Result<Trace, TraceError> {
        let mut trace = Trace::default();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|source| TraceError::Io { path: path.into(), source })?;
            let bad = |what: String| TraceError::Format { path: path.into(), line: i + 1, what };
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
            let m = v.as_object().ok_or_else(|| bad("not an object".into()))?;
            if i == 0 {
                if m.get("guard_trace").and_then(Value::as_u64) != Some(1) {
                    return Err(bad("the first line must be the header {\"guard_trace\":1,…}".into()));
                }
                trace.uid = m.get("uid").and_then(Value::as_u64).unwrap_or(0) as u32;
                trace.note = m.get("note").and_then(Value::as_str).unwrap_or_default().into();
                continue;
            }
            trace.records.push(Record::from_json(m).map_err(bad)?);
        }
        trace.records.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(trace)
    }

    pub fn open(path: &Path) -> Result<Trace, TraceError> {
        let name = path.display().to_string();
        let f = std::fs::File::open(path).map_err(|source| TraceError::Io { path: name.clone(), source })?;
        Trace::parse(&name, io::BufReader::new(f))
    }

    /// The parent pid of each live process of the truth at `upto` that is in `ids` (same start
    /// time): its fork record's parent, else the parent link recorded with a scan; a process
    /// whose parent is no longer alive was reparented, to init (`1`) here.
    pub fn parents(&self, upto: usize, ids: &[ProcId]) -> Vec<(ProcId, u32)> {
        let records = &self.records[..upto.min(self.records.len())];
        let mut ppid: HashMap<u32, u32> = HashMap::new();
        for (_, r) in records {
            match r {
                Record::Parents(links) => ppid.extend(links.iter().copied()),
                Record::Event { event: Event::Fork { child, parent_pid }, .. } => {
                    ppid.insert(child.id.pid, *parent_pid);
                }
                _ => {}
            }
        }
        let live: HashMap<u32, ProcId> = self.truth(upto).into_iter().map(|p| (p.id.pid, p.id)).collect();
        ids.iter()
            .filter(|id| live.get(&id.pid) == Some(id))
            .filter_map(|id| {
                let parent = *ppid.get(&id.pid)?;
                Some((*id, if live.contains_key(&parent) { parent } else { 1 }))
            })
            .collect()
    }

    /// The truth after the records up to index `upto` (exclusive): the last scan before it, with
    /// every event after that scan applied, delivered or not.
    pub fn truth(&self, upto: usize) -> Vec<ProcState> {
        let records = &self.records[..upto.min(self.records.len())];
        let from = records.iter().rposition(|(_, r)| matches!(r, Record::Scan(_)));
        let mut table = match from.map(|i| &records[i].1) {
            Some(Record::Scan(procs)) => ProcessTable::from_snapshot(procs.iter().copied(), Scope::account(self.uid)),
            _ => ProcessTable::new(Scope::account(self.uid)),
        };
        for (_, r) in &records[from.map_or(0, |i| i + 1)..] {
            if let Record::Event { event, .. } = r {
                table.apply(event);
            }
        }
        table.processes()
    }
}

/// Replays a [`Trace`] on tokio's clock: records become due at `start + t`.
pub struct TraceSource {
    trace: Arc<Trace>,
    start: tokio::time::Instant,
    /// Records handed out so far; shared with the scanner, which reads the truth up to it.
    cursor: Arc<Mutex<usize>>,
    lost: u64,
    /// Command lines as of the cursor, for the replay's process reader.
    cmdlines: Arc<Mutex<HashMap<u32, Vec<u8>>>>,
}

impl TraceSource {
    /// `cmdlines` is filled as `cmdline` records come due (pass the map a
    /// [`crate::daemon::recording::FakeProcs`] reads).
    pub fn new(trace: Trace, cmdlines: Arc<Mutex<HashMap<u32, Vec<u8>>>>) -> TraceSource {
        TraceSource {
            trace: Arc::new(trace),
            start: tokio::time::Instant::now(),
            cursor: Arc::new(Mutex::new(0)),
            lost: 0,
            cmdlines,
        }
    }

    fn cursor(&self) -> usize {
        *self.cursor.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn due(&self, i: usize) -> Option<tokio::time::Instant> {
        self.trace.records.get(i).map(|(t, _)| self.start + std::time::Duration::from_secs_f64(*t))
    }

    /// Advances over records due by now: command lines and scans take effect at once.
    fn advance_silent(&self) {
        let now = tokio::time::Instant::now();
        let mut cursor = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((_, r)) = self.trace.records.get(*cursor) {
            if self.due(*cursor).is_some_and(|at| at > now) {
                break;
            }
            match r {
                Record::Cmdline { pid, text } => {
                    self.cmdlines.lock().unwrap_or_else(|p| p.into_inner()).insert(*pid, text.clone());
                }
                Record::Scan(_) | Record::Parents(_) => {}
                Record::Event { .. } | Record::Lost(_) => break,
            }
            *cursor += 1;
        }
    }
}

impl EventSource for TraceSource {
    fn backend(&self) -> &'static str {
        "trace"
    }

    async fn wait(&mut self) -> io::Result<()> {
        match self.due(self.cursor()) {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
        Ok(())
    }

    fn drain(&mut self, max: usize, out: &mut Vec<Event>) -> usize {
        let now = tokio::time::Instant::now();
        let mut n = 0;
        loop {
            self.advance_silent();
            let i = self.cursor();
            let Some((_, r)) = self.trace.records.get(i) else { break };
            if n >= max || self.due(i).is_some_and(|at| at > now) {
                break;
            }
            match r {
                Record::Event { event, lost: false } => {
                    out.push(*event);
                    n += 1;
                }
                Record::Event { lost: true, .. } => self.lost = self.lost.saturating_add(1),
                Record::Lost(k) => self.lost = self.lost.saturating_add(*k),
                // Passed over by advance_silent.
                Record::Scan(_) | Record::Cmdline { .. } | Record::Parents(_) => {}
            }
            *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        }
        n
    }

    fn lost(&self) -> u64 {
        self.lost
    }

    fn scanner(&self) -> Scanner {
        let (trace, cursor) = (self.trace.clone(), self.cursor.clone());
        Arc::new(move || {
            let upto = *cursor.lock().unwrap_or_else(|p| p.into_inner());
            // A scan that starts before any record was handed out sees the first scan.
            let upto = if upto == 0 { 1 } else { upto };
            Ok(trace.truth(upto))
        })
    }

    fn parents(&self) -> crate::daemon::source::ParentReader {
        let (trace, cursor) = (self.trace.clone(), self.cursor.clone());
        Arc::new(move |ids| {
            let upto = *cursor.lock().unwrap_or_else(|p| p.into_inner());
            trace.parents(upto.max(1), ids)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Record;

    #[test]
    fn every_kind_of_record_round_trips_through_its_line() {
        let p = ProcState { id: ProcId { pid: 7, start_ticks: 70 }, euid: 1000, comm: Comm::new(b"a\xffb") };
        let trace = Trace {
            uid: 1000,
            note: "n".into(),
            records: vec![
                (0.0, Record::Scan(vec![p])),
                (0.5, Record::Event { event: Event::Fork { child: p, parent_pid: 1 }, lost: false }),
                (0.5, Record::Event { event: Event::State { kind: StateKind::Exec, state: p }, lost: true }),
                (0.75, Record::Cmdline { pid: 7, text: b"x \xfe y".to_vec() }),
                (1.0, Record::Lost(3)),
                (1.0, Record::Parents(vec![(7, 1), (8, 7)])),
                (1.0, Record::Event { event: Event::Exit(p.id), lost: false }),
            ],
        };
        let mut out = Vec::new();
        trace.write(&mut out).unwrap();
        let back = Trace::parse("t", io::BufReader::new(&out[..])).unwrap();
        assert_eq!(back, trace, "{}", String::from_utf8_lossy(&out));
    }

    #[test]
    fn a_trace_keeps_all_fifteen_bytes_of_a_name_and_refuses_a_longer_one() {
        let names = [&b"fifteen-bytes-a"[..], b"x) R 9 9\n\xff ( \n)"];
        for name in names {
            let p = ProcState { id: ProcId { pid: 7, start_ticks: 70 }, euid: 1000, comm: Comm::new(name) };
            let trace = Trace {
                uid: 1000,
                note: String::new(),
                records: vec![(
                    0.0,
                    Record::Event { event: Event::State { kind: StateKind::Rename, state: p }, lost: false },
                )],
            };
            let mut out = Vec::new();
            trace.write(&mut out).unwrap();
            assert_eq!(Trace::parse("t", io::BufReader::new(&out[..])).unwrap(), trace);
        }
        for comm in [r#""comm":"sixteen-bytes-ab""#, r#""comm":"a\u0000b""#, r#""comm_bytes":[97,0]"#] {
            let text = format!("{{\"guard_trace\":1,\"uid\":1000}}\n{{\"t\":0,\"ev\":\"rename\",\"pid\":7,\"start\":70,\"euid\":1000,{comm}}}\n");
            let err = Trace::parse("t", io::BufReader::new(text.as_bytes())).unwrap_err().to_string();
            assert!(err.starts_with("t line 2: a comm has more than 15 bytes or a NUL byte"), "{comm}: {err}");
        }
    }
}
