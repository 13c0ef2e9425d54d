//! The revert operator.
#![forbid(unsafe_code)]
