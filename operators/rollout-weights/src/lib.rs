//! The rollout-weights operator.
#![forbid(unsafe_code)]
