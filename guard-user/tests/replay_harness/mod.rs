//! The replay harness shared by replay.rs and replay_foresight.rs: a trace through the whole
//! daemon on a paused tokio clock with recording effects.
// Each test file uses a part of it.
#![allow(dead_code)]
use std::{path::PathBuf, time::Duration};

use guard::{
    account::Account,
    daemon::{
        recording::{Recorder, RecordingNotifier},
        run_with, Backend, Control, DaemonOptions, Stopped,
    },
    trace::{Trace, TraceSource},
};

/// What a replay did.
pub struct Replayed {
    /// Log bodies with the `STARTED` pid blanked.
    pub log: Vec<String>,
    pub rec: Recorder,
    pub notes: Vec<String>,
    pub stopped: Stopped,
}

impl Replayed {
    pub fn signals(&self) -> Vec<(bool, Vec<u32>)> {
        self.rec.signals.calls.lock().unwrap().clone()
    }

    pub fn lines(&self, event: &str) -> Vec<&str> {
        self.log.iter().map(String::as_str).filter(|l| l.split(' ').next() == Some(event)).collect()
    }
}

pub struct Setup<'a> {
    pub fixture: &'a str,
    pub config: &'a str,
    pub run_for: Duration,
    pub interval: Duration,
    pub dry_run: bool,
    pub prepare: &'a dyn Fn(&Recorder),
    /// Control messages sent at these offsets.
    pub controls: Vec<(Duration, Control)>,
    /// The config file is rewritten at these offsets.
    pub config_changes: Vec<(Duration, &'static str)>,
    /// (offset, pid, name, group CPU ns): what the stall watch's sampler reports from then on.
    pub cpu: Vec<(Duration, u32, &'static str, u64)>,
    /// (offset, seconds): the wall clock is stepped by this much then (NTP, `date`).
    pub wall_steps: Vec<(Duration, f64)>,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            fixture: "",
            config: "{}",
            run_for: Duration::from_secs(290),
            interval: Duration::from_secs(60),
            dry_run: false,
            prepare: &|_| {},
            controls: Vec::new(),
            config_changes: Vec::new(),
            cpu: Vec::new(),
            wall_steps: Vec::new(),
        }
    }
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn replay(s: Setup) -> Replayed {
    let trace = Trace::open(&fixture(s.fixture)).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("guard-config.json"), s.config).unwrap();
    // A world-readable home: under root the config is read with the (fake) account's identity.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let account = Account { name: "replay".into(), uid: trace.uid, gid: trace.uid, home: home.path().into() };
    let opts = DaemonOptions {
        config_path: home.path().join("guard-config.json"),
        home: home.path().into(),
        account,
        dry_run: s.dry_run,
        interval: s.interval,
        backend: Backend::Auto,
        audit_interval: Duration::from_secs(600),
        ring_bytes: None,
        deadline_timer: true,
        metrics_file: None,
    };
    let rec = Recorder::default();
    (s.prepare)(&rec);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    let mut notifier = RecordingNotifier::default();
    let stopped = rt.block_on(async {
        let source = TraceSource::new(trace, rec.procs.0.clone());
        let fx = rec.effects(1_800_000_000.0);
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let config_path = home.path().join("guard-config.json");
        let changes = s.config_changes.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, text) in changes {
                tokio::time::sleep_until(start + at).await;
                std::fs::write(&config_path, text).unwrap();
            }
        });
        let (cpu_map, cpu) = (rec.cpu.0.clone(), s.cpu.clone());
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, pid, name, ns) in cpu {
                tokio::time::sleep_until(start + at).await;
                cpu_map.lock().unwrap().insert(pid, (guard::comm::Comm::new(name.as_bytes()), ns));
            }
        });
        let (step, steps) = (rec.wall_step.clone(), s.wall_steps.clone());
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, by) in steps {
                tokio::time::sleep_until(start + at).await;
                *step.lock().unwrap() += by;
            }
        });
        let mut controls = s.controls.clone();
        controls.push((s.run_for, Control::Stop));
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, c) in controls {
                tokio::time::sleep_until(start + at).await;
                let _ = tx.send(c).await;
            }
        });
        run_with(opts, source, fx, &mut notifier, &mut rx).await
    });
    let pid = format!(" pid={}", std::process::id());
    let log = rec
        .log
        .bodies()
        .into_iter()
        .map(|l| if l.starts_with("STARTED") { l.replace(&pid, " pid=P") } else { l })
        .collect();
    let notes = notifier.sent.lock().unwrap().clone();
    Replayed { log, rec, notes, stopped }
}

pub const PILE_CONFIG: &str = r#"{"threshold": 5, "timeout": "2m"}"#;
