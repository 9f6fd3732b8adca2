//! Device spec strings: how every command line and config names a device.
//!
//! Grammar (whitespace is not allowed):
//!
//! ```text
//! spec    := name ':' target [ '?' options ]            a backend, e.g. file:/tmp/a.img?size=1G
//!          | name '(' spec { ',' spec } ')' [ '?' options ]   a wrapper, e.g. fault(mem:64M)?write_eio=3
//! options := key '=' value { '&' key '=' value }
//! ```
//!
//! A backend's target runs to the first top-level `?`, `,` or `)`, so paths must not contain those
//! three characters. Parsing is separate from opening so that upper layers (virtual drives) can add
//! their own wrapper names over the same syntax. Unknown names and option keys are errors with a
//! "did you mean" hint, never silently ignored.

use std::fmt;

/// A parsed spec: a backend with a target, or a wrapper with children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub kind: String,
    /// Backend target (path or size); `None` for wrappers.
    pub target: Option<String>,
    /// Wrapped specs; empty for backends.
    pub children: Vec<Spec>,
    /// `key=value` options in the order written.
    pub options: Vec<(String, String)>,
}

/// A spec string that does not parse, or that names things nobody knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (in `{spec}`)")]
pub struct SpecError {
    pub spec: String,
    pub message: String,
}

impl SpecError {
    pub fn new(spec: &str, message: impl Into<String>) -> Self {
        SpecError {
            spec: spec.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Some(t) => write!(f, "{}:{}", self.kind, t)?,
            None => {
                write!(f, "{}(", self.kind)?;
                for (i, c) in self.children.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{c}")?;
                }
                f.write_str(")")?;
            }
        }
        for (i, (k, v)) in self.options.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { '?' } else { '&' })?;
        }
        Ok(())
    }
}

impl Spec {
    /// Parses a whole spec string.
    pub fn parse(text: &str) -> Result<Spec, SpecError> {
        let mut p = Parser { text, pos: 0 };
        let spec = p.spec()?;
        if p.pos != text.len() {
            return Err(p.error(format!(
                "unexpected `{}` at column {}",
                &text[p.pos..],
                p.pos + 1
            )));
        }
        Ok(spec)
    }

    /// The value of option `key`, if given.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Fails when an option key is not in `allowed`, suggesting the closest allowed key.
    pub fn check_options(&self, allowed: &[&str]) -> Result<(), SpecError> {
        for (key, _) in &self.options {
            if !allowed.contains(&key.as_str()) {
                let hint = suggest(key, allowed)
                    .map(|s| format!("; did you mean `{s}`?"))
                    .unwrap_or_default();
                return Err(SpecError::new(
                    &self.to_string(),
                    format!(
                        "`{}` has no option `{key}`{hint} (options: {})",
                        self.kind,
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Option `key` parsed as a size with an optional K/M/G/T suffix (powers of 1024).
    pub fn size_option(&self, key: &str) -> Result<Option<u64>, SpecError> {
        self.option(key)
            .map(|v| {
                parse_size(v)
                    .map_err(|m| SpecError::new(&self.to_string(), format!("option `{key}`: {m}")))
            })
            .transpose()
    }

    /// Option `key` parsed as a number.
    pub fn num_option<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, SpecError> {
        self.option(key)
            .map(|v| {
                v.parse::<T>().map_err(|_| {
                    SpecError::new(
                        &self.to_string(),
                        format!("option `{key}`: `{v}` is not a valid number"),
                    )
                })
            })
            .transpose()
    }

    /// Option `key` parsed as a boolean (`1/0`, `true/false`, `yes/no`, `on/off`).
    pub fn bool_option(&self, key: &str) -> Result<Option<bool>, SpecError> {
        self.option(key)
            .map(|v| match v {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(SpecError::new(
                    &self.to_string(),
                    format!("option `{key}`: `{v}` is not a boolean (use 1 or 0)"),
                )),
            })
            .transpose()
    }

    /// The target, or an error saying this kind needs one.
    pub fn require_target(&self) -> Result<&str, SpecError> {
        match self.target.as_deref() {
            Some(t) if !t.is_empty() => Ok(t),
            _ => Err(SpecError::new(
                &self.to_string(),
                format!(
                    "`{}` needs a target, as in `{}:<path or size>`",
                    self.kind, self.kind
                ),
            )),
        }
    }
}

/// The closest candidate to `word` by edit distance, if it is close enough to be a typo.
pub fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), *c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Parses `4096`, `64K`, `256M`, `1G`, `2GiB`, `1T` (binary multiples) into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits_end == 0 {
        return Err(format!(
            "`{text}` is not a size (examples: 4096, 64K, 256M, 1G)"
        ));
    }
    let number: u64 = t[..digits_end]
        .parse()
        .map_err(|_| format!("`{text}` is too large"))?;
    let shift = match t[digits_end..].to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "`{text}` has an unknown unit `{other}` (use K, M, G or T)"
            ))
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, message: String) -> SpecError {
        SpecError::new(self.text, message)
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn spec(&mut self) -> Result<Spec, SpecError> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            self.pos += 1;
        }
        let kind = self.text[start..self.pos].to_string();
        if kind.is_empty() {
            return Err(self.error(format!(
                "expected a device kind at column {} (e.g. `mem:64M`, `file:/path`, `fault(mem:64M)`)",
                start + 1
            )));
        }
        let (target, children) = match self.peek() {
            Some(b':') => {
                self.pos += 1;
                let t0 = self.pos;
                while self.peek().is_some_and(|c| !matches!(c, b'?' | b',' | b')')) {
                    self.pos += 1;
                }
                (Some(self.text[t0..self.pos].to_string()), Vec::new())
            }
            Some(b'(') => {
                self.pos += 1;
                let mut children = vec![self.spec()?];
                loop {
                    match self.peek() {
                        Some(b',') => {
                            self.pos += 1;
                            children.push(self.spec()?);
                        }
                        Some(b')') => {
                            self.pos += 1;
                            break;
                        }
                        _ => {
                            return Err(self.error(format!("`{kind}(` is missing its closing `)`")));
                        }
                    }
                }
                (None, children)
            }
            _ => {
                return Err(self.error(format!(
                    "`{kind}` must be followed by `:` and a target (`{kind}:...`) or by `(` and inner devices"
                )))
            }
        };
        let mut options = Vec::new();
        if self.peek() == Some(b'?') {
            self.pos += 1;
            let o0 = self.pos;
            while self.peek().is_some_and(|c| !matches!(c, b',' | b')')) {
                self.pos += 1;
            }
            for pair in self.text[o0..self.pos].split('&').filter(|p| !p.is_empty()) {
                let Some((k, v)) = pair.split_once('=') else {
                    return Err(
                        self.error(format!("option `{pair}` needs a value, as in `{pair}=1`"))
                    );
                };
                options.push((k.to_string(), v.to_string()));
            }
        }
        Ok(Spec {
            kind,
            target,
            children,
            options,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backends_wrappers_and_options() {
        let s = Spec::parse("fault(file:/tmp/a.img?size=1G&bs=512,mem:4M)?write_eio=3").unwrap();
        assert_eq!(s.kind, "fault");
        assert_eq!(s.children.len(), 2);
        assert_eq!(s.children[0].target.as_deref(), Some("/tmp/a.img"));
        assert_eq!(s.children[0].option("bs"), Some("512"));
        assert_eq!(s.option("write_eio"), Some("3"));
        assert_eq!(
            Spec::parse(&s.to_string()).unwrap(),
            s,
            "display round-trips"
        );
    }

    #[test]
    fn rejects_malformed_specs_with_a_reason() {
        for bad in [
            "",
            "mem",
            "fault(mem:1M",
            "mem:1M?size",
            ":x",
            "fault(mem:1M))",
            "a b:c",
        ] {
            let err = Spec::parse(bad).unwrap_err();
            assert!(!err.message.is_empty(), "{bad}");
        }
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn unknown_options_get_a_suggestion() {
        let s = Spec::parse("uring:/dev/x?sqpol=1").unwrap();
        let err = s.check_options(&["sqpoll", "direct"]).unwrap_err();
        assert!(err.message.contains("did you mean `sqpoll`"), "{err}");
    }
}
