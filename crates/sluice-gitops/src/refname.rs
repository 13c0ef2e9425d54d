//! Branch names as git accepts them (`git check-ref-format --branch`), checked before any git
//! command runs so a bad name is a clear refusal naming the rule, never a git error or a name
//! git reads as an option.
//!
//! Pure; never runs git.

/// Why `name` is not a branch name git accepts, or `None` when it is one. The reason is a
/// sentence fragment naming the rule broken ("contains '..'").
pub fn branch_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.starts_with('-') {
        return Some("starts with '-' (git would read it as an option)".into());
    }
    if name == "@" {
        return Some("is '@' (git reads it as HEAD)".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || *c == ' ' || "~^:?*[\\".contains(*c))
    {
        let shown = if c.is_control() {
            format!("control character U+{:04X}", u32::from(c))
        } else if c == ' ' {
            "a space".into()
        } else {
            format!("'{c}'")
        };
        return Some(format!(
            "contains {shown} (git forbids spaces, control characters and ~ ^ : ? * [ \\)"
        ));
    }
    if name.contains("..") {
        return Some("contains '..'".into());
    }
    if name.contains("@{") {
        return Some("contains '@{'".into());
    }
    if name.starts_with('/') || name.ends_with('/') {
        return Some("starts or ends with '/'".into());
    }
    if name.contains("//") {
        return Some("contains '//' (an empty path component)".into());
    }
    if name.ends_with('.') {
        return Some("ends with '.'".into());
    }
    for component in name.split('/') {
        if component.starts_with('.') {
            return Some(format!("has a component starting with '.' ({component})"));
        }
        if component.ends_with(".lock") {
            return Some(format!("has a component ending with '.lock' ({component})"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_git_accepts_pass_and_every_rule_is_named() {
        let table: &[(&str, Option<&str>)] = &[
            ("main", None),
            ("release/2026.12", None),
            ("sluice/revert/argocd/pin-1-3f2a9c1e", None),
            ("feature_x-1", None),
            ("v1.0", None),
            ("", Some("is empty")),
            ("-main", Some("starts with '-'")),
            ("--upload-pack=x", Some("starts with '-'")),
            ("@", Some("is '@'")),
            ("a..b", Some("contains '..'")),
            ("..", Some("contains '..'")),
            ("main~1", Some("contains '~'")),
            ("main^", Some("contains '^'")),
            ("a:b", Some("contains ':'")),
            ("a?b", Some("contains '?'")),
            ("a*b", Some("contains '*'")),
            ("a[b", Some("contains '['")),
            ("a\\b", Some("contains '\\'")),
            ("release 1", Some("contains a space")),
            ("a\tb", Some("contains control character U+0009")),
            ("a\u{7f}b", Some("contains control character U+007F")),
            ("a@{1}", Some("contains '@{'")),
            ("/main", Some("starts or ends with '/'")),
            ("main/", Some("starts or ends with '/'")),
            ("a//b", Some("contains '//'")),
            ("main.", Some("ends with '.'")),
            ("a/.hidden", Some("component starting with '.' (.hidden)")),
            (".main", Some("component starting with '.' (.main)")),
            ("main.lock", Some("ending with '.lock' (main.lock)")),
            ("a.lock/b", Some("ending with '.lock' (a.lock)")),
        ];
        for (name, want) in table {
            let got = branch_name_problem(name);
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) => assert!(g.contains(w), "{name:?}: {g:?} lacks {w:?}"),
                _ => panic!("{name:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
