//! The guard's own vocabulary: what a tick holds, decides and reports, apart from where it is read
//! from or written to. `policy` works on these types and imports no output or IO module; the
//! status file (`crate::status`), the state file (`crate::state`), the enforcer, the metrics and
//! the mirror render from them or fill them in. `cargo xtask lint` keeps `policy` off those
//! modules.
pub mod history;
pub mod outcome;
pub mod status;

pub use history::{
    cap_repeats, FlagClocks, RepeatHistory, State, MAX_REPEAT_ENTRIES, MAX_REPEAT_NAMES, MAX_REPEAT_TOTAL,
};
pub use outcome::{Outcome, Refusal};
pub use status::{
    NameStatus, PeggedProcess, RepeatOffender, SessionCaps, SessionProcess, SessionStatus, SessionsStatus,
};
