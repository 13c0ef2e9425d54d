//! prometheus fixture.
