//! Why an `rbd:` device could not be opened, in words that say what to fix.

use kura_engine::{Errno, OpenError};

/// An `rbd:` open that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RbdError {
    /// This build has no librbd.
    #[error("kura was built without rbd: support (KURA_NO_RBD was set when it was built)")]
    NotBuilt,
    /// librbd or librados could not be loaded (they are loaded on the first `rbd:` open).
    #[error(
        "cannot load Ceph's client libraries ({detail}): install librbd1 (apt-get install librbd1)"
    )]
    Library { detail: String },
    /// librados refused the user name.
    #[error("librados refused user {user}: {errno}")]
    User { user: String, errno: Errno },
    /// The configuration file could not be read.
    #[error("cannot read the Ceph configuration {path}: {errno}")]
    Config { path: String, errno: Errno },
    /// A client option was refused.
    #[error("librados refused the option {option}: {errno}")]
    Option { option: String, errno: Errno },
    /// No monitor answered, or a request got no answer, within the timeout.
    #[error("no answer from the cluster ({conf}) within {secs} s ({errno}): are its monitors and OSDs running and mon_host right? (timeout=SECS sets the bound)")]
    Timeout {
        conf: String,
        secs: u32,
        errno: Errno,
    },
    /// cephx refused the credentials.
    #[error("the cluster refused {user}'s cephx credentials ({errno}): check id= and keyring=")]
    Auth { user: String, errno: Errno },
    /// Connecting failed otherwise.
    #[error("cannot connect to the cluster ({conf}) as {user}: {errno}")]
    Connect {
        conf: String,
        user: String,
        errno: Errno,
    },
    /// The pool does not exist.
    #[error("pool `{pool}` does not exist (ceph osd pool create {pool}; rbd pool init {pool})")]
    NoPool { pool: String },
    /// The image (or the snapshot) does not exist.
    #[error("{}", if *snapshot { format!("image or snapshot {name} does not exist (rbd snap ls)") } else { format!("image {name} does not exist (add create=SIZE to create it)") })]
    NoImage { name: String, snapshot: bool },
    /// Another client holds the image's exclusive lock (a second writer).
    #[error("image {name} is in use by another writer (it holds the image's exclusive lock; `rbd status {name}` names it); read-only opens (ro=1, snap=) still work")]
    InUse { name: String },
    /// The image is smaller than one block.
    #[error("image {name} holds {size} bytes, less than one {block_size}-byte block")]
    TooSmall {
        name: String,
        size: u64,
        block_size: u32,
    },
    /// Another librados/librbd call failed.
    #[error("{what} {name} failed: {errno}")]
    Call {
        what: &'static str,
        name: String,
        errno: Errno,
    },
}

impl RbdError {
    /// The error an `rbd:` open through the registry reports, naming the spec's target.
    pub fn into_open_error(self, target: &str) -> OpenError {
        OpenError::Unavailable {
            backend: "rbd",
            feature: format!("image {target}"),
            why: self.to_string(),
        }
    }
}
