//! The slots' lines, written by a thread of their own (`daemon::slots_io`): a log in a home
//! that stops answering must not stop a release.
use std::{
    sync::{
        mpsc::{self, Sender, SyncSender, TrySendError},
        Arc,
    },
    time::{Duration, Instant},
};

use super::effects::{Clock, LogSink, MirrorSink};
use crate::{log::Line, mirror::StreamEvent};

/// The lines' writer: never blocks its callers (a full queue drops the line and counts it).
#[derive(Clone)]
pub struct Lines {
    tx: SyncSender<ToWrite>,
}

enum ToWrite {
    Line(Line),
    /// Answered once every line queued before it is written.
    Flush(Sender<()>),
}

impl Lines {
    pub fn spawn(log: Arc<dyn LogSink>, mirror: Arc<dyn MirrorSink>, clock: Arc<dyn Clock>) -> Lines {
        let (tx, rx) = mpsc::sync_channel::<ToWrite>(256);
        std::thread::Builder::new()
            .name("guard-slot-log".into())
            .spawn(move || {
                for item in rx {
                    match item {
                        ToWrite::Line(line) => {
                            log.write(&line);
                            if let Some(ev) = StreamEvent::of(&line, clock.now_unix()) {
                                mirror.event(ev);
                            }
                        }
                        ToWrite::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .expect("spawn the slots' log writer");
        Lines { tx }
    }

    pub fn write(&self, line: Line) {
        if let Err(TrySendError::Full(ToWrite::Line(line))) = self.tx.try_send(ToWrite::Line(line)) {
            tracing::warn!("slot line dropped (the log writer is behind): {}", line.body());
        }
    }

    /// Waits (at most `within`) until every line queued so far is written: the daemon's last
    /// lines (`SLOT_START … reason=stop`) come before its `STOPPED`.
    pub fn flush(&self, within: Duration) {
        let end = Instant::now() + within;
        let (tx, rx) = mpsc::channel();
        let mut item = ToWrite::Flush(tx);
        loop {
            match self.tx.try_send(item) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < end => {
                    item = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let _ = rx.recv_timeout(end.saturating_duration_since(Instant::now()));
    }
}
