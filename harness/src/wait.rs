//! Waiting on a condition instead of sleeping for a guess: the condition is checked every 20 ms,
//! and a wait that runs out fails the test with what it waited for.
use std::time::{Duration, Instant};

/// How often a condition is checked.
const PERIOD: Duration = Duration::from_millis(20);

/// Checks `check` until it gives a value and returns that value; panics naming `what` when
/// `bound` passes first.
pub fn until<T>(bound: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + bound;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < end, "waited {bound:?} for {what}");
        std::thread::sleep(PERIOD);
    }
}

/// Checks `f` until it says done or `bound` passes, and returns its last value either way (for
/// a caller that asserts on that value with a message of its own).
pub fn poll<T>(bound: Duration, mut f: impl FnMut() -> (bool, T)) -> T {
    let end = Instant::now() + bound;
    loop {
        let (done, v) = f();
        if done || Instant::now() > end {
            return v;
        }
        std::thread::sleep(PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_returns_the_first_value_and_names_what_timed_out() {
        let mut n = 0;
        assert_eq!(
            until(Duration::from_secs(5), "three calls", || {
                n += 1;
                (n == 3).then_some(n)
            }),
            3
        );
        let e = std::panic::catch_unwind(|| until(Duration::from_millis(50), "nothing", || None::<()>)).unwrap_err();
        assert!(e.downcast_ref::<String>().unwrap().contains("for nothing"));
    }
}
