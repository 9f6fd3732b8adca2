//! The kind registry: which spec kinds exist, how each is written, and how each opens.
//!
//! One value lists every kind a program knows. The engine fills in its own
//! ([`Registry::engine`]); crates above it add theirs with a `register(&mut Registry)` function
//! (virtual drives, NVMe, NBD), so registration flows upward and the engine never names an upper
//! crate. Wrappers open their children through the registry they were opened with, so any kind
//! nests inside any other. Library entry points that open a spec take a `&Registry`, which lets a
//! program hand them everything it knows.

use crate::device::BlockDevice;
use crate::error::OpenError;
use crate::spec::{suggest, Spec, SpecError};
use std::fmt;

/// Opens one spec of a kind; wrapped specs are opened through the registry passed in.
pub type Opener = fn(&Spec, &Registry) -> Result<Box<dyn BlockDevice>, OpenError>;

/// How a read-only open (`kura dev info`, `fsck` without repair, a read-only mount, ...) opens a
/// kind: [`Registry::mark_read_only`] adds `ro=1` where the kind takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOnly {
    /// The kind takes `ro=1` and then refuses every write (file-backed backends); a read-only
    /// open adds it unless the spec already says `ro=`.
    RoOption,
    /// Nothing of its own outlives the open: a RAM disk, or a wrapper whose writes reach only its
    /// children, which are marked in turn.
    ThroughChildren,
    /// No read-only mode (a controller, a server's export): a read-only open issues no writes
    /// itself but opens it as it is.
    NotEnforced,
}

/// One registered kind.
#[derive(Clone, Copy)]
pub struct Kind {
    /// The word before `:` or `(` in a spec.
    pub name: &'static str,
    /// The heading `kura specs` lists it under (kinds of one group are registered together).
    pub group: &'static str,
    /// How a spec of this kind is written, e.g. `mem:SIZE` or `mirror(A,B,...)`.
    pub usage: &'static str,
    /// What it is and its options; lines after the first continue the description.
    pub help: &'static str,
    /// How a read-only open treats it.
    pub read_only: ReadOnly,
    pub open: Opener,
}

/// Every kind a program can open, in registration order.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: Vec<Kind>,
}

impl Registry {
    /// A registry with no kinds.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The engine's backends and wrappers (see [`crate::open`]).
    pub fn engine() -> Registry {
        let mut registry = Registry::new();
        crate::open::register(&mut registry);
        registry
    }

    /// Adds a kind.
    ///
    /// # Panics
    /// If a kind of that name is already registered: two crates claiming one word is a wiring
    /// mistake that must not silently pick one of them.
    pub fn add(&mut self, kind: Kind) {
        assert!(
            self.get(kind.name).is_none(),
            "spec kind `{}` registered twice",
            kind.name
        );
        self.kinds.push(kind);
    }

    /// The kind called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&Kind> {
        self.kinds.iter().find(|k| k.name == name)
    }

    /// Every registered kind, in registration order.
    pub fn kinds(&self) -> &[Kind] {
        &self.kinds
    }

    /// Opens a device from its spec string.
    pub fn open(&self, spec: &str) -> Result<Box<dyn BlockDevice>, OpenError> {
        self.open_spec(&Spec::parse(spec)?)
    }

    /// Opens a parsed spec; an unknown kind is refused with the closest registered one as a hint.
    pub fn open_spec(&self, spec: &Spec) -> Result<Box<dyn BlockDevice>, OpenError> {
        match self.get(&spec.kind) {
            Some(kind) => (kind.open)(spec, self),
            None => Err(self.unknown_kind(spec)),
        }
    }

    /// Marks `spec` and everything it wraps for a read-only open: adds `ro=1` to each node whose
    /// kind takes it ([`ReadOnly::RoOption`]) and whose spec does not already say `ro=`. Unknown
    /// kinds are left alone (opening them reports them).
    pub fn mark_read_only(&self, spec: &mut Spec) {
        if self
            .get(&spec.kind)
            .is_some_and(|k| k.read_only == ReadOnly::RoOption)
            && spec.option("ro").is_none()
        {
            spec.options.push(("ro".into(), "1".into()));
        }
        for child in &mut spec.children {
            self.mark_read_only(child);
        }
    }

    fn unknown_kind(&self, spec: &Spec) -> OpenError {
        let known: Vec<&str> = self.kinds.iter().map(|k| k.name).collect();
        let hint = suggest(&spec.kind, &known)
            .map(|s| format!("; did you mean `{s}`?"))
            .unwrap_or_default();
        OpenError::Spec(SpecError::new(
            &spec.to_string(),
            format!(
                "unknown device kind `{}`{hint} (known: {})",
                spec.kind,
                known.join(", ")
            ),
        ))
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.kinds.iter().map(|k| k.name))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kinds_name_the_registered_ones() {
        let e = Registry::engine().open("uringg:/tmp/x").err().unwrap();
        let msg = e.to_string();
        assert!(msg.contains("did you mean `uring`"), "{msg}");
        assert!(msg.contains("known: mem, null, file"), "{msg}");
    }

    #[test]
    fn added_kinds_open_and_nest_inside_engine_wrappers() {
        fn twice(spec: &Spec, reg: &Registry) -> Result<Box<dyn BlockDevice>, OpenError> {
            reg.open(&format!("mem:{}", spec.require_target()?))
        }
        let mut reg = Registry::engine();
        reg.add(Kind {
            name: "twin",
            group: "Test",
            usage: "twin:SIZE",
            help: "a RAM disk under another name",
            read_only: ReadOnly::ThroughChildren,
            open: twice,
        });
        let dev = reg.open("fault(twin:1M)?read_eio=3").unwrap();
        assert_eq!(dev.geometry().capacity_bytes(), 1 << 20);
        assert!(Registry::engine().open("twin:1M").is_err());
    }

    #[test]
    fn read_only_marks_every_node_that_takes_ro_and_keeps_what_the_spec_says() {
        let reg = Registry::engine();
        for kind in ["file", "uring", "sync", "redirect"] {
            assert_eq!(
                reg.get(kind).unwrap().read_only,
                ReadOnly::RoOption,
                "{kind}"
            );
        }
        for kind in ["mem", "null", "fault"] {
            assert_eq!(
                reg.get(kind).unwrap().read_only,
                ReadOnly::ThroughChildren,
                "{kind}"
            );
        }
        let mut spec = Spec::parse("fault(fault(file:/a?size=1M),mem:1M,sync:/b?ro=0,nope:/c)")
            .expect("parse");
        reg.mark_read_only(&mut spec);
        let inner = &spec.children[0].children[0];
        assert_eq!(inner.kind, "file");
        assert_eq!(inner.option("ro"), Some("1"));
        assert_eq!(inner.option("size"), Some("1M"));
        assert_eq!(spec.option("ro"), None, "a wrapper takes no ro=");
        assert_eq!(spec.children[0].option("ro"), None);
        assert_eq!(spec.children[1].option("ro"), None, "mem takes no ro=");
        assert_eq!(
            spec.children[2].option("ro"),
            Some("0"),
            "what the spec says stays"
        );
        assert_eq!(
            spec.children[3].option("ro"),
            None,
            "unknown kinds are left alone"
        );
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn a_kind_cannot_be_registered_twice() {
        let mut reg = Registry::engine();
        let mem = *reg.get("mem").unwrap();
        reg.add(mem);
    }
}
