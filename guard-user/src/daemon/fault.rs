//! Test-only faults, compiled into debug builds only (the test suites run debug binaries;
//! release builds — and so the package — have none of this): `GUARD_FAULT=hang_tick:N` makes
//! the N-th tick hang forever, `GUARD_FAULT=hang_pump:N` makes the pump hang on its N-th
//! snapshot request. The supervision tests use them to prove a hang ends in exit 70.

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
