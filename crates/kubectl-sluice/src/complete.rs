//! `kubectl sluice __complete ARGS...`: completion candidates in the format kubectl (1.26+) reads
//! from a plugin's completion executable `kubectl_complete-sluice` (cobra's `__complete`
//! protocol: one candidate per line, then `:<directive>`), so `kubectl sluice <TAB>` completes
//! subcommands, flags, flag values and kinds.
//!
//! Owns the walk over the command definition; pure (the caller prints).

use clap::Command;

use crate::kinds::Kind;

/// cobra's ShellCompDirectiveNoFileComp: offer no file names.
const NO_FILE_COMP: u8 = 4;

/// The candidates for the words after `kubectl sluice` (the last one is being typed), and the
/// directive line.
pub fn candidates(root: &Command, args: &[String]) -> String {
    let (partial, words) = match args.split_last() {
        Some((last, rest)) => (last.as_str(), rest),
        None => ("", &[][..]),
    };
    let mut cmd = root;
    let mut positional = 0usize;
    let mut value_of: Option<&clap::Arg> = None;
    for word in words {
        if value_of.take().is_some() {
            continue;
        }
        if let Some(arg) = flag(cmd, root, word) {
            // `--flag value` (not `--flag=value`) takes the next word.
            if !word.contains('=') && arg.get_action().takes_values() {
                value_of = Some(arg);
            }
            continue;
        }
        match cmd
            .get_subcommands()
            .find(|s| s.get_name() == word || s.get_all_aliases().any(|a| a == word))
        {
            Some(sub) => {
                cmd = sub;
                positional = 0;
            }
            None => positional += 1,
        }
    }
    let mut out: Vec<String> = Vec::new();
    if let Some(arg) = value_of {
        out.extend(
            arg.get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string()),
        );
    } else if partial.starts_with('-') {
        for arg in cmd.get_arguments().chain(root.get_arguments()) {
            if arg.is_hide_set() {
                continue;
            }
            if let Some(long) = arg.get_long() {
                out.push(format!("--{long}"));
            }
        }
    } else if cmd.has_subcommands() {
        out.extend(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string()),
        );
    } else if let Some(arg) = cmd.get_positionals().nth(positional) {
        let values = arg.get_possible_values();
        if !values.is_empty() {
            out.extend(values.iter().map(|v| v.get_name().to_string()));
        } else if matches!(arg.get_id().as_str(), "kind") {
            out.push("all".into());
            out.extend(Kind::ALL.iter().map(|k| k.plural().to_string()));
        }
    }
    let mut text = String::new();
    for c in out.iter().filter(|c| c.starts_with(partial)) {
        text.push_str(c);
        text.push('\n');
    }
    text.push_str(&format!(":{NO_FILE_COMP}\n"));
    text
}

/// The option `word` names on `cmd` (or a global one of `root`): `--long`, `--long=value`, `-s`.
fn flag<'a>(cmd: &'a Command, root: &'a Command, word: &str) -> Option<&'a clap::Arg> {
    let word = word.split('=').next().unwrap_or(word);
    let found = |c: &'a Command| {
        c.get_arguments().find(|a| {
            word.strip_prefix("--")
                .is_some_and(|l| a.get_long() == Some(l))
                || (word.len() == 2
                    && word.starts_with('-')
                    && a.get_short().is_some_and(|s| word.ends_with(s)))
        })
    };
    found(cmd).or_else(|| found(root))
}
