//! The Debian metadata `cargo xtask dist` writes, as pure functions of their inputs: the control
//! file, the changelog entry, the machine-readable copyright file, dates, Installed-Size.
use std::collections::BTreeSet;

/// DEBIAN/control from `packaging/debian/control.in` (`@NAME@` placeholders).
pub struct Control<'a> {
    pub version: &'a str,
    pub arch: &'a str,
    pub maintainer: &'a str,
    pub installed_size_kib: u64,
    pub depends: &'a str,
}

pub fn control(template: &str, c: &Control) -> anyhow::Result<String> {
    let text = template
        .replace("@VERSION@", c.version)
        .replace("@ARCH@", c.arch)
        .replace("@MAINTAINER@", c.maintainer)
        .replace("@INSTALLED_SIZE@", &c.installed_size_kib.to_string())
        .replace("@DEPENDS@", c.depends);
    // Any @NAME@ (a segment between two @ that is all capitals) is a placeholder.
    let segments: Vec<&str> = template.split('@').collect();
    let inner = &segments[1..segments.len().saturating_sub(1).max(1)];
    let placeholder = inner.iter().find(|name| {
        !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
            && !["VERSION", "ARCH", "MAINTAINER", "INSTALLED_SIZE", "DEPENDS"].contains(*name)
    });
    if let Some(name) = placeholder {
        anyhow::bail!("control.in has a placeholder xtask does not fill: @{name}@");
    }
    Ok(text)
}

/// The one changelog entry of a package built outside Debian's archive (Debian's changelog format;
/// `dpkg-parsechangelog` reads it).
pub fn changelog(version: &str, maintainer: &str, commit: &str, epoch: u64) -> String {
    format!(
        "guard-user ({version}) unstable; urgency=medium\n\n  * Built by cargo xtask dist from commit {commit}.\n\n -- {maintainer}  {}\n",
        rfc2822(epoch)
    )
}

/// One crate linked into the binary (or the BPF object it embeds).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crate {
    pub name: String,
    pub version: String,
    pub license: String,
}

/// The Expat (MIT) text: DEP-5 wants a license's text unless base-files ships it in
/// /usr/share/common-licenses (Apache-2.0 is there, Expat is not).
const EXPAT: &str = "\
Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the \"Software\"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES
OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN
CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.";

/// `/usr/share/doc/guard-user/copyright` in the machine-readable format (DEP-5). guard's own code
/// is `MIT OR Apache-2.0` (Cargo.toml); the binary is statically linked with `crates`, which the
/// header's Comment lists with the licenses their Cargo.toml declare.
pub fn copyright(maintainer: &str, epoch: u64, crates: &BTreeSet<Crate>) -> String {
    let year = civil(epoch).0;
    let mut s = String::new();
    s.push_str("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n");
    s.push_str("Upstream-Name: guard\n");
    s.push_str(&format!("Upstream-Contact: {maintainer}\n"));
    s.push_str("Comment: guard-user is one Rust program, statically linked, with its BPF object\n");
    s.push_str(" embedded. Besides guard's own code it contains these crates from crates.io,\n");
    s.push_str(" each under the license its Cargo.toml declares:\n .\n");
    for c in crates {
        s.push_str(&format!(" {} {}: {}\n", c.name, c.version, c.license));
    }
    s.push_str("\nFiles: *\n");
    s.push_str(&format!("Copyright: {year} The guard developers\n"));
    s.push_str("License: Expat or Apache-2.0\n");
    s.push_str("Comment: Cargo.toml says MIT OR Apache-2.0; MIT is the Expat license.\n");
    s.push_str("\nLicense: Expat\n");
    for line in EXPAT.lines() {
        s.push_str(if line.is_empty() { " .\n" } else { " " });
        if !line.is_empty() {
            s.push_str(line);
            s.push('\n');
        }
    }
    s.push_str("\nLicense: Apache-2.0\n");
    s.push_str(" On Debian systems, the full text of the Apache License, Version 2.0, is in\n");
    s.push_str(" /usr/share/common-licenses/Apache-2.0.\n");
    s
}

/// Installed-Size as dpkg-gencontrol computes it: each file's size rounded up to KiB, plus one
/// KiB per directory and symlink.
pub fn installed_size_kib(file_sizes: &[u64], other_entries: u64) -> u64 {
    file_sizes.iter().map(|s| s.div_ceil(1024)).sum::<u64>() + other_entries
}

/// (year, month, day, hour, minute, second, weekday 0 = Sunday) in UTC.
fn civil(epoch: u64) -> (i64, u32, u32, u32, u32, u32, u32) {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    // Howard Hinnant's days → civil date (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 4).rem_euclid(7) as u32; // 1970-01-01 was a Thursday
    (year, month, day, (secs / 3600) as u32, (secs / 60 % 60) as u32, (secs % 60) as u32, weekday)
}

/// `YYYY-MM-DD` (the man pages' date).
pub fn iso_date(epoch: u64) -> String {
    let (y, m, d, ..) = civil(epoch);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `Fri, 04 Dec 2026 05:40:29 +0000` (the changelog's date, what `date -R` prints in UTC).
pub fn rfc2822(epoch: u64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (y, m, d, h, min, s, wd) = civil(epoch);
    format!("{}, {d:02} {} {y:04} {h:02}:{min:02}:{s:02} +0000", DAYS[wd as usize], MONTHS[m as usize - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_match_what_date_prints() {
        // date -u -R -d @0 / @951782400 (a leap day) / @1796362306
        assert_eq!(rfc2822(0), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(rfc2822(951_782_400), "Tue, 29 Feb 2000 00:00:00 +0000");
        assert_eq!(rfc2822(1_796_362_306), "Fri, 04 Dec 2026 05:31:46 +0000");
        assert_eq!(iso_date(1_796_362_306), "2026-12-04");
    }

    #[test]
    fn control_fails_on_a_placeholder_it_does_not_fill() {
        let c =
            Control { version: "1-1", arch: "amd64", maintainer: "M <m@x>", installed_size_kib: 3, depends: "libc6" };
        assert_eq!(control("Version: @VERSION@\nDepends: @DEPENDS@\n", &c).unwrap(), "Version: 1-1\nDepends: libc6\n");
        assert!(control("Homepage: @HOMEPAGE@\n", &c).is_err());
        // An @ in text (an instance name, an address) is not a placeholder.
        assert!(control("Maintainer: @MAINTAINER@\n runs as guard-user@ACCOUNT.service\n", &c).is_ok());
    }

    #[test]
    fn copyright_paragraphs_are_separated_and_continuation_lines_indented() {
        let crates = BTreeSet::from([Crate {
            name: "aya".into(),
            version: "0.14.0".into(),
            license: "MIT OR Apache-2.0".into(),
        }]);
        let text = copyright("M <m@x>", 0, &crates);
        for paragraph in text.split("\n\n") {
            let first = paragraph.lines().next().unwrap();
            assert!(first.contains(": "), "a paragraph starts with a field: {first:?}");
            for line in paragraph.lines().skip(1) {
                assert!(line.starts_with(' ') || line.contains(": "), "neither field nor continuation: {line:?}");
            }
        }
        assert!(text.contains("\n aya 0.14.0: MIT OR Apache-2.0\n"));
        assert!(text.contains("Copyright: 1970 The guard developers\n"));
    }
}
