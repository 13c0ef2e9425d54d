//! Structural schema validation, defaulting, pruning and CEL rules for custom resources.
