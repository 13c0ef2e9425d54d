//! The sluice.dev API.
#![forbid(unsafe_code)]
