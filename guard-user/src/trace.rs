//! Recorded process traces: what `guard-user record` writes from a real kernel, and a
//! `TraceSource` that replays one through the whole daemon (pump, table, tick, effects) on
//! tokio's clock, so a paused runtime replays a day in milliseconds without root or a kernel.
//!
//! # Format (`guard-trace` version 1)
//! JSON lines. The first is the header `{"guard_trace":1,"uid":<account>,"note":"…"}`; every
//! other line is one record at `t` seconds from the start:
//! - `{"t":0,"scan":[<proc>…]}`: the whole table as /proc showed it then (the truth a rebuild
//!   reads);
//! - `{"t":0.1,"ev":"fork"|"exec"|"rename"|"setuid",<proc>,"parent":<pid>}` and
//!   `{"t":…,"ev":"exit","pid":…,"start":…}`: one event, delivered to the daemon — or, with
//!   `"lost":true`, one that happened but the ring could not deliver (it counts as lost and only a
//!   rebuild sees it);
//! - `{"t":…,"cmdline":"text","pid":…}`: a process's command line from then on;
//! - `{"t":…,"lost":N}`: N events the kernel could not deliver, whatever they were (a recording
//!   follows it with a fresh scan, which a replay's rebuild reads);
//! - `{"t":…,"parents":[[pid,ppid],…]}`: the parent pid of processes of the scan before it, as
//!   `/proc/PID/stat` showed it (the session lineage adopts a scanned process by its parent link;
//!   a process forked later has its parent in its fork record).
//!
//! A `<proc>` is `"pid":…,"start":<clock ticks>,"euid":…,"comm":"name"`; a name or command line
//! that is not UTF-8 is written as `"comm_bytes":[…]` / `"cmdline_bytes":[…]` instead.
//!
//! The binary only writes traces; reading one back and replaying it (`TraceSource`) is the
//! replay tests' (`replay`, compiled with the `testing` feature and in unit tests only).
use std::io::{self, Write};

use serde_json::{json, Map, Value};

use crate::event::{Event, ProcState};

#[cfg(any(test, feature = "testing"))]
mod replay;
#[cfg(any(test, feature = "testing"))]
pub use replay::{TraceError, TraceSource};

/// One record of a trace.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Scan(Vec<ProcState>),
    Event {
        event: Event,
        lost: bool,
    },
    Cmdline {
        pid: u32,
        text: Vec<u8>,
    },
    /// Events that were lost, unknown which: they count as lost (a rebuild follows).
    Lost(u64),
    /// `(pid, ppid)` of scanned processes.
    Parents(Vec<(u32, u32)>),
}

/// A parsed trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub uid: u32,
    pub note: String,
    /// (seconds from the start, record), in time order.
    pub records: Vec<(f64, Record)>,
}

fn put_bytes(m: &mut Map<String, Value>, key: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => m.insert(key.into(), json!(s)),
        Err(_) => m.insert(format!("{key}_bytes"), json!(bytes)),
    };
}

fn proc_json(p: &ProcState) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("pid".into(), json!(p.id.pid));
    m.insert("start".into(), json!(p.id.start_ticks));
    m.insert("euid".into(), json!(p.euid));
    put_bytes(&mut m, "comm", p.comm.as_bytes());
    m
}

impl Record {
    /// One line of the format (without its newline).
    pub fn to_line(&self, t: f64) -> String {
        let mut m = Map::new();
        m.insert("t".into(), json!((t * 1e6).round() / 1e6));
        match self {
            Record::Scan(procs) => {
                m.insert("scan".into(), Value::Array(procs.iter().map(|p| Value::Object(proc_json(p))).collect()));
            }
            Record::Event { event, lost } => {
                let (kind, state, parent) = match *event {
                    Event::Fork { child, parent_pid } => ("fork", Some(child), Some(parent_pid)),
                    Event::State { kind, state } => (kind.token(), Some(state), None),
                    Event::Exit(_) => ("exit", None, None),
                };
                m.insert("ev".into(), json!(kind));
                match state {
                    Some(s) => m.extend(proc_json(&s)),
                    None => {
                        m.insert("pid".into(), json!(event.id().pid));
                        m.insert("start".into(), json!(event.id().start_ticks));
                    }
                }
                if let Some(p) = parent {
                    m.insert("parent".into(), json!(p));
                }
                if *lost {
                    m.insert("lost".into(), json!(true));
                }
            }
            Record::Cmdline { pid, text } => {
                m.insert("pid".into(), json!(pid));
                put_bytes(&mut m, "cmdline", text);
            }
            Record::Lost(n) => {
                m.insert("lost".into(), json!(n));
            }
            Record::Parents(links) => {
                m.insert("parents".into(), json!(links.iter().map(|(p, pp)| [*p, *pp]).collect::<Vec<_>>()));
            }
        }
        Value::Object(m).to_string()
    }
}

impl Trace {
    pub fn write(&self, mut out: impl Write) -> io::Result<()> {
        writeln!(out, "{}", json!({"guard_trace": 1, "uid": self.uid, "note": self.note}))?;
        for (t, r) in &self.records {
            writeln!(out, "{}", r.to_line(*t))?;
        }
        Ok(())
    }
}

