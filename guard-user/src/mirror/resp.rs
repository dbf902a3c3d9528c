//! The Redis protocol (RESP2), as much of it as the mirror speaks: commands are arrays of bulk
//! strings (binary-safe, so a value the account controls is always one argument), replies are
//! the five RESP2 types. Five commands (SET, XADD, GET, SCAN, MGET, plus AUTH and SELECT at
//! connect) do not need a client library and its ~75 crates in a root daemon; the tests read
//! what we write back with the `redis` crate, an independent client.
//!
//! A reply is read within one [`Budget`] of [`REPLY_BYTES`] for the whole of it, whatever its
//! shape: every byte it takes on the wire, and [`VALUE_BYTES`] for each value it holds, are
//! charged as they are read, and a bulk string or an array is charged what it announces
//! *before* anything is allocated for it. A reply that would go past the budget is
//! [`RespError::TooLarge`] (the caller closes the connection): a server that answers with
//! megabytes, in one piece or in a thousand, costs at most the budget, and an announced size is
//! never allocated. Nesting is bounded too ([`MAX_DEPTH`]).
//!
//! Why hand-written rather than a client library (issue 32's evaluation): the `redis` crate
//! (already the tests' independent client) has no bound of its own on a reply; its connection
//! buffers whatever arrives until a value parses, so holding it to a budget takes a reader that
//! cuts the socket's bytes off per reply, and even then the values it builds are not charged: the
//! 64,008 bytes of an array of 16,000 empty arrays cost its parser 964 KiB at peak (measured,
//! release build), 15 times the bytes, where this parser refuses that reply at its 1,800th value.
//! It would also bring 46 crates into a root daemon that has 65. `redis-protocol` (7 crates)
//! decodes a buffer the caller caps, but its frames are not charged either. The five reply types
//! take a hundred lines here, and `random_replies_read_back_within_their_budget…` below holds them
//! to the budget.
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _};

use crate::budget::Budget;

/// Everything one reply may cost: every reply the guard needs fits (SET and XADD answer a few
/// bytes; a heartbeat the guard writes is at most about 48 KiB; a SCAN page of 100 keys about
/// 20 KiB).
pub const REPLY_BYTES: usize = 64 << 10;
/// What each value of a reply is charged beyond its bytes on the wire: about what it costs in
/// memory, so a reply of many tiny values (`*0\r\n` is four bytes) is bounded too.
pub const VALUE_BYTES: usize = 32;
/// Nesting: SCAN's reply is two deep; nothing we send asks for more.
const MAX_DEPTH: usize = 4;

/// One command: its name and arguments, each a byte string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmd {
    args: Vec<Vec<u8>>,
}

/// Something that becomes one argument: text as its bytes, a number in decimal.
pub trait Arg {
    fn into_arg(self) -> Vec<u8>;
}

impl Arg for &str {
    fn into_arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl Arg for &String {
    fn into_arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl Arg for String {
    fn into_arg(self) -> Vec<u8> {
        self.into_bytes()
    }
}

macro_rules! decimal_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn into_arg(self) -> Vec<u8> {
                self.to_string().into_bytes()
            }
        }
    )*};
}
decimal_arg!(u32, u64, i64, usize);

impl Cmd {
    pub fn new(name: &str) -> Cmd {
        Cmd { args: vec![name.as_bytes().to_vec()] }
    }

    pub fn arg(&mut self, a: impl Arg) -> &mut Cmd {
        self.args.push(a.into_arg());
        self
    }

    /// The command name first, then the arguments.
    #[cfg(test)]
    pub fn args(&self) -> &[Vec<u8>] {
        &self.args
    }

    /// The command's name, for error messages.
    pub fn name(&self) -> &str {
        std::str::from_utf8(&self.args[0]).unwrap_or("?")
    }

    /// `*<n>\r\n` then `$<len>\r\n<bytes>\r\n` per argument.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("*{}\r\n", self.args.len()).as_bytes());
        for a in &self.args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `$-1` or `*-1`: no value (GET of a missing key, MGET of a non-string).
    Nil,
    Int(i64),
    /// `+OK`.
    Status(String),
    /// `-ERR …`: the server refused the command.
    Error(String),
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
}

#[derive(Debug, thiserror::Error)]
pub enum RespError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the server broke the protocol: {0}")]
    Protocol(String),
    /// The reply would cost more than [`REPLY_BYTES`]; `bytes`: what it had come to when it went
    /// past (what was read, plus what its last header announced).
    #[error("a reply of at least {bytes} bytes, over the {REPLY_BYTES} a reply may take")]
    TooLarge { bytes: usize },
}

impl Reply {
    /// The text of a bulk or status reply; `None` for nil. Anything else is unexpected.
    pub fn into_text(self) -> Result<Option<String>, RespError> {
        match self {
            Reply::Nil => Ok(None),
            Reply::Bulk(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            Reply::Status(s) => Ok(Some(s)),
            other => Err(unexpected("a string", &other)),
        }
    }

    pub fn into_array(self) -> Result<Vec<Reply>, RespError> {
        match self {
            Reply::Array(items) => Ok(items),
            other => Err(unexpected("an array", &other)),
        }
    }
}

fn unexpected(wanted: &str, got: &Reply) -> RespError {
    let kind = match got {
        Reply::Nil => "nil",
        Reply::Int(_) => "an integer",
        Reply::Status(_) => "a status",
        Reply::Error(_) => "an error",
        Reply::Bulk(_) => "a bulk string",
        Reply::Array(_) => "an array",
    };
    RespError::Protocol(format!("expected {wanted}, got {kind}"))
}

/// Reads one reply within [`REPLY_BYTES`].
pub async fn read_reply<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Reply, RespError> {
    read_reply_within(r, REPLY_BYTES).await
}

/// Reads one reply within `limit` bytes (see the module doc).
pub async fn read_reply_within<R: AsyncBufRead + Unpin>(r: &mut R, limit: usize) -> Result<Reply, RespError> {
    let mut budget = Charged { budget: Budget::bytes(limit), limit };
    // Arrays are read with an explicit stack (no recursion in async code): each frame is an
    // array still missing elements.
    let mut stack: Vec<(usize, Vec<Reply>)> = Vec::new();
    loop {
        let mut value = match read_item(r, &mut budget).await? {
            Item::Value(v) => v,
            Item::Header(0) => Reply::Array(Vec::new()),
            Item::Header(len) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(RespError::Protocol(format!("replies nested deeper than {MAX_DEPTH}")));
                }
                // Charged already (`read_item`), so the room can be taken as it fills.
                stack.push((len, Vec::new()));
                continue;
            }
        };
        // Complete every frame this value finishes.
        loop {
            let Some((len, items)) = stack.last_mut() else { return Ok(value) };
            items.push(value);
            if items.len() < *len {
                break;
            }
            let (_, items) = stack.pop().expect("a frame");
            value = Reply::Array(items);
        }
    }
}

/// One reply's budget, and what to say when it runs out.
struct Charged {
    budget: Budget,
    limit: usize,
}

impl Charged {
    fn charge(&mut self, n: usize) -> Result<(), RespError> {
        let used = self.limit - self.budget.left();
        self.budget.charge(n).map_err(|_| RespError::TooLarge { bytes: used.saturating_add(n) })
    }

    fn left(&self) -> usize {
        self.budget.left()
    }
}

/// What one line of the protocol starts: a whole value, or an array of so many elements.
enum Item {
    Value(Reply),
    Header(usize),
}

async fn read_item<R: AsyncBufRead + Unpin>(r: &mut R, budget: &mut Charged) -> Result<Item, RespError> {
    let line = read_line(r, budget).await?;
    budget.charge(VALUE_BYTES)?;
    let (kind, rest) = line.split_first().ok_or_else(|| RespError::Protocol("an empty line".into()))?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    let number = || -> Result<i64, RespError> {
        std::str::from_utf8(rest)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| RespError::Protocol(format!("not a number: {:?}", text())))
    };
    Ok(Item::Value(match kind {
        b'+' => Reply::Status(text()),
        b'-' => Reply::Error(text()),
        b':' => Reply::Int(number()?),
        b'$' => match number()? {
            -1 => Reply::Nil,
            n if n < 0 => return Err(RespError::Protocol(format!("a bulk string of {n} bytes"))),
            n => {
                // The announced size, charged before anything is allocated for it.
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                budget.charge(n.saturating_add(2))?;
                let mut buf = vec![0u8; n + 2];
                r.read_exact(&mut buf).await?;
                if !buf.ends_with(b"\r\n") {
                    return Err(RespError::Protocol("a bulk string not ended by CRLF".into()));
                }
                buf.truncate(n);
                Reply::Bulk(buf)
            }
        },
        b'*' => match number()? {
            -1 => Reply::Nil,
            n if n < 0 => return Err(RespError::Protocol(format!("an array of {n} elements"))),
            n => {
                // Each element takes at least a 3-byte line and its value's share: an array
                // that announces more than the budget can hold is refused at its header.
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let least = n.saturating_mul(3 + VALUE_BYTES);
                if least > budget.left() {
                    budget.charge(least)?;
                }
                return Ok(Item::Header(n));
            }
        },
        other => return Err(RespError::Protocol(format!("unknown reply type {:?}", *other as char))),
    }))
}

/// One CRLF-terminated line without its CRLF, its bytes charged as they arrive.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, budget: &mut Charged) -> Result<Vec<u8>, RespError> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Err(RespError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        budget.charge(take)?;
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            break;
        }
    }
    if !line.ends_with(b"\r\n") {
        return Err(RespError::Protocol("a line not ended by CRLF".into()));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> Result<Reply, RespError> {
        let mut r = tokio::io::BufReader::new(bytes);
        read_reply(&mut r).await
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn a_command_is_an_array_of_binary_safe_bulk_strings() {
        let mut cmd = Cmd::new("XADD");
        cmd.arg("k").arg("a b\r\n*3\r\n").arg(7u64);
        let mut out = Vec::new();
        cmd.encode(&mut out);
        assert_eq!(out, b"*4\r\n$4\r\nXADD\r\n$1\r\nk\r\n$9\r\na b\r\n*3\r\n\r\n$1\r\n7\r\n");
    }

    #[test]
    fn every_reply_type_is_read() {
        block_on(async {
            assert_eq!(parse(b"+OK\r\n").await.unwrap(), Reply::Status("OK".into()));
            assert_eq!(parse(b"-ERR no\r\n").await.unwrap(), Reply::Error("ERR no".into()));
            assert_eq!(parse(b":-12\r\n").await.unwrap(), Reply::Int(-12));
            assert_eq!(parse(b"$-1\r\n").await.unwrap(), Reply::Nil);
            assert_eq!(parse(b"$4\r\na\r\nb\r\n").await.unwrap(), Reply::Bulk(b"a\r\nb".to_vec()));
            assert_eq!(parse(b"*0\r\n").await.unwrap(), Reply::Array(vec![]));
            // SCAN's shape: a cursor and a page of keys.
            let scan = parse(b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\na\r\n$-1\r\n").await.unwrap();
            assert_eq!(
                scan,
                Reply::Array(vec![
                    Reply::Bulk(b"0".to_vec()),
                    Reply::Array(vec![Reply::Bulk(b"a".to_vec()), Reply::Nil])
                ])
            );
        });
    }

    #[test]
    fn a_server_that_breaks_the_protocol_or_its_bounds_is_an_error_not_an_allocation() {
        block_on(async {
            for bad in [
                &b"$99999999999\r\n"[..],
                b"*99999999999\r\n",
                b"$3\r\nabcXY",
                b"?what\r\n",
                b":12x\r\n",
                b"+OK\n",
                b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
                b"$10\r\nshort",
                b"",
            ] {
                assert!(parse(bad).await.is_err(), "{:?}", String::from_utf8_lossy(bad));
            }
            let long = [b"+".as_slice(), &vec![b'x'; REPLY_BYTES + 10], b"\r\n"].concat();
            assert!(matches!(parse(&long).await, Err(RespError::TooLarge { .. })));
        });
    }

    /// What a listener on the endpoint can answer: one reply past the budget, in any shape,
    /// is refused before it costs more than the budget (issue 32: five bulk strings of 16 MiB,
    /// each under the old per-piece cap, made 80 MiB).
    #[test]
    fn a_reply_over_its_budget_is_refused_whatever_its_shape() {
        block_on(async {
            let bulk = |n: usize| [format!("${n}\r\n").into_bytes(), vec![b'x'; n], b"\r\n".to_vec()].concat();
            let five_huge: Vec<u8> = [b"*5\r\n".to_vec(), format!("${}\r\n", (16 << 20) - 1).into_bytes()].concat();
            let many_small = [b"*100\r\n".to_vec(), bulk(1024).repeat(100)].concat();
            let many_ints = [b"*20000\r\n".to_vec(), b":1\r\n".repeat(20_000)].concat();
            let nested = [b"*2\r\n".to_vec(), b"*2000\r\n".to_vec(), b"*0\r\n".repeat(2000)].concat();
            for (what, bytes) in [
                ("five 16 MiB bulk strings", five_huge),
                ("a hundred 1 KiB ones", many_small),
                ("20,000 integers", many_ints),
                ("2,000 empty arrays", nested),
                ("an array of 2^31 elements", b"*2147483647\r\n".to_vec()),
                ("one bulk of 64 KiB", bulk(REPLY_BYTES)),
            ] {
                let mut r = &bytes[..];
                match read_reply(&mut r).await {
                    Err(RespError::TooLarge { bytes }) => assert!(bytes > REPLY_BYTES, "{what}: {bytes}"),
                    other => panic!("{what}: {other:?}"),
                }
                assert!(bytes.len() - r.len() <= REPLY_BYTES, "{what}: read {} bytes", bytes.len() - r.len());
            }
            // A reply the guard needs, a heartbeat's size, is read whole.
            let beat = bulk(48 << 10);
            assert_eq!(parse(&beat).await.unwrap(), Reply::Bulk(vec![b'x'; 48 << 10]));
        });
    }

    use guard_test::rng::Rng;

    fn gen_reply(rng: &mut Rng, depth: usize) -> Reply {
        let text = |rng: &mut Rng| (0..rng.below(20)).map(|_| b'a' + rng.below(26) as u8).collect::<Vec<u8>>();
        match rng.below(if depth >= MAX_DEPTH { 5 } else { 6 }) {
            0 => Reply::Nil,
            1 => Reply::Int(rng.next_u64() as i64),
            2 => Reply::Status(String::from_utf8(text(rng)).unwrap()),
            3 => Reply::Error(String::from_utf8(text(rng)).unwrap()),
            4 => {
                let n = rng.below(300);
                Reply::Bulk((0..n).map(|_| rng.byte()).collect())
            }
            _ => Reply::Array((0..rng.below(12)).map(|_| gen_reply(rng, depth + 1)).collect()),
        }
    }

    fn encode(r: &Reply, out: &mut Vec<u8>) {
        match r {
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Reply::Status(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Reply::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    encode(i, out);
                }
            }
        }
    }

    /// Bytes on the wire plus [`VALUE_BYTES`] per value: what a reply is charged.
    fn cost(r: &Reply) -> usize {
        let mut wire = Vec::new();
        encode(r, &mut wire);
        let values = |r: &Reply| -> usize {
            fn count(r: &Reply) -> usize {
                match r {
                    Reply::Array(items) => 1 + items.iter().map(count).sum::<usize>(),
                    _ => 1,
                }
            }
            count(r)
        };
        wire.len() + VALUE_BYTES * values(r)
    }

    /// The parser against random replies and random damage to them (a property test with a
    /// bounded generator): a reply within its budget reads back exactly; one over it is
    /// `TooLarge`; damaged bytes give an error or some reply, never a panic; and whatever the
    /// input, the parser never takes more bytes from the socket than the budget.
    #[test]
    fn random_replies_read_back_within_their_budget_and_damage_never_costs_more() {
        block_on(async {
            let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
            for case in 0..4000 {
                let reply = gen_reply(&mut rng, 0);
                let mut wire = Vec::new();
                encode(&reply, &mut wire);
                let limit = [64, 512, 4096, REPLY_BYTES][case % 4];
                let mut r = &wire[..];
                let got = read_reply_within(&mut r, limit).await;
                let consumed = wire.len() - r.len();
                assert!(consumed <= limit, "case {case}: read {consumed} of a {limit} budget");
                // A header that announces more than is left is refused before the bytes
                // arrive, so within budget means exactly that.
                match got {
                    Ok(got) => {
                        assert_eq!(got, reply, "case {case}");
                        assert!(cost(&reply) <= limit, "case {case}: {} over {limit}", cost(&reply));
                    }
                    Err(RespError::TooLarge { .. }) => assert!(cost(&reply) > limit, "case {case}"),
                    Err(e) => panic!("case {case}: a valid reply failed: {e}"),
                }
                // Damage: cut it, flip bytes, splice random bytes in.
                let mut bad = wire.clone();
                match rng.below(3) {
                    0 => bad.truncate(rng.below(bad.len() + 1)),
                    1 => {
                        for _ in 0..=rng.below(4) {
                            let i = rng.below(bad.len().max(1));
                            bad[i] = rng.byte();
                        }
                    }
                    _ => {
                        let at = rng.below(bad.len() + 1);
                        let junk: Vec<u8> =
                            (0..rng.below(40)).map(|_| b"*$:+-\r\n0123456789"[rng.below(17)]).collect();
                        bad.splice(at..at, junk);
                    }
                }
                let mut r = &bad[..];
                let _ = read_reply_within(&mut r, limit).await;
                assert!(bad.len() - r.len() <= limit, "case {case}: damaged input read past the budget");
            }
        });
    }
}
