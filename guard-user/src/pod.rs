//! Kernel records as their `#[repr(C)]` types (guard-common): the one place bytes from the
//! kernel become a struct and a struct becomes the bytes the kernel would have written, so no
//! decoder repeats the layout as byte offsets.
use aya::Pod;

/// The record `bytes` hold, when they are exactly one `T` long; `None` for any other length.
/// The ring and the task iterator give no alignment promise, so the copy is unaligned.
pub(crate) fn read<T: Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() != std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: `Pod` types are plain data valid for every bit pattern (guard-common implements it
    // only for its padding-free integer structs), the length was checked, and read_unaligned
    // has no alignment requirement.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The bytes of `value`, as the kernel lays the record out (native endianness).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn bytes<T: Pod>(value: &T) -> &[u8] {
    // SAFETY: `Pod` types have no padding, so all `size_of::<T>()` bytes are initialized, and
    // the slice borrows `value`.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

#[cfg(test)]
mod tests {
    use guard_common::{RawEvent, COMM_LEN};

    use super::*;

    fn sample() -> RawEvent {
        RawEvent { kind: 2, pid: 42, aux: 43, euid: 1000, start_boottime_ns: 7 << 40, comm: [b'x'; COMM_LEN] }
    }

    #[test]
    fn a_record_reads_back_from_its_own_bytes() {
        let r = sample();
        assert_eq!(read::<RawEvent>(bytes(&r)), Some(r));
    }

    /// The ring gives no alignment promise: a record one byte off its natural alignment reads
    /// the same.
    #[test]
    fn a_record_at_an_unaligned_address_reads_like_an_aligned_one() {
        let r = sample();
        let mut buf = [0u8; RawEvent::SIZE + 1];
        buf[1..].copy_from_slice(bytes(&r));
        assert_eq!(read::<RawEvent>(&buf[1..]), Some(r));
    }

    #[test]
    fn a_record_of_any_other_length_is_refused() {
        let r = sample();
        let b = bytes(&r);
        assert_eq!(read::<RawEvent>(&b[..RawEvent::SIZE - 1]), None);
        assert_eq!(read::<RawEvent>(&[]), None);
        let mut longer = b.to_vec();
        longer.push(0);
        assert_eq!(read::<RawEvent>(&longer), None);
    }
}
