//! The progress page shared by the matcher and its worker: one page of a memfd (the worker gets
//! it as fd 3) where the worker notes what it is doing before each `regcomp`/`regexec` — plain
//! stores, no syscall. When the parent kills a worker that overran, or finds it dead, the page
//! says which text and which pattern were running, so that pattern alone is blamed and the text
//! resumes at the next one. The worker's crash and SIGSYS handlers and its panic hook leave
//! their story here too. The parent trusts nothing in it beyond "the worker claimed this".
use std::{
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU8, Ordering},
};

/// What the worker is doing, in the low bits of the progress word.
pub(crate) const STATE_IDLE: u32 = 0;
pub(crate) const STATE_COMPILING: u32 = 1;
pub(crate) const STATE_MATCHING: u32 = 2;
pub(crate) const STATE_PROBING: u32 = 3;
const STATE_BITS: u32 = 3;

const PAGE_BYTES: usize = 4096;
/// Word slots in the page.
const WORD: usize = 0;
const SEQ: usize = 1;
const PATTERN: usize = 2;
const BLOCKED_SYSCALL: usize = 3;
const MESSAGE_LEN: usize = 4;
const CRASH_SIGNAL: usize = 5;
const MESSAGE_AT: usize = 64;

/// The shared progress page. The worker writes it; the parent reads it, and trusts nothing in it
/// beyond "this is what the worker claimed".
pub(crate) struct SharedPage {
    base: NonNull<u8>,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics; it belongs to this
// value and is unmapped once, in Drop.
unsafe impl Send for SharedPage {}
unsafe impl Sync for SharedPage {}

impl SharedPage {
    /// A fresh zeroed page (parent side): a close-on-exec memfd, mapped read-write.
    pub(crate) fn create() -> io::Result<SharedPage> {
        let name = CString::new("guard-pattern-progress").expect("no NUL");
        // SAFETY: `name` is NUL-terminated; the returned fd is checked and then owned.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: resizing our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE_BYTES as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        SharedPage::map(fd)
    }

    /// Maps the page the parent passed as `fd` (worker side).
    pub(crate) fn map(fd: OwnedFd) -> io::Result<SharedPage> {
        // SAFETY: a fresh shared mapping of one page of `fd`; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(SharedPage { base, fd })
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn word(&self, slot: usize) -> &AtomicU32 {
        debug_assert!(slot < MESSAGE_AT / 4);
        // SAFETY: `slot * 4` is inside the page and 4-aligned (the page is page-aligned);
        // AtomicU32 has u32's layout and the memory lives as long as `self`.
        unsafe { &*self.base.as_ptr().add(slot * 4).cast::<AtomicU32>() }
    }

    fn byte(&self, at: usize) -> &AtomicU8 {
        debug_assert!(at < PAGE_BYTES);
        // SAFETY: inside the page; AtomicU8 has u8's layout.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU8>() }
    }

    /// Zeroes the page (before a new worker starts).
    pub(crate) fn reset(&self) {
        for at in 0..PAGE_BYTES {
            self.byte(at).store(0, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::Release);
    }

    /// Worker: "now doing `state` on text `seq`, pattern `pattern`". `counter` is the worker's
    /// own, incremented per call, so the parent sees every transition even between two samples.
    pub(crate) fn note(&self, counter: u32, state: u32, seq: u32, pattern: u32) {
        self.word(SEQ).store(seq, Ordering::Relaxed);
        self.word(PATTERN).store(pattern, Ordering::Relaxed);
        // One store carries both the state and the change, so the parent never pairs an old
        // counter with a new state.
        self.word(WORD).store(counter << STATE_BITS | state, Ordering::Release);
    }

    /// Parent: the progress word (compare for change; `& 7` is the state).
    pub(crate) fn progress(&self) -> u32 {
        self.word(WORD).load(Ordering::Acquire)
    }

    pub(crate) fn state_of(progress: u32) -> u32 {
        progress & ((1 << STATE_BITS) - 1)
    }

    /// Parent, once the worker is dead: `(state, seq, pattern)` it last noted.
    pub(crate) fn last_noted(&self) -> (u32, u32, u32) {
        let word = self.progress();
        (SharedPage::state_of(word), self.word(SEQ).load(Ordering::Relaxed), self.word(PATTERN).load(Ordering::Relaxed))
    }

    /// The syscall number the worker's seccomp filter stopped, if any.
    pub(crate) fn blocked_syscall(&self) -> Option<u32> {
        self.word(BLOCKED_SYSCALL).load(Ordering::Acquire).checked_sub(1)
    }

    /// The slot the worker's SIGSYS handler writes (`syscall number + 1`).
    pub(crate) fn blocked_syscall_slot(&self) -> &AtomicU32 {
        self.word(BLOCKED_SYSCALL)
    }

    /// The fatal signal the worker's crash handler caught, if any.
    pub(crate) fn crash_signal(&self) -> Option<i32> {
        match self.word(CRASH_SIGNAL).load(Ordering::Acquire) {
            0 => None,
            signal => Some(signal as i32),
        }
    }

    /// The slot the worker's crash handler writes (the signal number).
    pub(crate) fn crash_signal_slot(&self) -> &AtomicU32 {
        self.word(CRASH_SIGNAL)
    }

    /// Worker: leaves a short message (a panic) for the parent.
    pub(crate) fn set_message(&self, message: &[u8]) {
        let n = message.len().min(PAGE_BYTES - MESSAGE_AT);
        for (i, &b) in message[..n].iter().enumerate() {
            self.byte(MESSAGE_AT + i).store(b, Ordering::Relaxed);
        }
        self.word(MESSAGE_LEN).store(n as u32, Ordering::Release);
    }

    /// Parent: the worker's message, if it left one.
    pub(crate) fn message(&self) -> Option<String> {
        let n = (self.word(MESSAGE_LEN).load(Ordering::Acquire) as usize).min(PAGE_BYTES - MESSAGE_AT);
        (n > 0).then(|| {
            let bytes: Vec<u8> = (0..n).map(|i| self.byte(MESSAGE_AT + i).load(Ordering::Relaxed)).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: `base` is the one-page mapping made in `map`, unmapped exactly once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), PAGE_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_carries_progress_and_messages() {
        let page = SharedPage::create().unwrap();
        assert_eq!(page.last_noted(), (STATE_IDLE, 0, 0));
        page.note(5, STATE_MATCHING, 42, 3);
        assert_eq!(page.last_noted(), (STATE_MATCHING, 42, 3));
        assert_eq!(page.progress() >> STATE_BITS, 5);
        assert_eq!(page.blocked_syscall(), None);
        page.blocked_syscall_slot().store(258, Ordering::Release);
        assert_eq!(page.blocked_syscall(), Some(257));
        page.set_message(&vec![b'x'; 10_000]);
        assert_eq!(page.message().unwrap().len(), PAGE_BYTES - MESSAGE_AT);
        page.reset();
        assert_eq!((page.message(), page.blocked_syscall(), page.progress()), (None, None, 0));
    }
}
