//! registry fixture.
