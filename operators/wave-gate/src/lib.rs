//! The wave-gate operator.
#![forbid(unsafe_code)]
