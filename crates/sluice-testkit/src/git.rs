//! git fixture.
