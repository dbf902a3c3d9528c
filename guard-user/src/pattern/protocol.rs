//! The frames the matcher (parent) and its worker (child) exchange over the worker's
//! stdin/stdout: a little-endian `u32` length, then that many bytes, the first of which is a
//! tag. Requests go down, responses come up, in order: one `Answer` per `Text`, one
//! `Compiled`/`CompileFailed` per `Compile`. (What the worker is doing *right now* travels the
//! other channel, the shared `page`.)
//!
//! Everything the worker writes is untrusted by the parent (the worker parses hostile input with
//! a C engine): indices are bounds-checked and malformed frames end the worker.

/// No index (no match, no pattern out of memory).
pub(crate) const NONE: u32 = u32::MAX;

const TAG_INIT: u8 = 1;
const TAG_COMPILE: u8 = 2;
const TAG_TEXT: u8 = 3;
const TAG_SKIP: u8 = 4;
const TAG_PROBE: u8 = 5;
const TAG_READY: u8 = 11;
const TAG_SETUP_FAILED: u8 = 12;
const TAG_COMPILED: u8 = 13;
const TAG_COMPILE_FAILED: u8 = 14;
const TAG_ANSWER: u8 = 15;
const TAG_PROBE_RESULT: u8 = 16;

/// Largest frame before `Init` set the real limit (Init itself is a few dozen bytes).
pub(crate) const INIT_MAX_FRAME: usize = 4096;

/// How the worker hardens itself; sent first, before anything from the account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Init {
    pub memory_bytes: u64,
    pub stack_bytes: u64,
    pub cpu_seconds: u64,
    /// Largest frame the worker accepts from now on.
    pub max_frame: u64,
    pub run_as: Option<(u32, u32)>,
    pub seccomp: bool,
}

/// Parent → worker.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    Init(Init),
    /// Replace the compiled set by these patterns, in order.
    Compile(Vec<&'a str>),
    /// Which pattern, from `start` on, matches `text` first. `seq` comes back in the answer and
    /// in the progress page.
    Text {
        seq: u32,
        start: u32,
        text: &'a [u8],
    },
    /// Do not run these patterns on later texts (they could not decide this round); replaces
    /// the previous skip set.
    Skip(Vec<u32>),
    /// Try to open `path` (the sandbox self-test: a sandboxed worker is stopped by seccomp).
    Probe(&'a [u8]),
}

/// Why compiling stopped, in `CompileFailed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompileFailure {
    Invalid = 0,
    OutOfMemory = 1,
    Nul = 2,
}

/// What the worker set up, in `Ready`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ready {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub identity_dropped: bool,
    pub seccomp: bool,
    pub oom_score_adj: bool,
}

/// Worker → parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Response {
    Ready(Ready),
    SetupFailed(String),
    Compiled {
        count: u32,
    },
    CompileFailed {
        index: u32,
        failure: CompileFailure,
        reason: String,
    },
    /// `matched`: the first matching pattern from `start` (or `NONE`); `skipped`: a skipped
    /// pattern was passed over before it; `out_of_memory`: the pattern that could not decide for
    /// lack of memory (or `NONE`). The worker stops at such a pattern and answers at once, so
    /// the parent hears of every failure on a text as it happens and resumes after it.
    Answer {
        seq: u32,
        matched: u32,
        skipped: bool,
        out_of_memory: u32,
    },
    /// 0 when the file opened, else the errno.
    ProbeResult {
        errno: i32,
    },
}

/// A frame that does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed frame: {0}")]
pub(crate) struct ProtocolError(pub &'static str);

/// Appends one frame holding `payload` parts to `out`.
fn frame(out: &mut Vec<u8>, tag: u8, parts: &[&[u8]]) {
    let len: usize = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
    out.extend_from_slice(&u32::try_from(len).expect("frames are bounded far below 4 GiB").to_le_bytes());
    out.push(tag);
    for p in parts {
        out.extend_from_slice(p);
    }
}

pub(crate) fn encode_request(req: &Request<'_>, out: &mut Vec<u8>) {
    match req {
        Request::Init(i) => {
            let (uid, gid, drop) = match i.run_as {
                Some((u, g)) => (u, g, 1u8),
                None => (0, 0, 0),
            };
            frame(
                out,
                TAG_INIT,
                &[
                    &i.memory_bytes.to_le_bytes(),
                    &i.stack_bytes.to_le_bytes(),
                    &i.cpu_seconds.to_le_bytes(),
                    &i.max_frame.to_le_bytes(),
                    &uid.to_le_bytes(),
                    &gid.to_le_bytes(),
                    &[drop, u8::from(i.seccomp)],
                ],
            );
        }
        Request::Compile(list) => {
            let mut body = (list.len() as u32).to_le_bytes().to_vec();
            for p in list {
                body.extend_from_slice(&(p.len() as u32).to_le_bytes());
                body.extend_from_slice(p.as_bytes());
            }
            frame(out, TAG_COMPILE, &[&body]);
        }
        Request::Text { seq, start, text } => frame(out, TAG_TEXT, &[&seq.to_le_bytes(), &start.to_le_bytes(), text]),
        Request::Skip(list) => {
            let body: Vec<u8> = list.iter().flat_map(|j| j.to_le_bytes()).collect();
            frame(out, TAG_SKIP, &[&(list.len() as u32).to_le_bytes(), &body]);
        }
        Request::Probe(path) => frame(out, TAG_PROBE, &[path]),
    }
}

pub(crate) fn encode_response(resp: &Response, out: &mut Vec<u8>) {
    match resp {
        Response::Ready(r) => {
            let flags = u32::from(r.identity_dropped) | u32::from(r.seccomp) << 1 | u32::from(r.oom_score_adj) << 2;
            frame(
                out,
                TAG_READY,
                &[&r.pid.to_le_bytes(), &r.uid.to_le_bytes(), &r.gid.to_le_bytes(), &flags.to_le_bytes()],
            );
        }
        Response::SetupFailed(msg) => frame(out, TAG_SETUP_FAILED, &[msg.as_bytes()]),
        Response::Compiled { count } => frame(out, TAG_COMPILED, &[&count.to_le_bytes()]),
        Response::CompileFailed { index, failure, reason } => {
            frame(out, TAG_COMPILE_FAILED, &[&index.to_le_bytes(), &[*failure as u8], reason.as_bytes()])
        }
        Response::Answer { seq, matched, skipped, out_of_memory } => frame(
            out,
            TAG_ANSWER,
            &[&seq.to_le_bytes(), &matched.to_le_bytes(), &[u8::from(*skipped)], &out_of_memory.to_le_bytes()],
        ),
        Response::ProbeResult { errno } => frame(out, TAG_PROBE_RESULT, &[&errno.to_le_bytes()]),
    }
}

/// Reads fields off a frame's payload.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.0.len() < n {
            return Err(ProtocolError("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, ProtocolError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    fn end(&self) -> Result<(), ProtocolError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError("trailing bytes"))
        }
    }
}

/// Splits a payload into tag and fields.
fn open(payload: &[u8]) -> Result<(u8, Fields<'_>), ProtocolError> {
    let (&tag, rest) = payload.split_first().ok_or(ProtocolError("empty frame"))?;
    Ok((tag, Fields(rest)))
}

/// Decodes a payload (the bytes after the length) sent by the parent.
pub(crate) fn decode_request(payload: &[u8]) -> Result<Request<'_>, ProtocolError> {
    let (tag, mut f) = open(payload)?;
    let req = match tag {
        TAG_INIT => {
            let (memory_bytes, stack_bytes, cpu_seconds, max_frame) = (f.u64()?, f.u64()?, f.u64()?, f.u64()?);
            let (uid, gid, drop, seccomp) = (f.u32()?, f.u32()?, f.u8()?, f.u8()?);
            let run_as = (drop == 1).then_some((uid, gid));
            Request::Init(Init { memory_bytes, stack_bytes, cpu_seconds, max_frame, run_as, seccomp: seccomp == 1 })
        }
        TAG_COMPILE => {
            let count = f.u32()? as usize;
            let mut list = Vec::with_capacity(count.min(4096));
            for _ in 0..count {
                let len = f.u32()? as usize;
                let bytes = f.take(len)?;
                list.push(std::str::from_utf8(bytes).map_err(|_| ProtocolError("pattern is not UTF-8"))?);
            }
            Request::Compile(list)
        }
        TAG_TEXT => {
            let (seq, start) = (f.u32()?, f.u32()?);
            return Ok(Request::Text { seq, start, text: f.rest() });
        }
        TAG_SKIP => {
            let count = f.u32()? as usize;
            let list = (0..count).map(|_| f.u32()).collect::<Result<Vec<_>, _>>()?;
            Request::Skip(list)
        }
        TAG_PROBE => return Ok(Request::Probe(f.rest())),
        _ => return Err(ProtocolError("unknown request")),
    };
    f.end()?;
    Ok(req)
}

/// Decodes a payload sent by the worker.
pub(crate) fn decode_response(payload: &[u8]) -> Result<Response, ProtocolError> {
    let (tag, mut f) = open(payload)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let resp = match tag {
        TAG_READY => {
            let (pid, uid, gid, flags) = (f.u32()?, f.u32()?, f.u32()?, f.u32()?);
            Response::Ready(Ready {
                pid,
                uid,
                gid,
                identity_dropped: flags & 1 != 0,
                seccomp: flags & 2 != 0,
                oom_score_adj: flags & 4 != 0,
            })
        }
        TAG_SETUP_FAILED => Response::SetupFailed(text(f.rest())),
        TAG_COMPILED => Response::Compiled { count: f.u32()? },
        TAG_COMPILE_FAILED => {
            let index = f.u32()?;
            let failure = match f.u8()? {
                0 => CompileFailure::Invalid,
                1 => CompileFailure::OutOfMemory,
                2 => CompileFailure::Nul,
                _ => return Err(ProtocolError("unknown compile failure")),
            };
            Response::CompileFailed { index, failure, reason: text(f.rest()) }
        }
        TAG_ANSWER => {
            let (seq, matched, skipped, out_of_memory) = (f.u32()?, f.u32()?, f.u8()?, f.u32()?);
            Response::Answer { seq, matched, skipped: skipped != 0, out_of_memory }
        }
        TAG_PROBE_RESULT => Response::ProbeResult { errno: f.u32()? as i32 },
        _ => return Err(ProtocolError("unknown response")),
    };
    f.end()?;
    Ok(resp)
}

/// The complete frame at the start of `buf`, if there is one: `(payload range, frame length)`.
/// `Err` when the announced length is over `max`.
pub(crate) fn complete_frame(buf: &[u8], max: usize) -> Result<Option<(std::ops::Range<usize>, usize)>, ProtocolError> {
    let Some(head) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
    if len > max {
        return Err(ProtocolError("frame over the size limit"));
    }
    Ok((buf.len() >= 4 + len).then_some((4..4 + len, 4 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(out: &[u8]) -> &[u8] {
        let (range, len) = complete_frame(out, 1 << 20).unwrap().unwrap();
        assert_eq!(len, out.len());
        &out[range]
    }

    #[test]
    fn every_request_round_trips() {
        let init = Init {
            memory_bytes: 24 << 20,
            stack_bytes: 4 << 20,
            cpu_seconds: 60,
            max_frame: 1 << 20,
            run_as: Some((65534, 65533)),
            seccomp: true,
        };
        let reqs = [
            Request::Init(init.clone()),
            Request::Init(Init { run_as: None, seccomp: false, ..init }),
            Request::Compile(vec!["a|b", "", "é\n"]),
            Request::Compile(vec![]),
            Request::Text { seq: 7, start: 2, text: b"x\0\xff y" },
            Request::Text { seq: 0, start: 0, text: b"" },
            Request::Skip(vec![1, 5]),
            Request::Skip(vec![]),
            Request::Probe(b"/etc/hostname"),
        ];
        for req in reqs {
            let mut out = Vec::new();
            encode_request(&req, &mut out);
            assert_eq!(decode_request(payload(&out)).unwrap(), req);
        }
    }

    #[test]
    fn every_response_round_trips() {
        let resps = [
            Response::Ready(Ready {
                pid: 9,
                uid: 65534,
                gid: 65534,
                identity_dropped: true,
                seccomp: false,
                oom_score_adj: true,
            }),
            Response::SetupFailed("setresuid: EPERM".into()),
            Response::Compiled { count: 4 },
            Response::CompileFailed { index: 3, failure: CompileFailure::OutOfMemory, reason: String::new() },
            Response::CompileFailed { index: 0, failure: CompileFailure::Invalid, reason: "Unmatched ( or \\(".into() },
            Response::Answer { seq: 1, matched: NONE, skipped: true, out_of_memory: 2 },
            Response::Answer { seq: u32::MAX - 1, matched: 0, skipped: false, out_of_memory: NONE },
            Response::ProbeResult { errno: libc::EACCES },
        ];
        for resp in resps {
            let mut out = Vec::new();
            encode_response(&resp, &mut out);
            assert_eq!(decode_response(payload(&out)).unwrap(), resp);
        }
    }

    #[test]
    fn short_oversized_and_garbled_frames_are_refused() {
        let mut out = Vec::new();
        encode_response(&Response::Compiled { count: 1 }, &mut out);
        assert_eq!(complete_frame(&out[..out.len() - 1], 100), Ok(None));
        assert_eq!(complete_frame(&out[..3], 100), Ok(None));
        assert!(complete_frame(&[0xff, 0xff, 0xff, 0x7f], 100).is_err());
        assert!(decode_response(&[]).is_err());
        assert!(decode_response(&[TAG_ANSWER, 1, 2]).is_err());
        assert!(decode_response(&[99]).is_err());
        assert!(decode_response(&[TAG_COMPILED, 1, 0, 0, 0, 9]).is_err(), "trailing bytes");
        assert!(decode_request(&[TAG_COMPILE, 1, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xfe]).is_err(), "not UTF-8");
        assert!(decode_request(&[TAG_COMPILE, 0xff, 0xff, 0xff, 0xff]).is_err(), "count beyond the frame");
    }
}
