//! The I/O paths the application is compared on (the paper's Fig. 8), and the workspace that
//! holds the same input files for each: host files read with plain system calls, and an image
//! file holding an AccelFS with the same files, mounted either on the direct engine (`uring`,
//! falling back to `file:` where io_uring is unavailable) or on `redirect` (a host process serves
//! every I/O, the paper's mediated path). The page cache is dropped for the image and the host
//! files before every run, so each path starts cold.

use crate::pipeline::PipelineError;
use crate::store::{Store, StoreError};
use kura_accelfs::fs::{FileSystem, MountOptions};
use kura_accelfs::MkfsOptions;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The real genome the issue names, where Debian's `ragout-examples` is installed.
pub const MG1655: &str = "/usr/share/doc/ragout/examples/E.Coli/references/MG1655-K12.fasta.gz";

/// Bytes copied per write when filling the image.
const COPY_CHUNK: usize = 4 << 20;

/// One way for the application to reach its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPath {
    /// AccelFS on the direct engine (io_uring from the application's own threads).
    Direct,
    /// Host files through plain system calls (`read`, `write`, `fsync`).
    Host,
    /// AccelFS on `redirect`: each I/O served by a host process, as when the host mediates.
    Redirect,
}

impl IoPath {
    pub const ALL: [IoPath; 3] = [IoPath::Direct, IoPath::Host, IoPath::Redirect];

    pub fn name(self) -> &'static str {
        match self {
            IoPath::Direct => "accelfs",
            IoPath::Host => "host",
            IoPath::Redirect => "redirect",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            IoPath::Direct => "AccelFS on the direct engine (io_uring)",
            IoPath::Host => "host files, plain system calls",
            IoPath::Redirect => "AccelFS on redirect (host process serves each I/O)",
        }
    }

    /// Parses `accelfs`, `host` or `redirect`.
    pub fn parse(name: &str) -> Option<IoPath> {
        IoPath::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Parses a comma-separated list such as `accelfs,host,redirect`; the error names the
    /// word that is not a path, or says the list is empty.
    pub fn parse_list(list: &str) -> Result<Vec<IoPath>, String> {
        let mut paths = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match IoPath::parse(name) {
                Some(p) => paths.push(p),
                None => {
                    return Err(format!(
                        "`{name}` is not an I/O path (use accelfs, host, redirect)"
                    ))
                }
            }
        }
        if paths.is_empty() {
            return Err("no I/O path named".into());
        }
        Ok(paths)
    }
}

/// A directory holding the input files as host files and inside an AccelFS image.
#[derive(Debug)]
pub struct Workspace {
    dir: PathBuf,
    image: PathBuf,
    files: Vec<String>,
}

/// A store opened on one path, or on a device the caller opened (`kura genome index|map --dev`);
/// keeps the file system mounted while it lives.
pub struct Opened {
    pub store: Store,
    /// The device spec actually mounted (`file:` where io_uring was refused for the direct
    /// path; `None` for host files).
    pub spec: Option<String>,
    /// The file system to unmount on [`Opened::close`]: `None` for host files and for a
    /// read-only mount, which has nothing to commit.
    fs: Option<FileSystem>,
}

impl Opened {
    /// Host files, paths relative to `root` (or absolute).
    pub fn host(root: impl Into<PathBuf>) -> Opened {
        Opened {
            store: Store::host(root),
            spec: None,
            fs: None,
        }
    }

    /// Mounts the AccelFS of `dev` (opened from `spec`, named in the error) read-write.
    pub fn mount(
        dev: Box<dyn kura_engine::BlockDevice>,
        spec: &str,
    ) -> Result<Opened, PipelineError> {
        let fs = FileSystem::mount(dev, MountOptions::default()).map_err(|source| {
            PipelineError::Mount {
                spec: spec.to_string(),
                source,
            }
        })?;
        Ok(Opened {
            store: Store::AccelFs(fs.clone()),
            spec: Some(spec.to_string()),
            fs: Some(fs),
        })
    }

    /// Mounts the AccelFS of `dev` read-only, for a job that only reads (`map` writing to
    /// standard output): with a device opened `ro=1`, not a byte of the image changes.
    pub fn mount_read_only(
        dev: Box<dyn kura_engine::BlockDevice>,
        spec: &str,
    ) -> Result<Opened, PipelineError> {
        let fs = FileSystem::mount_read_only(dev, MountOptions::default()).map_err(|source| {
            PipelineError::MountReadOnly {
                spec: spec.to_string(),
                source,
            }
        })?;
        Ok(Opened {
            store: Store::AccelFs(fs),
            spec: Some(spec.to_string()),
            fs: None,
        })
    }

    /// Unmounts (committing anything written); the file system's own error.
    pub fn unmount(self) -> Result<(), kura_accelfs::FsError> {
        match self.fs {
            Some(fs) => fs.unmount(),
            None => Ok(()),
        }
    }

    /// Unmounts (committing anything written) and reports a failure to do so.
    pub fn close(self) -> Result<(), PipelineError> {
        self.unmount().map_err(|source| {
            PipelineError::Store(StoreError::Fs {
                path: "(unmount)".into(),
                source,
            })
        })
    }
}

fn host_err(path: &Path, e: std::io::Error) -> PipelineError {
    PipelineError::Store(StoreError::Host {
        path: path.display().to_string(),
        source: e,
    })
}

fn fs_err(path: &str, source: kura_accelfs::FsError) -> PipelineError {
    PipelineError::Store(StoreError::Fs {
        path: path.to_string(),
        source,
    })
}

/// Opens a device spec, naming the spec in the error.
fn open_device(spec: &str) -> Result<Box<dyn kura_engine::BlockDevice>, PipelineError> {
    kura_engine::open(spec).map_err(|source| PipelineError::Device {
        spec: spec.to_string(),
        source,
    })
}

/// Evicts a host file from the page cache so the next read comes from the disk.
pub fn drop_page_cache(path: &Path) -> Result<(), PipelineError> {
    kura_engine::backend::file::drop_page_cache(path).map_err(|e| host_err(path, e))
}

impl Workspace {
    /// Copies `inputs` (name in the workspace, host source) into `dir` and into a new AccelFS
    /// image there; `progress(done, total)` follows the bytes copied into the image.
    pub fn prepare(
        dir: &Path,
        inputs: &[(&str, &Path)],
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Workspace, PipelineError> {
        std::fs::create_dir_all(dir).map_err(|e| host_err(dir, e))?;
        let mut total = 0u64;
        for (name, src) in inputs {
            let dst = dir.join(name);
            if dst != *src {
                std::fs::copy(src, &dst).map_err(|e| host_err(src, e))?;
            }
            total += std::fs::metadata(&dst)
                .map_err(|e| host_err(&dst, e))?
                .len();
        }
        let image = dir.join("kura-genome.img");
        // Room for the inputs, the index, SAM output and metadata.
        let size = (total * 3 + (512 << 20)).next_multiple_of(1 << 20);
        let spec = format!("file:{}?size={size}", image.display());
        let fs = FileSystem::format(
            open_device(&spec)?,
            MkfsOptions::default(),
            MountOptions::default(),
        )
        .map_err(|e| fs_err(&image.display().to_string(), e))?;
        let mut done = 0u64;
        let mut buf = vec![0u8; COPY_CHUNK];
        for (name, _) in inputs {
            let host = dir.join(name);
            let target = format!("/{name}");
            let mut src = std::fs::File::open(&host).map_err(|e| host_err(&host, e))?;
            let file = fs.create(&target).map_err(|e| fs_err(&target, e))?;
            let mut at = 0u64;
            loop {
                let n = src.read(&mut buf).map_err(|e| host_err(&host, e))?;
                if n == 0 {
                    break;
                }
                file.write_at(at, &buf[..n])
                    .map_err(|e| fs_err(&target, e))?;
                at += n as u64;
                done += n as u64;
                progress(done, total);
            }
            file.sync_all().map_err(|e| fs_err(&target, e))?;
        }
        fs.unmount()
            .map_err(|e| fs_err(&image.display().to_string(), e))?;
        Ok(Workspace {
            dir: dir.to_path_buf(),
            image,
            files: inputs.iter().map(|(n, _)| n.to_string()).collect(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn image(&self) -> &Path {
        &self.image
    }

    /// The device spec the image is first tried with on `path` (`None` for host files); the
    /// direct path may fall back to `file:` ([`Opened::spec`] says which was mounted).
    pub fn spec(&self, path: IoPath) -> Option<String> {
        let img = self.image.display();
        match path {
            IoPath::Direct => Some(format!("uring:{img}")),
            IoPath::Redirect => Some(format!("redirect:{img}")),
            IoPath::Host => None,
        }
    }

    /// Drops the page cache for every file and opens the store of `path`.
    pub fn open(&self, path: IoPath) -> Result<Opened, PipelineError> {
        drop_page_cache(&self.image)?;
        for name in &self.files {
            drop_page_cache(&self.dir.join(name))?;
        }
        let Some(spec) = self.spec(path) else {
            return Ok(Opened::host(&self.dir));
        };
        let (dev, spec) = match open_device(&spec) {
            // Where io_uring is refused (old kernels, seccomp), the direct path is the engine's
            // synchronous file backend: still no host process in the data path.
            Err(_) if path == IoPath::Direct => {
                let file = format!("file:{}", self.image.display());
                (open_device(&file)?, file)
            }
            other => (other?, spec),
        };
        let fs = FileSystem::mount(dev, MountOptions::default())
            .map_err(|e| fs_err(&self.image.display().to_string(), e))?;
        Ok(Opened {
            store: Store::AccelFs(fs.clone()),
            spec: Some(spec),
            fs: Some(fs),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{IoPath, Workspace};

    #[test]
    fn an_opened_path_names_the_spec_it_mounted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("reads.fq");
        std::fs::write(&input, b"@r\nACGT\n+\nIIII\n").expect("write");
        let work = Workspace::prepare(
            &dir.path().join("work"),
            &[("reads", &input)],
            &mut |_, _| {},
        )
        .expect("workspace");
        let img = work.image().display().to_string();
        let host = work.open(IoPath::Host).expect("host files");
        assert_eq!(host.spec, None);
        host.close().expect("close");
        let direct = work.open(IoPath::Direct).expect("direct path");
        let spec = direct.spec.clone().expect("a device spec");
        // io_uring where the kernel allows it, else the file backend: whichever was mounted.
        assert!(
            spec == format!("uring:{img}") || spec == format!("file:{img}"),
            "{spec}"
        );
        direct.close().expect("close");
        if spec.starts_with("uring:") {
            assert!(
                kura_engine::open(&spec).is_ok(),
                "uring opened before, so it opens now"
            );
        } else {
            assert!(
                kura_engine::open(&format!("uring:{img}")).is_err(),
                "file: only after a refusal"
            );
        }
    }

    #[test]
    fn path_lists_parse_and_bad_words_are_named() {
        assert_eq!(
            IoPath::parse_list(" accelfs, redirect ,"),
            Ok(vec![IoPath::Direct, IoPath::Redirect])
        );
        let e = IoPath::parse_list("accelfs,nfs").expect_err("nfs is no path");
        assert!(e.contains("`nfs`"), "{e}");
        assert!(IoPath::parse_list(" , ").is_err());
        for p in IoPath::ALL {
            assert_eq!(IoPath::parse(p.name()), Some(p));
        }
    }
}
