//! Test-only faults, compiled into debug builds only (the test suites run debug binaries;
//! release builds — and so the package — have none of this): `GUARD_FAULT=hang_tick:N` makes
//! the N-th tick hang forever, `GUARD_FAULT=hang_pump:N` makes the pump hang on its N-th
//! snapshot request. The supervision tests use them to prove a hang ends in exit 70.
//! `GUARD_FAULT=holders_read:PID` makes `holders` hang reading process PID (its progress watch
//! must leave it behind and say so). `GUARD_FAULT=lose_forks:N` drops every N-th fork event
//! before the pump sees it and counts it lost, as the kernel does with what its ring buffer has
//! no room for (the sessions tests prove the lineage recovers every member from such a loss).

/// Whether `GUARD_FAULT` asks for `what` at occurrence `n`.
#[cfg(debug_assertions)]
fn wanted(what: &str, n: u64) -> bool {
    std::env::var("GUARD_FAULT").ok().and_then(|v| v.strip_prefix(what)?.strip_prefix(':')?.parse::<u64>().ok())
        == Some(n)
}

/// Blocks the calling thread forever when asked to.
#[cfg(debug_assertions)]
pub fn hang_if(what: &str, n: u64) {
    if wanted(what, n) {
        tracing::warn!("GUARD_FAULT: {what} at {n}: hanging on purpose");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hang_if(_what: &str, _n: u64) {}

/// The number `GUARD_FAULT=<what>:N` sets, in debug builds (`holders_budget:N` shrinks the
/// holders read budget, so the tests see a run that runs out of it).
#[cfg(debug_assertions)]
pub fn number(what: &str) -> Option<u64> {
    std::env::var("GUARD_FAULT").ok()?.strip_prefix(what)?.strip_prefix(':')?.parse().ok()
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn number(_what: &str) -> Option<u64> {
    None
}

/// `GUARD_FAULT=lose_forks:N` (see the module doc): drops every N-th fork event of `batch`;
/// returns how many it dropped.
#[cfg(debug_assertions)]
pub fn lose_forks(batch: &mut Vec<crate::event::Event>) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static FORKS: AtomicU64 = AtomicU64::new(0);
    let Some(n) = number("lose_forks").filter(|&n| n > 0) else { return 0 };
    let before = batch.len();
    batch.retain(|e| {
        !matches!(e, crate::event::Event::Fork { .. }) || !(FORKS.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(n)
    });
    (before - batch.len()) as u64
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn lose_forks(_batch: &mut Vec<crate::event::Event>) -> u64 {
    0
}
