//! Reading manifest YAML into JSON only where Argo CD reads it the same way.
//!
//! Argo CD reads a directory source with the Kubernetes YAML reader, which resolves plain
//! scalars by YAML 1.1 rules (`yes`, `on` and `y` are booleans, `0777` is octal, `1_000` is a
//! number) and applies merge keys (`<<`). Reviewers, editors and YAML 1.2 tools read the same
//! text differently. A bundle holds only what both read alike:
//!
//! - every plain scalar resolves as sluice has always resolved it (YAML 1.2 core with `0b`
//!   binary and signed `0x`/`0o`/`0b` integers; the content digest depends on it), and is
//!   refused when the YAML 1.1 reading gives another value;
//! - merge keys, mapping keys that are not strings, duplicate keys and tags other than `!!str`,
//!   `!!map` and `!!seq` are refused;
//! - aliases are expanded, within a budget against alias bombs; nesting is bounded.
//!
//! The syntax is the parser's (granit-parser, the parser behind serde-saphyr); only the
//! resolution of scalars, where the two readings part, is decided here.

use std::borrow::Cow;
use std::collections::HashMap;

use granit_parser::{Event, Marker, Parser, ScalarStyle, Tag};
use serde_json::{Map, Value, map::Entry};

/// Deepest nesting of sequences and mappings accepted.
pub(crate) const MAX_DEPTH: usize = 128;

/// Nodes that aliases may add, per event read, beyond [`ALIAS_FLOOR`].
const ALIAS_NODES_PER_EVENT: usize = 100;
const ALIAS_FLOOR: usize = 10_000;

/// Why a YAML stream was refused: the document (0-based) and what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub document: usize,
    pub message: String,
}

/// Every document of `text`, `None` for an empty one (`---` with nothing after it, or `null`).
pub(crate) fn documents(text: &str) -> Result<Vec<Option<Value>>, YamlError> {
    let options = granit_parser::options! { emit_comments: false };
    let mut reader = Reader {
        document: 0,
        events: 0,
        alias_nodes: 0,
        anchors: HashMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for item in Parser::new_from_str_with_options(text, options) {
        let (event, span) = item.map_err(|e| reader.error_plain(format!("not valid YAML: {e}")))?;
        reader.event(event, span.start)?;
    }
    Ok(reader.out)
}

struct Reader {
    document: usize,
    events: usize,
    alias_nodes: usize,
    /// Completed anchored nodes of the current document, with their node counts.
    anchors: HashMap<usize, (Value, usize)>,
    stack: Vec<Frame>,
    out: Vec<Option<Value>>,
}

enum Frame {
    Seq {
        items: Vec<Value>,
        anchor: usize,
        nodes: usize,
    },
    Map {
        map: Map<String, Value>,
        /// The key whose value comes next, and where it stands.
        key: Option<(String, Marker)>,
        anchor: usize,
        nodes: usize,
    },
}

impl Reader {
    fn error_plain(&self, message: String) -> YamlError {
        YamlError {
            document: self.document,
            message,
        }
    }

    fn error(&self, at: Marker, message: impl std::fmt::Display) -> YamlError {
        self.error_plain(format!(
            "line {}, column {}: {message}",
            at.line(),
            at.col() + 1
        ))
    }

    fn event(&mut self, event: Event<'_>, at: Marker) -> Result<(), YamlError> {
        self.events += 1;
        match event {
            Event::DocumentStart(..) => {
                self.anchors.clear();
                self.out.push(None);
            }
            Event::DocumentEnd => self.document += 1,
            Event::Scalar(text, style, anchor, tag) => {
                let value = if self.key_expected() {
                    Value::String(self.key(text, style, tag.as_deref(), at)?)
                } else {
                    self.scalar(text, style, tag.as_deref(), at)?
                };
                self.complete(value, 1, anchor, at)?;
            }
            Event::SequenceStart(_, anchor, tag) => {
                self.open(tag.as_deref(), "seq", at)?;
                self.stack.push(Frame::Seq {
                    items: Vec::new(),
                    anchor,
                    nodes: 1,
                });
            }
            Event::MappingStart(_, anchor, tag) => {
                self.open(tag.as_deref(), "map", at)?;
                self.stack.push(Frame::Map {
                    map: Map::new(),
                    key: None,
                    anchor,
                    nodes: 1,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, nodes, anchor) = match self.stack.pop() {
                    Some(Frame::Seq {
                        items,
                        anchor,
                        nodes,
                    }) => (Value::Array(items), nodes, anchor),
                    Some(Frame::Map {
                        map, anchor, nodes, ..
                    }) => (Value::Object(map), nodes, anchor),
                    None => return Err(self.error(at, "unbalanced collection end")),
                };
                self.complete(value, nodes, anchor, at)?;
            }
            Event::Alias(id) => {
                let Some((value, nodes)) = self.anchors.get(&id).cloned() else {
                    return Err(self.error(at, "an alias may not refer to a node that contains it"));
                };
                self.alias_nodes += nodes;
                if self.alias_nodes > ALIAS_FLOOR + ALIAS_NODES_PER_EVENT * self.events {
                    return Err(self.error(
                        at,
                        "aliases expand to too many nodes; write the repeated parts out",
                    ));
                }
                self.complete(value, nodes, 0, at)?;
            }
            _ => {}
        }
        Ok(())
    }

    fn key_expected(&self) -> bool {
        matches!(self.stack.last(), Some(Frame::Map { key: None, .. }))
    }

    fn open(&self, tag: Option<&Tag>, kind: &str, at: Marker) -> Result<(), YamlError> {
        if self.key_expected() {
            return Err(self.error(at, "a mapping key must be a string, not a collection"));
        }
        if self.stack.len() >= MAX_DEPTH {
            return Err(self.error(
                at,
                format!("nested deeper than {MAX_DEPTH} levels; flatten it"),
            ));
        }
        match tag {
            Some(tag) if !tag.is_yaml_core_schema_tag(kind) => Err(unsupported_tag(self, tag, at)),
            _ => Ok(()),
        }
    }

    /// Places a finished node into its parent (or the document) and records its anchor.
    fn complete(
        &mut self,
        value: Value,
        nodes: usize,
        anchor: usize,
        at: Marker,
    ) -> Result<(), YamlError> {
        if anchor != 0 {
            self.anchors.insert(anchor, (value.clone(), nodes));
        }
        match self.stack.last_mut() {
            None => {
                let value = (!value.is_null()).then_some(value);
                match self.out.last_mut() {
                    Some(document) => *document = value,
                    None => self.out.push(value),
                }
            }
            Some(Frame::Seq {
                items, nodes: n, ..
            }) => {
                items.push(value);
                *n += nodes;
            }
            Some(Frame::Map {
                map, key, nodes: n, ..
            }) => match key.take() {
                None => {
                    let Value::String(k) = value else {
                        return Err(self
                            .error(at, format!("mapping key {value} is not a string; quote it")));
                    };
                    *key = Some((k, at));
                }
                Some((k, key_at)) => {
                    match map.entry(k) {
                        Entry::Vacant(slot) => {
                            slot.insert(value);
                        }
                        Entry::Occupied(first) => {
                            let k = Value::String(first.key().clone());
                            return Err(self.error(
                                key_at,
                                format!("mapping key {k} appears twice; keep one"),
                            ));
                        }
                    }
                    *n += nodes;
                }
            },
        }
        Ok(())
    }

    fn key(
        &self,
        text: Cow<'_, str>,
        style: ScalarStyle,
        tag: Option<&Tag>,
        at: Marker,
    ) -> Result<String, YamlError> {
        if text == "<<" {
            // Argo CD's reader applies merge keys; a bundle must hold the merged fields so the
            // objects checked here are the objects applied.
            return Err(self.error(
                at,
                "YAML merge keys (<<) are not allowed in manifests; write the merged fields out",
            ));
        }
        match self.scalar(text, style, tag, at)? {
            Value::String(s) => Ok(s),
            other => Err(self.error(at, format!("mapping key {other} is not a string; quote it"))),
        }
    }

    fn scalar(
        &self,
        text: Cow<'_, str>,
        style: ScalarStyle,
        tag: Option<&Tag>,
        at: Marker,
    ) -> Result<Value, YamlError> {
        if let Some(tag) = tag {
            return if tag.is_yaml_core_schema_tag("str") {
                Ok(Value::String(text.into_owned()))
            } else {
                Err(unsupported_tag(self, tag, at))
            };
        }
        if style != ScalarStyle::Plain {
            return Ok(Value::String(text.into_owned()));
        }
        let ours = resolve(&text);
        let theirs = resolve_yaml11(&text);
        if ours != theirs {
            return Err(self.error(
                at,
                format!(
                    "`{text}` reads as {} here but as {} by YAML 1.1 readers such as Argo CD's; \
                     quote it if the text is meant{}",
                    ours.describe(),
                    theirs.describe(),
                    theirs
                        .spelling()
                        .map(|s| format!(", or write {s} if the value is"))
                        .unwrap_or_default()
                ),
            ));
        }
        match ours {
            Resolved::Null => Ok(Value::Null),
            Resolved::Bool(b) => Ok(Value::Bool(b)),
            Resolved::Int(i) => Ok(if let Ok(i) = i64::try_from(i) {
                Value::from(i)
            } else if let Ok(u) = u64::try_from(i) {
                Value::from(u)
            } else {
                return Err(self.error(at, format!("integer {text} is out of the 64-bit range")));
            }),
            Resolved::Float(f) => serde_json::Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| {
                    self.error(
                        at,
                        format!("number {text} (NaN or infinity) has no JSON form"),
                    )
                }),
            Resolved::NonFinite => Err(self.error(
                at,
                format!("number {text} (NaN or infinity) has no JSON form"),
            )),
            Resolved::Str => Ok(Value::String(text.into_owned())),
        }
    }
}

fn unsupported_tag(reader: &Reader, tag: &Tag, at: Marker) -> YamlError {
    reader.error(
        at,
        format!(
            "YAML tag {} is not supported in manifests; remove it",
            tag.original()
        ),
    )
}

/// What a plain scalar means.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Resolved {
    Null,
    Bool(bool),
    /// Within the 64-bit signed or unsigned range, or outside both (refused).
    Int(i128),
    Float(f64),
    /// `.inf`, `-.inf`, `.nan` and their spellings.
    NonFinite,
    Str,
}

impl Resolved {
    fn describe(self) -> String {
        match self {
            Resolved::Null => "null".into(),
            Resolved::Bool(b) => format!("the boolean {b}"),
            Resolved::Int(i) => format!("the integer {i}"),
            Resolved::Float(f) => format!("the number {f:?}"),
            Resolved::NonFinite => "a non-finite number".into(),
            Resolved::Str => "a string".into(),
        }
    }

    /// How to write this value so both readings agree.
    fn spelling(self) -> Option<String> {
        match self {
            Resolved::Null => Some("null".into()),
            Resolved::Bool(b) => Some(b.to_string()),
            Resolved::Int(i) => Some(i.to_string()),
            Resolved::Float(f) => Some(format!("{f:?}")),
            Resolved::NonFinite | Resolved::Str => None,
        }
    }
}

fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

fn is_non_finite(text: &str) -> bool {
    matches!(
        text,
        ".inf"
            | ".Inf"
            | ".INF"
            | "+.inf"
            | "+.Inf"
            | "+.INF"
            | "-.inf"
            | "-.Inf"
            | "-.INF"
            | ".nan"
            | ".NaN"
            | ".NAN"
    )
}

fn core_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// Leading zeros followed only by digits: a string in YAML 1.2.
fn leading_zero_digits(text: &str) -> bool {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    unsigned.len() > 1
        && unsigned.starts_with('0')
        && unsigned[1..].bytes().all(|b| b.is_ascii_digit())
}

/// Digits in `radix`, nothing else (no sign, no underscore).
fn digits(text: &str, radix: u32) -> Option<u128> {
    if text.is_empty() || !text.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u128::from_str_radix(text, radix).ok()
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, YAML 1.2's (and go-yaml's) float form.
fn float_form(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'-' | b'+')));
    let run = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > start
    };
    let whole = run(&mut i);
    if i < b.len() && b[i] == b'.' {
        i += 1;
        if !run(&mut i) && !whole {
            return false;
        }
    } else if !whole {
        return false;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
            i += 1;
        }
        if !run(&mut i) {
            return false;
        }
    }
    i == b.len()
}

/// Sluice's reading of a plain scalar: YAML 1.2 core, plus `0b` binary and signed
/// `0x`/`0o`/`0b` integers (what bundles have always been read with).
fn resolve(text: &str) -> Resolved {
    if is_null(text) {
        return Resolved::Null;
    }
    if let Some(b) = core_bool(text) {
        return Resolved::Bool(b);
    }
    if is_non_finite(text) {
        return Resolved::NonFinite;
    }
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let prefixed = [("0x", 16), ("0o", 8), ("0b", 2)]
        .into_iter()
        .find_map(|(prefix, radix)| unsigned.strip_prefix(prefix).map(|d| (d, radix)));
    let int = match prefixed {
        Some((d, radix)) => digits(d, radix),
        None if leading_zero_digits(text) => return Resolved::Str,
        None => digits(unsigned, 10),
    };
    if let Some(n) = int {
        let n = i128::try_from(n).unwrap_or(i128::MAX);
        return Resolved::Int(if negative { -n } else { n });
    }
    if prefixed.is_none() && float_form(text) {
        return match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Resolved::Float(f),
            _ => Resolved::Str,
        };
    }
    Resolved::Str
}

/// The Kubernetes YAML reader's (go-yaml v2's) reading of a plain scalar: YAML 1.1 booleans,
/// underscores dropped from numbers, Go's integer syntax (`0` octal, `0X`/`0O`/`0B`).
fn resolve_yaml11(text: &str) -> Resolved {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => return Resolved::Bool(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => return Resolved::Bool(false),
        _ => {}
    }
    if is_null(text) {
        return Resolved::Null;
    }
    if let Some(b) = core_bool(text) {
        return Resolved::Bool(b);
    }
    if is_non_finite(text) {
        return Resolved::NonFinite;
    }
    match text.as_bytes()[0] {
        // Go's float syntax: an underscore may stand between two digits.
        b'.' => {
            let b = text.as_bytes();
            let underscores_ok = b.iter().enumerate().all(|(i, c)| {
                *c != b'_'
                    || (i > 0
                        && b[i - 1].is_ascii_digit()
                        && b.get(i + 1).is_some_and(u8::is_ascii_digit))
            });
            let plain = text.replace('_', "");
            match plain.parse::<f64>() {
                Ok(f) if underscores_ok && float_form(&plain) && f.is_finite() => {
                    Resolved::Float(f)
                }
                _ => Resolved::Str,
            }
        }
        b'0'..=b'9' | b'+' | b'-' => {
            let plain = text.replace('_', "");
            if let Some(i) = go_int(&plain) {
                return Resolved::Int(i);
            }
            match plain.parse::<f64>() {
                Ok(f) if float_form(&plain) && f.is_finite() => Resolved::Float(f),
                _ => Resolved::Str,
            }
        }
        _ => Resolved::Str,
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)`, then `ParseUint(s, 0, 64)` (no sign).
fn go_int(text: &str) -> Option<i128> {
    let (sign, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (Some(true), &text[1..]),
        Some(b'+') => (Some(false), &text[1..]),
        _ => (None, text),
    };
    let lower = unsigned.get(..2).map(str::to_ascii_lowercase);
    let (d, radix) = match lower.as_deref() {
        Some("0x") => (&unsigned[2..], 16),
        Some("0o") => (&unsigned[2..], 8),
        Some("0b") => (&unsigned[2..], 2),
        _ if unsigned.len() > 1 && unsigned.starts_with('0') => (&unsigned[1..], 8),
        _ => (unsigned, 10),
    };
    let n = i128::try_from(digits(d, radix)?).ok()?;
    match sign {
        Some(true) if n <= 1 << 63 => Some(-n),
        Some(_) | None if n <= i128::from(i64::MAX) => Some(n),
        None if n <= i128::from(u64::MAX) => Some(n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Result<Value, String> {
        documents(text)
            .map(|mut d| d.remove(0).unwrap_or(Value::Null))
            .map_err(|e| e.message)
    }

    #[test]
    fn plain_scalars_resolve_as_bundles_always_have() {
        for (text, want) in [
            ("true", serde_json::json!(true)),
            ("False", serde_json::json!(false)),
            ("~", Value::Null),
            ("null", Value::Null),
            ("", Value::Null),
            ("0", serde_json::json!(0)),
            ("-0", serde_json::json!(0)),
            ("+12", serde_json::json!(12)),
            ("0x1F", serde_json::json!(31)),
            ("-0x1F", serde_json::json!(-31)),
            ("0o17", serde_json::json!(15)),
            ("0b101", serde_json::json!(5)),
            ("18446744073709551615", serde_json::json!(u64::MAX)),
            ("-9223372036854775808", serde_json::json!(i64::MIN)),
            ("1.5", serde_json::json!(1.5)),
            ("1.", serde_json::json!(1.0)),
            (".5", serde_json::json!(0.5)),
            ("-.5", serde_json::json!(-0.5)),
            ("1e5", serde_json::json!(100000.0)),
            ("007.5", serde_json::json!(7.5)),
            ("1e400", serde_json::json!("1e400")),
            ("2026-01-01", serde_json::json!("2026-01-01")),
            ("12:30", serde_json::json!("12:30")),
            ("0x", serde_json::json!("0x")),
            ("tRUE", serde_json::json!("tRUE")),
            ("nan", serde_json::json!("nan")),
            ("_1", serde_json::json!("_1")),
            ("a_b", serde_json::json!("a_b")),
            ("=", serde_json::json!("=")),
            ("<<", serde_json::json!("<<")),
        ] {
            assert_eq!(one(&format!("k: {text}\n")).unwrap()["k"], want, "{text:?}");
        }
    }

    #[test]
    fn plain_scalars_a_yaml_1_1_reader_reads_otherwise_are_refused_and_quoted_ones_kept() {
        for (text, theirs) in [
            ("yes", "the boolean true"),
            ("Yes", "the boolean true"),
            ("YES", "the boolean true"),
            ("y", "the boolean true"),
            ("Y", "the boolean true"),
            ("on", "the boolean true"),
            ("ON", "the boolean true"),
            ("no", "the boolean false"),
            ("n", "the boolean false"),
            ("off", "the boolean false"),
            ("Off", "the boolean false"),
            ("0777", "the integer 511"),
            ("-007", "the integer -7"),
            ("00", "the integer 0"),
            ("08", "the number 8.0"),
            ("1_000", "the integer 1000"),
            ("1_0.5", "the number 10.5"),
            ("0X1F", "the integer 31"),
            ("0O17", "the integer 15"),
            ("0B11", "the integer 3"),
            ("0x1F_FF", "the integer 8191"),
            ("99999999999999999999", "the number 1e20"),
        ] {
            let err = one(&format!("k: {text}\n")).unwrap_err();
            assert!(
                err.contains(&format!("`{text}` reads as"))
                    && err.contains(&format!("but as {theirs} by YAML 1.1 readers"))
                    && err.contains("quote it")
                    && err.starts_with("line 1, column 4:"),
                "{text}: {err}"
            );
            for quoted in [
                format!("'{text}'"),
                format!("\"{text}\""),
                format!("!!str {text}"),
            ] {
                assert_eq!(
                    one(&format!("k: {quoted}\n")).unwrap()["k"],
                    serde_json::json!(text),
                    "{quoted}"
                );
            }
        }
        // A key is read the same way: Argo CD would name this field "true".
        let err = one("on: push\n").unwrap_err();
        assert!(err.contains("`on` reads as a string"), "{err}");
        assert_eq!(
            one("\"on\": push\n").unwrap(),
            serde_json::json!({"on": "push"})
        );
    }

    #[test]
    fn keys_tags_duplicates_aliases_and_depth() {
        let refused = [
            ("{1: x}", "mapping key 1 is not a string; quote it"),
            ("{~: x}", "mapping key null is not a string"),
            ("{true: x}", "mapping key true is not a string"),
            ("{[a]: x}", "a mapping key must be a string"),
            (
                "a: 1\na: 2\n",
                "line 2, column 1: mapping key \"a\" appears twice; keep one",
            ),
            (
                "b: &x {c: 1}\nd: {<<: *x}\n",
                "YAML merge keys (<<) are not allowed",
            ),
            ("d: {\"<<\": x}\n", "YAML merge keys (<<) are not allowed"),
            (
                "a: !custom {b: c}\n",
                "YAML tag !custom is not supported in manifests",
            ),
            ("a: !!binary aGk=\n", "YAML tag !!binary is not supported"),
            ("a: !!int 12\n", "YAML tag !!int is not supported"),
            ("a: !!seq {b: c}\n", "YAML tag !!seq is not supported"),
            ("a: .inf\n", "(NaN or infinity) has no JSON form"),
            (
                "a: &x [*x]\n",
                "an alias may not refer to a node that contains it",
            ),
            ("a: *x\n", "not valid YAML"),
            ("a: [\n", "not valid YAML"),
        ];
        for (text, want) in refused {
            let err = one(text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        assert_eq!(
            one("a: &x {b: [1, two]}\nc: *x\nd: !!map {e: !!str 1}\n").unwrap(),
            serde_json::json!({"a": {"b": [1, "two"]}, "c": {"b": [1, "two"]}, "d": {"e": "1"}})
        );

        // An alias bomb is refused before it is built.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let err = one(&bomb).unwrap_err();
        assert!(err.contains("aliases expand to too many nodes"), "{err}");

        let deep = format!("a: {}{}\n", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(
            one(&deep)
                .unwrap_err()
                .contains("nested deeper than 128 levels")
        );
        let ok = format!("{}{}\n", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(one(&ok).is_ok());
    }

    #[test]
    fn documents_are_counted_and_empty_ones_kept_as_none() {
        let docs = documents("a: 1\n---\n---\nnull\n---\nb: 2\n").unwrap();
        assert_eq!(
            docs,
            [
                Some(serde_json::json!({"a": 1})),
                None,
                None,
                Some(serde_json::json!({"b": 2}))
            ]
        );
        let err = documents("a: 1\n---\nb: yes\n").unwrap_err();
        assert_eq!(err.document, 1, "{err:?}");
        assert!(documents("").unwrap().is_empty());
        // A byte-order mark, CRLF line ends, comments and a version directive change nothing.
        assert_eq!(
            documents("\u{feff}%YAML 1.2\r\n---\r\n# c\r\na: 1 # c\r\nb: [x]\r\n").unwrap(),
            [Some(serde_json::json!({"a": 1, "b": ["x"]}))]
        );
        assert!(
            documents("# only a comment\n")
                .unwrap()
                .iter()
                .all(Option::is_none)
        );
        // Anchors do not cross documents.
        assert!(documents("a: &x 1\n---\nb: *x\n").is_err());
    }
}
