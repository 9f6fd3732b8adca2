//! Paths: splitting a path into checked components (format §9).

use crate::dir::validate_name;
use crate::error::FsError;

/// Deepest path accepted (format §9).
pub const MAX_DEPTH: usize = 256;

/// Splits a path into checked components (`.` dropped, `..` kept for the walker).
pub(crate) fn components(path: &str) -> Result<Vec<&[u8]>, FsError> {
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => out.push(c.as_bytes()),
            _ => {
                validate_name(c.as_bytes()).map_err(|source| FsError::BadName {
                    path: path.to_string(),
                    source,
                })?;
                out.push(c.as_bytes());
            }
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(FsError::Invalid(format!(
            "{path}: more than {MAX_DEPTH} path components"
        )));
    }
    if path.as_bytes().contains(&0) {
        return Err(FsError::BadName {
            path: path.replace('\0', "\\0"),
            source: crate::dir::NameError::Nul,
        });
    }
    Ok(out)
}
