//! The `rbd:POOL/IMAGE?...` spec: parsing and checking its options, with no Ceph call (so it is
//! tested, and its errors are the same, whether or not kura was built with librbd).

use kura_engine::backend::common::{QueueOptions, COMMON_OPTIONS};
use kura_engine::{OpenError, Spec};

/// Options `rbd:` takes besides the common `bs`, `qd` and `max_transfer`.
pub const RBD_OPTIONS: &[&str] = &[
    "conf", "id", "keyring", "snap", "create", "ro", "timeout", "mon_host",
];

/// Seconds a connect, a monitor request or an OSD request may take before it fails, unless
/// `timeout=` says otherwise.
pub const DEFAULT_TIMEOUT_SECS: u32 = 30;

/// What an `rbd:` spec asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// `conf=`: the ceph.conf to read (None: `$CEPH_CONF`, then `/etc/ceph/ceph.conf`).
    pub conf: Option<String>,
    /// `id=`: the cephx user without `client.` (default `admin`).
    pub id: String,
    /// `keyring=`: overrides the configuration's keyring.
    pub keyring: Option<String>,
    /// `mon_host=`: overrides the configuration's monitor addresses.
    pub mon_host: Option<String>,
    /// `snap=`: open this snapshot, read-only.
    pub snap: Option<String>,
    /// `create=SIZE`: create the image with this size when it does not exist.
    pub create: Option<u64>,
    /// `ro=1`, or implied by `snap=`.
    pub read_only: bool,
    /// `timeout=SECS`: bound on connecting and on every monitor and OSD request.
    pub timeout_secs: u32,
    pub queue: QueueOptions,
    /// `max_transfer=` was given; otherwise requests are cut at the image's object size.
    pub max_transfer_given: bool,
}

impl RbdSpec {
    /// Reads an `rbd:` spec.
    pub fn parse(spec: &Spec) -> Result<RbdSpec, OpenError> {
        let mut allowed: Vec<&str> = COMMON_OPTIONS.to_vec();
        allowed.extend(RBD_OPTIONS);
        spec.check_options(&allowed)?;
        let target = spec.require_target()?;
        let (pool, image) = match target.split_once('/') {
            Some((p, i)) if !p.is_empty() && !i.is_empty() && !i.contains('/') => (p, i),
            _ => {
                return Err(OpenError::Invalid(format!(
                    "{spec}: the target must be POOL/IMAGE, as in rbd:rbd/disk1"
                )))
            }
        };
        let non_empty = |key: &str| -> Result<Option<String>, OpenError> {
            match spec.option(key) {
                Some("") => Err(OpenError::Invalid(format!(
                    "{spec}: option `{key}` needs a value"
                ))),
                v => Ok(v.map(str::to_owned)),
            }
        };
        let snap = non_empty("snap")?;
        let create = spec.size_option("create")?;
        if create == Some(0) {
            return Err(OpenError::Invalid(format!(
                "{spec}: create=SIZE needs a size above zero"
            )));
        }
        let ro = spec.bool_option("ro")?;
        if snap.is_some() && ro == Some(false) {
            return Err(OpenError::Invalid(format!(
                "{spec}: a snapshot is read-only; drop ro=0"
            )));
        }
        if snap.is_some() && create.is_some() {
            return Err(OpenError::Invalid(format!(
                "{spec}: create= makes a new image, which has no snapshot `{}`",
                snap.as_deref().unwrap_or_default()
            )));
        }
        let timeout_secs = spec
            .num_option::<u32>("timeout")?
            .unwrap_or(DEFAULT_TIMEOUT_SECS);
        if !(1..=3600).contains(&timeout_secs) {
            return Err(OpenError::Invalid(format!(
                "{spec}: timeout={timeout_secs} must be 1 to 3600 seconds"
            )));
        }
        let id = non_empty("id")?.unwrap_or_else(|| "admin".into());
        let id = id.strip_prefix("client.").unwrap_or(&id).to_owned();
        Ok(RbdSpec {
            pool: pool.to_owned(),
            image: image.to_owned(),
            conf: non_empty("conf")?,
            id,
            keyring: non_empty("keyring")?,
            mon_host: non_empty("mon_host")?,
            read_only: snap.is_some() || ro == Some(true),
            snap,
            create,
            timeout_secs,
            queue: QueueOptions::from_spec(spec)?,
            max_transfer_given: spec.option("max_transfer").is_some(),
        })
    }

    /// The librados options set before connecting: the bounds on every wait, kura's own logging
    /// kept off the terminal, discards that zero what they cover (a block device's discard
    /// reads back as zeroes; librbd would otherwise skip parts of objects), and librbd's cache
    /// (when the configuration enables it) in write-back from the first write: a kura device
    /// promises durability only after a flush, so librbd need not wait for one to start
    /// caching (its default, writethrough until the first flush, made 4 KiB QD 1 writes 4x
    /// slower than `rbd bench` on the same image).
    pub fn rados_options(&self) -> Vec<(&'static str, String)> {
        let t = self.timeout_secs.to_string();
        let mut options = vec![
            ("client_mount_timeout", t.clone()),
            ("rados_mon_op_timeout", t.clone()),
            ("rados_osd_op_timeout", t),
            ("log_to_stderr", "false".into()),
            ("err_to_stderr", "false".into()),
            ("rbd_skip_partial_discard", "false".into()),
            ("rbd_discard_granularity_bytes", "4096".into()),
            ("rbd_cache_writethrough_until_flush", "false".into()),
        ];
        if let Some(k) = &self.keyring {
            options.push(("keyring", k.clone()));
        }
        if let Some(m) = &self.mon_host {
            options.push(("mon_host", m.clone()));
        }
        options
    }

    /// `POOL/IMAGE[@SNAP]`, for messages.
    pub fn name(&self) -> String {
        match &self.snap {
            Some(s) => format!("{}/{}@{s}", self.pool, self.image),
            None => format!("{}/{}", self.pool, self.image),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RbdSpec, String> {
        RbdSpec::parse(&Spec::parse(text).map_err(|e| e.to_string())?).map_err(|e| e.to_string())
    }

    #[test]
    fn a_full_spec_reads_every_option() {
        let s = parse(
            "rbd:pool1/img?conf=/c/ceph.conf&id=client.bob&keyring=/k&create=64M&timeout=5&qd=32",
        )
        .unwrap();
        assert_eq!((s.pool.as_str(), s.image.as_str()), ("pool1", "img"));
        assert_eq!(s.conf.as_deref(), Some("/c/ceph.conf"));
        assert_eq!(s.id, "bob");
        assert_eq!(s.keyring.as_deref(), Some("/k"));
        assert_eq!(s.create, Some(64 << 20));
        assert_eq!(s.timeout_secs, 5);
        assert_eq!(s.queue.queue_depth, 32);
        assert!(!s.read_only && !s.max_transfer_given);
        let opts = s.rados_options();
        assert!(opts.contains(&("rados_osd_op_timeout", "5".into())));
        assert!(opts.contains(&("keyring", "/k".into())));
    }

    #[test]
    fn a_snapshot_is_read_only_and_defaults_apply() {
        let s = parse("rbd:rbd/a?snap=s1").unwrap();
        assert!(s.read_only);
        assert_eq!(s.name(), "rbd/a@s1");
        assert_eq!(s.id, "admin");
        assert_eq!(s.timeout_secs, DEFAULT_TIMEOUT_SECS);
        assert!(parse("rbd:rbd/a?ro=1").unwrap().read_only);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (text, says) in [
            ("rbd:justimage", "POOL/IMAGE"),
            ("rbd:/img", "POOL/IMAGE"),
            ("rbd:p/a/b", "POOL/IMAGE"),
            ("rbd:p/a?snap=s&ro=0", "read-only"),
            ("rbd:p/a?snap=s&create=1M", "no snapshot"),
            ("rbd:p/a?create=0", "above zero"),
            ("rbd:p/a?timeout=0", "1 to 3600"),
            ("rbd:p/a?conff=/x", "did you mean `conf`"),
            ("rbd:p/a?id=", "needs a value"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
