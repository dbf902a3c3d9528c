//! A writer for the `newc` cpio format, the one the kernel unpacks as an initramfs
//! (Documentation/driver-api/early-userspace/buffer-format.rst). Uncompressed: the kernel
//! needs no decompressor for it, and the payload is written once per run.
use std::io::{self, Write};

const MAGIC: &[u8] = b"070701";
const TRAILER: &str = "TRAILER!!!";

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// Who owns an entry and its permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    pub const fn root(mode: u32) -> Self {
        Self { mode, uid: 0, gid: 0 }
    }
}

pub struct CpioWriter<W: Write> {
    out: W,
    next_ino: u32,
    /// Bytes written so far; entries are padded to 4-byte boundaries of the whole stream.
    offset: u64,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> Self {
        Self { out, next_ino: 1, offset: 0 }
    }

    /// `path` is relative to the archive root (`usr/bin/bash`), without a leading `/`.
    pub fn dir(&mut self, path: &str, owner: Owner) -> io::Result<()> {
        self.entry(path, S_IFDIR | owner.mode, owner, 2, (0, 0), &[])
    }

    pub fn file(&mut self, path: &str, owner: Owner, data: &[u8]) -> io::Result<()> {
        self.entry(path, S_IFREG | owner.mode, owner, 1, (0, 0), data)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.entry(path, S_IFLNK | 0o777, Owner::root(0o777), 1, (0, 0), target.as_bytes())
    }

    pub fn char_device(&mut self, path: &str, owner: Owner, major: u32, minor: u32) -> io::Result<()> {
        self.entry(path, S_IFCHR | owner.mode, owner, 1, (major, minor), &[])
    }

    /// Writes the trailer and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry(TRAILER, 0, Owner::root(0), 1, (0, 0), &[])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        owner: Owner,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> io::Result<()> {
        let size = u32::try_from(data.len()).map_err(|_| io::Error::other(format!("{name}: larger than 4 GiB")))?;
        let ino = if name == TRAILER { 0 } else { self.next_ino };
        self.next_ino += 1;
        let fields = [
            ino,
            mode,
            owner.uid,
            owner.gid,
            nlink,
            0, // mtime: fixed, so the same inputs give the same archive
            size,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1, // namesize counts the NUL
            0,                     // check (only for the "070702" CRC format)
        ];
        self.write(MAGIC)?;
        for field in fields {
            self.write(format!("{field:08x}").as_bytes())?;
        }
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()?;
        self.write(data)?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let pad = (4 - (self.offset % 4) as usize) % 4;
        self.write(&[0; 3][..pad])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, mode, uid, rdevmajor, data)` for every entry, trailer included.
    fn parse(mut bytes: &[u8]) -> Vec<(String, u32, u32, u32, Vec<u8>)> {
        let total = bytes.len();
        let mut entries = Vec::new();
        loop {
            assert_eq!(&bytes[..6], MAGIC);
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&bytes[6 + 8 * i..14 + 8 * i]).unwrap(), 16).unwrap()
            };
            let (mode, uid, size, rdev_major, namesize) =
                (field(1), field(2), field(6) as usize, field(9), field(11) as usize);
            let name = String::from_utf8(bytes[110..110 + namesize - 1].to_vec()).unwrap();
            let data_at = (110 + namesize).next_multiple_of(4);
            let data = bytes[data_at..data_at + size].to_vec();
            let next = (data_at + size).next_multiple_of(4);
            assert_eq!((total - bytes.len()) % 4, 0, "every header starts 4-byte aligned");
            entries.push((name.clone(), mode, uid, rdev_major, data));
            bytes = &bytes[next..];
            if name == TRAILER {
                assert!(bytes.is_empty());
                return entries;
            }
        }
    }

    #[test]
    fn newc_entries_round_trip_with_alignment() {
        let mut cpio = CpioWriter::new(Vec::new());
        cpio.dir("home", Owner::root(0o755)).unwrap();
        cpio.dir("home/guardtest1", Owner { mode: 0o755, uid: 4201, gid: 4201 }).unwrap();
        cpio.file("init", Owner::root(0o755), b"\x7fELF12345").unwrap();
        cpio.symlink("bin", "usr/bin").unwrap();
        cpio.char_device("dev/console", Owner::root(0o600), 5, 1).unwrap();
        let entries = parse(&cpio.finish().unwrap());
        let names: Vec<_> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["home", "home/guardtest1", "init", "bin", "dev/console", TRAILER]);
        assert_eq!(entries[1].1, S_IFDIR | 0o755);
        assert_eq!(entries[1].2, 4201);
        assert_eq!(entries[2].4, b"\x7fELF12345");
        assert_eq!(entries[3].4, b"usr/bin");
        assert_eq!((entries[4].1, entries[4].3), (S_IFCHR | 0o600, 5));
    }
}
