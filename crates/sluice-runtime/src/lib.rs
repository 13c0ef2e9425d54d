//! What every sluice operator binary shares.
#![forbid(unsafe_code)]
