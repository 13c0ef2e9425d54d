//! Gate analysis engine.
#![forbid(unsafe_code)]
