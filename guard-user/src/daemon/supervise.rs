//! The tick loop and its supervision (docs/operations.md): when ticks run, the deadline every tick has,
//! what happens to a tick that does not settle, the watchdog, SIGHUP, and stopping.
//!
//! A tick runs on a blocking thread; this loop only waits for it, never inside it, so it keeps
//! answering signals and the watchdog whatever a tick is doing. A tick past its deadline logs
//! `WARN tick_overrun` once, and the ticks that fall due meanwhile are skipped; a tick still
//! unsettled 9 deadlines after that warning (10× its deadline while this loop was awake), or a pump that does not answer within a deadline, ends the
//! daemon with `STOPPED reason=hang` (exit 70) so systemd restarts it. The stuck thread is
//! abandoned, never joined.
use std::time::Duration;

use tokio::{sync::mpsc, task::JoinHandle, time::Instant};

use super::{
    effects::LogSink,
    pump::PumpHandle,
    tick::{TickReport, Ticker},
};
use crate::log::{Line, Notice, What};
use std::sync::Arc;

/// What the operator (or a test) tells the running daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// SIGTERM/SIGINT.
    Stop,
    /// SIGHUP: reopen the log, re-read the config, tick now.
    Reload,
}

/// Why the daemon stopped: `STOPPED reason=…` and the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    Signal,
    Hang,
    Error,
}

impl Stopped {
    /// The `STOPPED` line's reason.
    pub fn reason(self) -> crate::log::line::StopReason {
        use crate::log::line::StopReason;
        match self {
            Stopped::Signal => StopReason::Signal,
            Stopped::Hang => StopReason::Hang,
            Stopped::Error => StopReason::Error,
        }
    }

    /// The process's exit status: 0 on a signal, 70 (EX_SOFTWARE) on a hang so systemd restarts it.
    pub fn exit_code(self) -> u8 {
        match self {
            Stopped::Signal => 0,
            Stopped::Hang => 70,
            Stopped::Error => 2,
        }
    }
}

/// The service manager's side of supervision (sd_notify(3)); a no-op outside systemd.
pub trait Notifier: Send {
    fn ready(&mut self);
    fn reloading(&mut self);
    fn stopping(&mut self);
    fn watchdog(&mut self);
    fn status(&mut self, text: &str);
    /// `WATCHDOG_USEC` halved: how often to ping; `None` without a watchdog.
    fn watchdog_period(&self) -> Option<Duration>;
}

/// `NOTIFY_SOCKET` through the `sd-notify` crate.
pub struct SystemdNotifier {
    period: Option<Duration>,
}

impl SystemdNotifier {
    pub fn from_env() -> SystemdNotifier {
        SystemdNotifier { period: sd_notify::watchdog_enabled().map(|d| d / 2) }
    }

    fn send(states: &[sd_notify::NotifyState]) {
        if let Err(e) = sd_notify::notify(states) {
            tracing::debug!("sd_notify: {e}");
        }
    }
}

impl Notifier for SystemdNotifier {
    fn ready(&mut self) {
        Self::send(&[sd_notify::NotifyState::Ready]);
    }

    fn reloading(&mut self) {
        match sd_notify::NotifyState::monotonic_usec_now() {
            Ok(now) => Self::send(&[sd_notify::NotifyState::Reloading, now]),
            Err(_) => Self::send(&[sd_notify::NotifyState::Reloading]),
        }
    }

    fn stopping(&mut self) {
        Self::send(&[sd_notify::NotifyState::Stopping]);
    }

    fn watchdog(&mut self) {
        Self::send(&[sd_notify::NotifyState::Watchdog]);
    }

    fn status(&mut self, text: &str) {
        Self::send(&[sd_notify::NotifyState::Status(text)]);
    }

    fn watchdog_period(&self) -> Option<Duration> {
        self.period
    }
}

/// How long a stop waits for a running tick (docs/operations.md: the daemon ends within 3 s).
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// A tick unsettled this many deadlines is a hang.
pub const HANG_FACTOR: u32 = 10;

/// Ticks the pump asks for (a root session ended) start at least this long after the previous
/// tick started: roots ending by the thousand cannot keep the loop ticking back to back.
pub const WAKE_SPACING: Duration = Duration::from_secs(1);

/// How the loop was set up.
pub struct LoopSettings {
    pub interval: Duration,
    pub deadline: Duration,
}

struct Running {
    handle: JoinHandle<(Ticker, TickReport)>,
    began: Instant,
    /// When the overrun was seen and warned about. The hang bound counts from there: a process
    /// that was stopped (SIGSTOP, a frozen cgroup) wakes to find its tick past the deadline, and
    /// that tick gets the rest of the bound from the moment the watch could see it, not none.
    warned: Option<Instant>,
}

/// Runs ticks until told to stop; returns why it stopped. `now_mono` is the clock the ticks'
/// deadlines are on (the monotonic one, see `policy::time`).
pub async fn tick_loop(
    ticker: Ticker,
    settings: LoopSettings,
    pump: PumpHandle,
    log: Arc<dyn LogSink>,
    notifier: &mut dyn Notifier,
    control: &mut mpsc::Receiver<Control>,
    now_mono: impl Fn() -> f64,
) -> Stopped {
    let deadline = settings.deadline;
    let mut interval = tokio::time::interval(settings.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let has_watchdog = notifier.watchdog_period().is_some();
    let watchdog_every = notifier.watchdog_period().unwrap_or(deadline).min(deadline).max(Duration::from_millis(100));
    let mut watchdog = tokio::time::interval(watchdog_every);
    watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut idle: Option<Ticker> = None;
    let mut enforce_at: Option<Instant> = None;
    let mut ready_sent = false;
    let (pong_tx, mut pongs) = mpsc::channel::<bool>(2);
    let mut ping_outstanding = false;
    let mut reloading = false;
    let mut last_began = Instant::now();
    // A wake that came while a tick ran: that tick may have missed it, so another follows.
    let mut wake_after = false;
    let spawn = |t: Ticker| Running {
        handle: tokio::task::spawn_blocking(move || {
            let mut t = t;
            let r = t.tick();
            (t, r)
        }),
        began: Instant::now(),
        warned: None,
    };
    // The first tick runs once the start-up table is complete, and its deadline starts then.
    tokio::select! {
        ok = pump.ready() => if !ok {
            tracing::error!("the event pump ended before the start-up table was complete");
            return Stopped::Error;
        },
        c = control.recv() => if c != Some(Control::Reload) {
            notifier.stopping();
            return Stopped::Signal;
        },
    }
    let mut running = Some(spawn(ticker));
    loop {
        let enforce_sleep = async {
            match enforce_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let overrun_at = running.as_ref().map(|r| match r.warned {
            Some(at) => at.max(r.began + deadline) + deadline * (HANG_FACTOR - 1),
            None => r.began + deadline,
        });
        let overrun = async {
            match overrun_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let finished = async {
            match running.as_mut() {
                Some(r) => (&mut r.handle).await,
                None => std::future::pending().await,
            }
        };
        let mut want_tick = false;
        // Biased, in this order: a stop or reload is never starved, and a finished tick is
        // taken in before the next one is considered (replays are deterministic).
        tokio::select! {
            biased;
            c = control.recv() => match c {
                Some(Control::Reload) => {
                    log.write(&Line::Reload);
                    notifier.reloading();
                    log.reopen();
                    reloading = true;
                    want_tick = true;
                }
                Some(Control::Stop) | None => {
                    notifier.stopping();
                    // Let a running tick finish (it may be between SIGTERM and SIGKILL), but
                    // never past the 3 s an operator is promised.
                    if let Some(r) = running.take() {
                        let _ = tokio::time::timeout(STOP_GRACE, r.handle).await;
                    }
                    return Stopped::Signal;
                }
            },
            done = finished => {
                let r = running.take().expect("a tick was running");
                match done {
                    Ok((t, report)) => {
                        idle = Some(t);
                        if !ready_sent {
                            // Start-up is over: what only it needed leaves the process
                            // (reading /proc/self/smaps walks page tables: off the loop).
                            tokio::task::spawn_blocking(|| {
                                super::trim::startup_pages();
                                super::trim::heap();
                            });
                        }
                        if !ready_sent || reloading {
                            notifier.ready();
                            ready_sent = true;
                            reloading = false;
                        }
                        if r.warned.is_some() {
                            tracing::info!("the overrunning tick settled after {:.1} s", r.began.elapsed().as_secs_f64());
                        }
                        enforce_at = report.next_deadline.map(|at| {
                            // A hair after the deadline, so that tick sees `elapsed >= timeout`.
                            let wait = (at - now_mono()).clamp(0.0, 366.0 * 86_400.0);
                            Instant::now() + Duration::from_secs_f64(wait) + Duration::from_millis(5)
                        });
                        if std::mem::take(&mut wake_after) {
                            let at = Instant::now().max(last_began + WAKE_SPACING);
                            enforce_at = Some(enforce_at.map_or(at, |e| e.min(at)));
                        }
                        notifier.status(&format!(
                            "tracking {} processes, {} name{} flagged, last tick at {}",
                            report.tracked,
                            report.flagged,
                            if report.flagged == 1 { "" } else { "s" },
                            crate::log::local_timestamp(std::time::SystemTime::now()),
                        ));
                    }
                    Err(e) => {
                        tracing::error!("a tick panicked: {e}");
                        return Stopped::Error;
                    }
                }
            }
            () = overrun => {
                let r = running.as_mut().expect("a tick is running");
                if r.warned.is_none() {
                    r.warned = Some(Instant::now());
                    log.write(
                        &Line::Warn(
                            Notice::new(What::TickOverrun)
                                .with("elapsed", format!("{}s", r.began.elapsed().as_secs()))
                                .with("deadline", format!("{}s", deadline.as_secs_f64())),
                        ),
                    );
                } else {
                    return Stopped::Hang;
                }
            }
            _ = interval.tick() => want_tick = true,
            () = enforce_sleep => {
                enforce_at = None;
                want_tick = true;
            }
            // A root session ended: a tick soon, so its grace counts from the exit.
            () = pump.woken() => {
                if running.is_some() {
                    wake_after = true;
                } else {
                    let at = Instant::now().max(last_began + WAKE_SPACING);
                    enforce_at = Some(enforce_at.map_or(at, |e| e.min(at)));
                }
            }
            _ = watchdog.tick() => {
                // Ask the pump without waiting here: the answer comes back on `pongs`. A pump
                // that leaves a ping unanswered for the hang bound has stopped draining.
                if !ping_outstanding {
                    ping_outstanding = true;
                    let (pump, tx) = (pump.clone(), pong_tx.clone());
                    tokio::spawn(async move {
                        let _ = tx.send(pump.ping(deadline * HANG_FACTOR).await.is_some()).await;
                    });
                }
            }
            Some(answered) = pongs.recv() => {
                ping_outstanding = false;
                if !answered {
                    tracing::error!("the event pump did not answer within {:?}", deadline * HANG_FACTOR);
                    return Stopped::Hang;
                }
                // WATCHDOG=1 only while both make progress: the pump answered, and no tick is past
                // its deadline.
                let tick_ok = running.as_ref().is_none_or(|r| r.began.elapsed() <= deadline);
                if tick_ok && ready_sent && has_watchdog {
                    notifier.watchdog();
                }
            }
        }
        if want_tick && running.is_none() {
            if let Some(t) = idle.take() {
                last_began = Instant::now();
                running = Some(spawn(t));
            }
        }
    }
}
