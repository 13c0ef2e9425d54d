//! The checks every operator's notice tests share: status writes that are worth no notice.
//!
//! Test support only: asserts, never sends anything.

use std::fmt::Debug;

use super::Notice;

/// Asserts that none of the status writes `(before, after)` is worth a notice by `notice`;
/// `phase` names a status in a failure.
pub fn no_notice<S, P: Debug>(
    writes: &[(Option<&S>, &S)],
    notice: impl Fn(Option<&S>, &S) -> Option<Notice>,
    phase: impl Fn(&S) -> P,
) {
    for (before, after) in writes {
        assert_eq!(
            notice(*before, after),
            None,
            "{:?} -> {:?}",
            before.map(&phase),
            phase(after)
        );
    }
}
