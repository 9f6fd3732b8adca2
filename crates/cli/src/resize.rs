//! Resizing image files: `kura drive resize SPEC --size N [--force]`, and the same check and
//! change behind `kura serve ctl resize` for an image a running server exports.
//!
//! Growing is always safe: the file gets longer and the new tail is a hole that reads as
//! zeroes. Shrinking cuts data, so it is refused unless `--force` when
//! - the image starts with a kura format (AccelFS, snapshot, spill, atomic or ingest layout):
//!   those record their size and layout inside the image, so a shorter image is a broken one;
//! - the file system holds data past the new end (`SEEK_DATA` finds any byte that is not a
//!   hole), saying where the first such byte is.
//!
//! Only image files can change size here (`file:`, `uring:` and `sync:` specs of a regular
//! file), also under the pass-through wrappers ([`PASS_THROUGH`]: `cache`, `qos`, `throttle`,
//! `coalesce`, `priority`), whose size is their one child's, so growing the image grows the
//! drive. Everything else is refused with its reason: a block device's size is the device's,
//! drives over several children (`stripe`, `concat`, `mirror`, `spill`, ...) derive theirs from
//! how they combine them, and drives with a format of their own inside the image (`snapshot`,
//! `atomic`) or a window on it (`split`) record their size themselves.

use anyhow::{bail, Context};
use rustix::fs::SeekFrom;
use std::fs::OpenOptions;
use std::io::Read;
use std::path::PathBuf;

/// Sizes must keep whole 4 KiB blocks, the largest block size the image backends use by default.
const GRANULE: u64 = 4096;

/// The kinds whose target is an image file.
const IMAGE_KINDS: &[&str] = &["file", "uring", "sync"];

/// Wrappers of one child whose capacity is the child's, with nothing of their own on it.
const PASS_THROUGH: &[&str] = &["cache", "qos", "throttle", "coalesce", "priority"];

/// The image file of `spec`: a `file:`, `uring:` or `sync:` spec of a regular file, bare or under
/// [`PASS_THROUGH`] wrappers.
pub fn image_path(spec: &str) -> anyhow::Result<PathBuf> {
    let mut parsed = &kura_engine::Spec::parse(spec).with_context(|| format!("`{spec}`"))?;
    while PASS_THROUGH.contains(&parsed.kind.as_str()) && parsed.children.len() == 1 {
        parsed = &parsed.children[0];
    }
    if !IMAGE_KINDS.contains(&parsed.kind.as_str()) {
        let why = match parsed.kind.as_str() {
            "split" => "its window (offset, len) fixes its size".to_string(),
            "snapshot" | "atomic" => {
                "it keeps a format of its own on the image, which records the size".to_string()
            }
            _ if parsed.children.len() > 1 => format!(
                "its size comes from how it combines its {} children, not from one image",
                parsed.children.len()
            ),
            _ if parsed.target.is_none() => "its size comes from what it is built on".to_string(),
            _ => "only image files change size".to_string(),
        };
        bail!(
            "`{spec}`: cannot resize a `{}` drive: {why}. Resizable: file:, uring: or sync: \
             images, bare or under {}",
            parsed.kind,
            PASS_THROUGH.join("/")
        );
    }
    let path = PathBuf::from(parsed.require_target()?);
    let meta = std::fs::metadata(&path).with_context(|| format!("{}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{}: not a regular file (a block device's size is the device's own)",
            path.display()
        );
    }
    Ok(path)
}

/// What a resize did.
#[derive(Debug, Clone, Copy)]
pub struct Resized {
    pub old: u64,
    pub new: u64,
    /// Bytes of data past the new end that a forced shrink cut (0 when none or when growing).
    pub cut_data_from: Option<u64>,
}

/// Makes the image at `path` `size` bytes long (see the module docs for when a shrink is
/// refused). The caller holds the image's lock, or is the process serving it.
pub fn resize_image(path: &std::path::Path, size: u64, force: bool) -> anyhow::Result<Resized> {
    if size == 0 || !size.is_multiple_of(GRANULE) {
        bail!("the new size must be a positive multiple of {GRANULE} bytes, not {size}");
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let old = file.metadata()?.len();
    let mut cut_data_from = None;
    if size < old {
        if let Some(format) = kura_format(&mut file)? {
            if !force {
                bail!(
                    "{} holds {format}, which records its size inside the image: shrinking it \
                     from {old} to {size} bytes would break it (--force cuts it anyway)",
                    path.display()
                );
            }
        }
        match rustix::fs::seek(&file, SeekFrom::Data(size)) {
            Ok(at) if at < old => {
                if !force {
                    bail!(
                        "{} holds data past the new end (the first at byte {at}); shrinking it \
                         from {old} to {size} bytes would lose it (--force cuts it)",
                        path.display()
                    );
                }
                cut_data_from = Some(at);
            }
            // ENXIO: nothing but holes from `size` on.
            _ => {}
        }
    }
    file.set_len(size)
        .with_context(|| format!("resizing {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    Ok(Resized {
        old,
        new: size,
        cut_data_from,
    })
}

/// The kura format the image starts with, if any.
fn kura_format(file: &mut std::fs::File) -> anyhow::Result<Option<&'static str>> {
    let mut head = [0u8; 8];
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    let accelfs = kura_accelfs::header::BlockKind::Superblock
        .magic()
        .to_le_bytes();
    Ok(if head[..4] == accelfs {
        Some("an AccelFS file system")
    } else if &head == kura_vdrive::snapshot::format::SB_MAGIC {
        Some("a snapshot drive")
    } else if &head == b"KURASPIL" {
        Some("a spill drive's chunk map")
    } else if &head == b"KURAATOM" {
        Some("an atomic drive's log")
    } else if head == kura_ingest::layout::SB_MAGIC {
        Some("an ingest device")
    } else {
        None
    })
}

/// `kura drive resize SPEC --size N [--force]`.
pub fn run(spec: &str, size: &str, force: bool) -> anyhow::Result<()> {
    let path = image_path(spec)?;
    let size = kura_engine::spec::parse_size(size)
        .map_err(anyhow::Error::msg)
        .context("--size")?;
    // Holding the image open for writing takes its lock, so a server exporting it (or any
    // other writer) makes this fail rather than change the image under it.
    let _held = crate::dev::open_dev(&format!("sync:{}", path.display())).context(
        "the image is in use; a running `kura serve --ctl` resizes its exports with \
         `kura serve ctl resize`",
    )?;
    let r = resize_image(&path, size, force)?;
    if let Some(at) = r.cut_data_from {
        eprintln!(
            "kura: warning: --force cut the data of {} from byte {at} to {} (now lost)",
            path.display(),
            r.old
        );
    }
    println!("{}: {} -> {} bytes", path.display(), r.old, r.new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_under_pass_through_wrappers_resize_and_other_drives_say_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let i = img.display();
        for spec in [
            format!("file:{i}"),
            format!("cache(uring:{i})?size=1M"),
            format!("qos(throttle(cache(sync:{i})))?iops=5"),
            format!("coalesce(file:{i})"),
        ] {
            assert_eq!(image_path(&spec).unwrap(), img, "{spec}");
        }
        let refused = |spec: String, says: &str| {
            let e = format!("{:#}", image_path(&spec).unwrap_err());
            assert!(e.contains(says), "{spec}: {e}");
        };
        refused(
            format!("stripe(file:{i},file:{i})"),
            "combines its 2 children",
        );
        refused(
            format!("cache(mirror(file:{i},file:{i}))"),
            "`mirror` drive",
        );
        refused(format!("snapshot(file:{i})"), "format of its own");
        refused(format!("split(file:{i})?offset=0&len=4K"), "window");
        refused("mem:1M".to_string(), "only image files");
        refused("cache(mem:1M)".to_string(), "Resizable: file:");
    }

    #[test]
    fn grows_refuses_to_cut_data_and_cuts_holes_or_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.img");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 4096], 512 << 10).unwrap();
        drop(f);
        let r = resize_image(&path, 2 << 20, false).unwrap();
        assert_eq!((r.old, r.new), (1 << 20, 2 << 20));
        // Past the data: only holes are cut.
        resize_image(&path, 768 << 10, false).unwrap();
        let e = resize_image(&path, 256 << 10, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("first at byte 524288"), "{e}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 768 << 10);
        let r = resize_image(&path, 256 << 10, true).unwrap();
        assert_eq!(r.cut_data_from, Some(512 << 10));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 256 << 10);
        assert!(resize_image(&path, 1000, false)
            .unwrap_err()
            .to_string()
            .contains("multiple of 4096"));
        std::fs::write(&path, b"KURASNAP").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let e = resize_image(&path, 64 << 10, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a snapshot drive"), "{e}");
        assert!(image_path("mem:1M")
            .unwrap_err()
            .to_string()
            .contains("only image files"));
        assert!(image_path(&format!("file:{}", dir.path().display()))
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
    }
}
