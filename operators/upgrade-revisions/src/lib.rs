//! The upgrade-revisions operator.
#![forbid(unsafe_code)]
