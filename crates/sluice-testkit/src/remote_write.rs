//! remote_write fixture.
