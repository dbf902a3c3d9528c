//! The Redis protocol (RESP2), as much of it as the mirror speaks: commands are arrays of bulk
//! strings (binary-safe, so a value the account controls is always one argument), replies are
//! the five RESP2 types. Five commands (SET, XADD, GET, SCAN, MGET, plus AUTH and SELECT at
//! connect) do not need a client library and its ~75 crates in a root daemon; the tests read
//! what we write back with the `redis` crate, an independent client.
//!
//! Replies are read with bounds (line length, bulk size, array length, nesting), so a server
//! that answers garbage or without end makes an error, not an allocation the size it asks for.
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _};

/// A status or error line, or a length line, longer than this is a protocol error.
const MAX_LINE: usize = 64 << 10;
/// One bulk string: a heartbeat is a few KiB; MGET of a fleet reads at most 500 of them at a time.
pub const MAX_BULK: usize = 16 << 20;
/// Elements of one array: SCAN pages of COUNT 1000 and MGET of 500 keys stay far below.
pub const MAX_ARRAY: usize = 100_000;
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

/// Reads one reply.
pub async fn read_reply<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Reply, RespError> {
    // Arrays are read with an explicit stack (no recursion in async code): each frame is an
    // array still missing elements.
    let mut stack: Vec<(usize, Vec<Reply>)> = Vec::new();
    loop {
        let mut value = match read_item(r).await? {
            Item::Value(v) => v,
            Item::Header(0) => Reply::Array(Vec::new()),
            Item::Header(len) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(RespError::Protocol(format!("replies nested deeper than {MAX_DEPTH}")));
                }
                stack.push((len, Vec::with_capacity(len.min(1024))));
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

/// What one line of the protocol starts: a whole value, or an array of so many elements.
enum Item {
    Value(Reply),
    Header(usize),
}

async fn read_item<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Item, RespError> {
    let line = read_line(r).await?;
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
            n if n < 0 || n as usize > MAX_BULK => {
                return Err(RespError::Protocol(format!("a bulk string of {n} bytes (at most {MAX_BULK})")))
            }
            n => {
                let mut buf = vec![0u8; n as usize + 2];
                r.read_exact(&mut buf).await?;
                if !buf.ends_with(b"\r\n") {
                    return Err(RespError::Protocol("a bulk string not ended by CRLF".into()));
                }
                buf.truncate(n as usize);
                Reply::Bulk(buf)
            }
        },
        b'*' => match number()? {
            -1 => Reply::Nil,
            n if n < 0 || n as usize > MAX_ARRAY => {
                return Err(RespError::Protocol(format!("an array of {n} elements (at most {MAX_ARRAY})")))
            }
            n => return Ok(Item::Header(n as usize)),
        },
        other => return Err(RespError::Protocol(format!("unknown reply type {:?}", *other as char))),
    }))
}

/// One CRLF-terminated line without its CRLF, at most [`MAX_LINE`] bytes.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Vec<u8>, RespError> {
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
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if line.len() > MAX_LINE + 2 {
            return Err(RespError::Protocol(format!("a line longer than {MAX_LINE} bytes")));
        }
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
            let long = [b"+".as_slice(), &vec![b'x'; MAX_LINE + 10], b"\r\n"].concat();
            assert!(matches!(parse(&long).await, Err(RespError::Protocol(_))));
        });
    }
}
