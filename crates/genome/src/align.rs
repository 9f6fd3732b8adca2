//! (issue 5, in progress)
