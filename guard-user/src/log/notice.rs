//! The open-ended part of a `WARN` or `ERROR` line: what it is about ([`What`], one variant per
//! token docs/log.md documents, so a misspelt token does not compile), then its `key=value`
//! fields.
#[cfg(any(test, feature = "testing"))]
use super::line::Kind;

/// Declares [`What`] from one list, so its tokens, its lines and [`What::ALL`] cannot disagree
/// (a variant is in `ALL` because it is declared, not because someone remembered to list it).
macro_rules! whats {
    ($($(#[$doc:meta])* $variant:ident => $token:literal, $kind:ident;)*) => {
        /// What a `WARN` or `ERROR` line is about: the word after the event (docs/log.md).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum What {
            $($(#[$doc])* $variant,)*
        }

        impl What {
            /// Every token, in docs/log.md's order (the docs check walks it).
            pub const ALL: &'static [What] = &[$(What::$variant),*];

            /// The word written after `WARN ` or `ERROR `.
            pub fn token(self) -> &'static str {
                match self {
                    $(What::$variant => $token,)*
                }
            }

            /// The line that carries it: [`Kind::Warn`] or [`Kind::Error`].
            #[cfg(any(test, feature = "testing"))]
            pub fn kind(self) -> Kind {
                match self {
                    $(What::$variant => Kind::$kind,)*
                }
            }
        }
    };
}

whats! {
    /// A config file that is not there.
    ConfigMissing => "config_missing", Error;
    /// A config file the account cannot read, or that is not a regular file, or too large.
    ConfigUnreadable => "config_unreadable", Error;
    /// A config that is not JSON, or a key's value that cannot be used.
    ConfigMalformed => "config_malformed", Error;
    /// A state file that is not one (it is then an empty state).
    StateMalformed => "state_malformed", Error;
    /// A state file over one of its bounds (moved aside).
    StateRejected => "state_rejected", Error;
    /// The state file could not be written (tried again next tick).
    StateUnwritable => "state_unwritable", Error;
    BackendFallback => "backend_fallback", Warn;
    TaskIterFallback => "task_iter_fallback", Warn;
    SetuidUntracked => "setuid_untracked", Warn;
    TickOverrun => "tick_overrun", Warn;
    ConfigUnknownKey => "config_unknown_key", Warn;
    ConfigRepeatedKey => "config_repeated_key", Warn;
    ConfigUnknownKeysUnreported => "config_unknown_keys_unreported", Warn;
    PatternMatchesAll => "pattern_matches_all", Warn;
    PatternMatcherDown => "pattern_matcher_down", Warn;
    SessionsCap => "sessions_cap", Warn;
    CmdlineReadBudget => "cmdline_read_budget", Warn;
    SlotsUnavailable => "slots_unavailable", Warn;
    SlotNotHeld => "slot_not_held", Warn;
    SlotsCap => "slots_cap", Warn;
    SlotsLeftovers => "slots_leftovers", Warn;
    RedisUnreachable => "redis_unreachable", Warn;
    RedisRecovered => "redis_recovered", Warn;
    RedisEndpointInvalid => "redis_endpoint_invalid", Warn;
    RedisReplyRejected => "redis_reply_rejected", Warn;
    RedisListenerOwnedByAccount => "redis_listener_owned_by_account", Warn;
}

impl What {
    /// The token `text` starts with (`redis_unreachable endpoint=…` → [`What::RedisUnreachable`]):
    /// for a reason another part wrote whole.
    pub fn of_reason(text: &str) -> Option<What> {
        let word = text.split(' ').next().unwrap_or_default();
        What::ALL.iter().copied().find(|w| w.token() == word)
    }
}

/// The open-ended part of a `WARN` or `ERROR` line: what went wrong, then its `key=value` fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub what: What,
    /// An error's whole reason as it wrote it, written in place of the token: a config or state
    /// file error renders its own fields (`config_malformed threshold value=0 …`, its values
    /// escaped by the error), and starts with `what`'s token. Control characters in it are
    /// still escaped, so it can never break the line.
    pub reason: Option<String>,
    /// Escaped as values (docs/log.md). Bytes, because a path or a name need not be UTF-8.
    pub fields: Vec<(&'static str, Vec<u8>)>,
}

impl Notice {
    pub fn new(what: What) -> Notice {
        Notice { what, reason: None, fields: Vec::new() }
    }

    /// A notice whose text an error wrote whole (see [`Notice::reason`]); `reason` starts with
    /// `what`'s token, which the errors' tests check.
    pub fn reason(what: What, reason: String) -> Notice {
        debug_assert_eq!(What::of_reason(&reason), Some(what), "{reason}");
        Notice { what, reason: Some(reason), fields: Vec::new() }
    }

    /// Adds `key=value`.
    pub fn with(mut self, key: &'static str, value: impl FieldValue) -> Notice {
        self.fields.push((key, value.bytes()));
        self
    }

    /// The text after the event word, before the fields: the reason, or the token.
    pub fn head(&self) -> &str {
        self.reason.as_deref().unwrap_or(self.what.token())
    }
}

/// Anything a [`Notice`] field value can be made from.
pub trait FieldValue {
    fn bytes(&self) -> Vec<u8>;
}

macro_rules! display_value {
    ($($t:ty),*) => {$(impl FieldValue for $t { fn bytes(&self) -> Vec<u8> { self.to_string().into_bytes() } })*};
}
display_value!(u8, u32, u64, usize, i64, String);

impl FieldValue for &str {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl FieldValue for &[u8] {
    fn bytes(&self) -> Vec<u8> {
        self.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_is_one_word_of_its_own_and_found_again_from_a_reason() {
        let mut seen = std::collections::BTreeSet::new();
        for w in What::ALL {
            let t = w.token();
            assert!(!t.is_empty() && t.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{t}");
            assert!(seen.insert(t), "{t} twice");
            assert_eq!(What::of_reason(t), Some(*w));
            assert_eq!(What::of_reason(&format!("{t} path=/x")), Some(*w));
            assert!(matches!(w.kind(), Kind::Warn | Kind::Error));
        }
        assert_eq!(What::of_reason("config_malformedx"), None);
        assert_eq!(What::of_reason(""), None);
    }
}
