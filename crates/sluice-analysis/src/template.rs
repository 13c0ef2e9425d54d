//! PromQL templates with `{{variables}}`: parsing, escaping and batched rendering.
//!
//! Owns the only path by which a label value enters a query. A value is always placed inside a
//! double-quoted PromQL string literal and escaped for it (and, after `=~`/`!~`, escaped as a
//! literal for the regex first), so no value can end the string, add a matcher or an operator.
//! Variables outside a string literal are refused, except the two the engine renders itself:
//! `{{window}}` (a duration it formats) and `{{by}}` (the grouping labels it derives).
//! An unknown or missing variable is an error, never an empty string. Comments (`# ...`) are
//! copied verbatim.
//!
//! Batching: a matcher whose whole string is one variable after `=` (`label="{{service}}"`) is a
//! *key matcher*. For a batch of objects it is rendered as `label=~"a|b|c"` over every object's
//! value, and `{{by}}` renders the key labels so that `sum by ({{by}}) (...)` returns one series
//! per object, which the engine splits back by those labels. Every other variable must have the
//! same value across a batch (it is part of the batch key). It never performs I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Variables the engine renders itself.
pub const ENGINE_VARIABLES: &[&str] = &["window", "by"];

/// Errors of template parsing and rendering.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum TemplateError {
    /// `{{name}}` is neither a known variable nor one the gate declares.
    #[error(
        "template uses unknown variable {{{{{name}}}}}; use one of the known variables or declare it in the gate's \
         `variables`"
    )]
    UnknownVariable {
        /// The variable name.
        name: String,
    },
    /// A value for `{{name}}` was not supplied.
    #[error(
        "no value for template variable {{{{{name}}}}}; the owner object or the gate's `variables` must set it"
    )]
    MissingVariable {
        /// The variable name.
        name: String,
    },
    /// A key-matcher variable is empty (it would match series without the label).
    #[error(
        "template variable {{{{{name}}}}} is empty; an empty value would match every series without the label"
    )]
    EmptyKeyValue {
        /// The variable name.
        name: String,
    },
    /// A variable appears outside a double-quoted string literal.
    #[error(
        "template variable {{{{{name}}}}} at byte {offset} is outside a double-quoted string; only {{{{window}}}} and \
         {{{{by}}}} may appear there, put label values inside \"...\""
    )]
    OutsideString {
        /// The variable name.
        name: String,
        /// Byte offset in the template.
        offset: usize,
    },
    /// A variable appears in a single-quoted or backtick string (only double quotes are escaped).
    #[error(
        "template variable {{{{{name}}}}} at byte {offset} is in a '...' or `...` string; use \"...\" instead"
    )]
    WrongQuotes {
        /// The variable name.
        name: String,
        /// Byte offset in the template.
        offset: usize,
    },
    /// `{{` without a closing `}}`, or an unterminated string.
    #[error("template is malformed at byte {offset}: {what}")]
    #[strum(serialize = "MalformedTemplate")]
    Malformed {
        /// Byte offset in the template.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// One label is bound to two different variables.
    #[error(
        "label {label} is matched against both {{{{{first}}}}} and {{{{{second}}}}}; use one variable per label"
    )]
    ConflictingKey {
        /// The label.
        label: String,
        /// The first variable.
        first: String,
        /// The second variable.
        second: String,
    },
    /// With its variables given values, the template is not PromQL.
    #[error("template is not valid PromQL once its variables have values: {message}")]
    #[strum(serialize = "InvalidPromQL")]
    InvalidPromql {
        /// The PromQL parser's message.
        message: String,
    },
}

impl TemplateError {
    /// Bounded category of this error, usable as a metric label or Event reason.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// Escapes `value` for the inside of a PromQL double-quoted string.
pub fn escape_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Escapes `value` so that an RE2 regex matches exactly it (Prometheus anchors the whole regex).
pub fn escape_regex(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(
            c,
            '\\' | '.' | '+' | '*' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Formats a window as a PromQL duration (`120s`, `1500ms`).
pub fn format_window(window: Duration) -> String {
    if window.subsec_millis() == 0 {
        format!("{}s", window.as_secs())
    } else {
        format!("{}ms", window.as_millis())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Text(String),
    Window,
    By,
    /// `label="{{var}}"` rendered as a (possibly multi-value) matcher; the text before it ends
    /// with `label` and the operator has been dropped.
    KeyMatcher {
        var: String,
    },
    /// A variable inside a string literal; `regex` when the matcher operator is `=~` or `!~`.
    InString {
        var: String,
        regex: bool,
    },
}

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    source: String,
    segments: Vec<Segment>,
    /// Key label → variable, sorted by label.
    keys: BTreeMap<String, String>,
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits `text` (everything before a string literal) into (prefix, label, operator) when it ends
/// with `label <op>` and whitespace.
fn trailing_matcher(text: &str) -> Option<(usize, String, &'static str)> {
    let trimmed = text.trim_end();
    let (op, rest) = if let Some(r) = trimmed.strip_suffix("=~") {
        ("=~", r)
    } else if let Some(r) = trimmed.strip_suffix("!~") {
        ("!~", r)
    } else if let Some(r) = trimmed.strip_suffix("!=") {
        ("!=", r)
    } else if let Some(r) = trimmed.strip_suffix('=') {
        ("=", r)
    } else {
        return None;
    };
    let rest = rest.trim_end();
    let label_start = rest.rfind(|c: char| !is_label_char(c)).map_or(0, |i| i + 1);
    let label = &rest[label_start..];
    if label.is_empty() || label.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    Some((label_start, label.to_string(), op))
}

impl Template {
    /// Parses `source`. `allowed` lists the variables a value may be supplied for (the known
    /// variables plus the gate's own); `window` and `by` are always allowed.
    pub fn parse(source: &str, allowed: &BTreeSet<String>) -> Result<Self, TemplateError> {
        let check = |name: &str| -> Result<(), TemplateError> {
            if allowed.contains(name) || ENGINE_VARIABLES.contains(&name) {
                Ok(())
            } else {
                Err(TemplateError::UnknownVariable {
                    name: name.to_string(),
                })
            }
        };
        let mut segments = Vec::new();
        let mut keys: BTreeMap<String, String> = BTreeMap::new();
        let mut text = String::new();
        let mut i = 0;
        while i < source.len() {
            let rest = &source[i..];
            if rest.starts_with("{{") {
                let (name, len) = read_var(source, i)?;
                check(&name)?;
                let engine = match name.as_str() {
                    "window" => Segment::Window,
                    "by" => Segment::By,
                    _ => return Err(TemplateError::OutsideString { name, offset: i }),
                };
                flush(&mut text, &mut segments);
                segments.push(engine);
                i += len;
                continue;
            }
            let c = rest.chars().next().unwrap_or_default();
            match c {
                '"' => {
                    let end = string_end(source, i, '"')?;
                    let matcher = trailing_matcher(&text);
                    // Whole string is one variable after `=`: a key matcher.
                    if let (Some((label_start, label, "=")), Some(name)) =
                        (matcher.clone(), whole_var(source, i + 1, end))
                    {
                        check(&name)?;
                        if ENGINE_VARIABLES.contains(&name.as_str()) {
                            return Err(TemplateError::OutsideString {
                                name,
                                offset: i + 1,
                            });
                        }
                        if let Some(existing) = keys.get(&label)
                            && *existing != name
                        {
                            return Err(TemplateError::ConflictingKey {
                                label,
                                first: existing.clone(),
                                second: name,
                            });
                        }
                        keys.insert(label.clone(), name.clone());
                        text.truncate(label_start);
                        text.push_str(&label);
                        flush(&mut text, &mut segments);
                        segments.push(Segment::KeyMatcher { var: name });
                        i = end + 1;
                        continue;
                    }
                    let regex = matches!(matcher, Some((_, _, "=~" | "!~")));
                    text.push('"');
                    let mut j = i + 1;
                    while j < end {
                        if source[j..].starts_with("{{") {
                            let (name, len) = read_var(source, j)?;
                            check(&name)?;
                            if ENGINE_VARIABLES.contains(&name.as_str()) {
                                return Err(TemplateError::OutsideString { name, offset: j });
                            }
                            flush(&mut text, &mut segments);
                            segments.push(Segment::InString { var: name, regex });
                            j += len;
                        } else {
                            let ch = source[j..].chars().next().unwrap_or_default();
                            if ch == '\\' {
                                let next = source[j + 1..].chars().next().map_or(0, char::len_utf8);
                                text.push_str(&source[j..j + 1 + next]);
                                j += 1 + next;
                            } else {
                                text.push(ch);
                                j += ch.len_utf8();
                            }
                        }
                    }
                    text.push('"');
                    i = end + 1;
                }
                '#' => {
                    // A comment runs to the end of the line and is copied verbatim: quotes and
                    // placeholders in it mean nothing to PromQL.
                    let end = source[i..].find('\n').map_or(source.len(), |n| i + n);
                    text.push_str(&source[i..end]);
                    i = end;
                }
                '\'' | '`' => {
                    let end = string_end(source, i, c)?;
                    if let Some(pos) = source[i..end].find("{{") {
                        let (name, _) = read_var(source, i + pos)?;
                        return Err(TemplateError::WrongQuotes {
                            name,
                            offset: i + pos,
                        });
                    }
                    text.push_str(&source[i..=end]);
                    i = end + 1;
                }
                _ => {
                    text.push(c);
                    i += c.len_utf8();
                }
            }
        }
        flush(&mut text, &mut segments);
        Ok(Self {
            source: source.to_string(),
            segments,
            keys,
        })
    }

    /// The template text as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Key labels and the variable each is bound to, sorted by label.
    pub fn keys(&self) -> &BTreeMap<String, String> {
        &self.keys
    }

    /// The key labels, sorted; `{{by}}` renders them joined by `, `.
    pub fn key_labels(&self) -> Vec<String> {
        self.keys.keys().cloned().collect()
    }

    /// Variables that must be the same across a batch (every variable not in a key matcher).
    pub fn constant_variables(&self) -> BTreeSet<String> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::InString { var, .. } => Some(var.clone()),
                _ => None,
            })
            .collect()
    }

    /// The key tuple of one object: the value of each key variable, in key-label order.
    pub fn key_tuple(&self, vars: &BTreeMap<String, String>) -> Result<Vec<String>, TemplateError> {
        self.keys
            .values()
            .map(|var| match vars.get(var) {
                None => Err(TemplateError::MissingVariable { name: var.clone() }),
                Some(v) if v.is_empty() => Err(TemplateError::EmptyKeyValue { name: var.clone() }),
                Some(v) => Ok(v.clone()),
            })
            .collect()
    }

    /// The values of the constant variables of one object, sorted by name.
    pub fn constants(
        &self,
        vars: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>, TemplateError> {
        self.constant_variables()
            .into_iter()
            .map(|name| match vars.get(&name) {
                Some(v) => Ok((name, v.clone())),
                None => Err(TemplateError::MissingVariable { name }),
            })
            .collect()
    }

    /// Renders the query for a batch: `tuples` are the key tuples of every object in it,
    /// `constants` the shared values of every other variable.
    pub fn render(
        &self,
        tuples: &BTreeSet<Vec<String>>,
        constants: &BTreeMap<String, String>,
        window: Duration,
    ) -> Result<String, TemplateError> {
        let key_index: BTreeMap<&str, usize> = self
            .keys
            .values()
            .enumerate()
            .map(|(i, var)| (var.as_str(), i))
            .collect();
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Text(t) => out.push_str(t),
                Segment::Window => out.push_str(&format_window(window)),
                Segment::By => out.push_str(&self.key_labels().join(", ")),
                Segment::KeyMatcher { var } => {
                    let idx = key_index[var.as_str()];
                    let values: BTreeSet<&str> = tuples.iter().map(|t| t[idx].as_str()).collect();
                    match values.len() {
                        0 => return Err(TemplateError::MissingVariable { name: var.clone() }),
                        1 => {
                            let v = values.iter().next().copied().unwrap_or_default();
                            out.push_str(&format!("=\"{}\"", escape_string(v)));
                        }
                        _ => {
                            let union: Vec<String> =
                                values.iter().map(|v| escape_regex(v)).collect();
                            out.push_str(&format!("=~\"{}\"", escape_string(&union.join("|"))));
                        }
                    }
                }
                Segment::InString { var, regex } => {
                    let value = constants
                        .get(var)
                        .ok_or_else(|| TemplateError::MissingVariable { name: var.clone() })?;
                    let value = if *regex {
                        escape_regex(value)
                    } else {
                        value.clone()
                    };
                    out.push_str(&escape_string(&value));
                }
            }
        }
        Ok(out)
    }
}

/// The value every variable is given when [`check_syntax`] renders a template.
const PLACEHOLDER: &str = "placeholder";

/// Checks, without any I/O, that `source` is PromQL once its variables have values: every
/// `{{variable}}` is given a placeholder (a string value inside its string literal, the window
/// `2m`, the grouping labels the engine derives) exactly as the engine renders it, and the result
/// is parsed by a PromQL parser. Variable placement errors come back as they would at rendering;
/// a syntax error as [`TemplateError::InvalidPromql`] with the parser's message. Every variable
/// name is accepted here: which ones an object can supply is the validation's question.
pub fn check_syntax(source: &str) -> Result<(), TemplateError> {
    let allowed: BTreeSet<String> = sluice_api::v1alpha1::gate::template_variables(source)
        .into_iter()
        .collect();
    let template = Template::parse(source, &allowed)?;
    let tuple: Vec<String> = template
        .keys()
        .values()
        .map(|_| PLACEHOLDER.to_owned())
        .collect();
    let constants: BTreeMap<String, String> = template
        .constant_variables()
        .into_iter()
        .map(|name| (name, PLACEHOLDER.to_owned()))
        .collect();
    let rendered = template.render(&[tuple].into(), &constants, Duration::from_secs(120))?;
    promql_parser::parser::parse(&rendered)
        .map(|_| ())
        .map_err(|message| TemplateError::InvalidPromql {
            message: message.trim().to_owned(),
        })
}

fn flush(text: &mut String, segments: &mut Vec<Segment>) {
    if !text.is_empty() {
        segments.push(Segment::Text(std::mem::take(text)));
    }
}

/// Reads `{{name}}` at `at`; returns the trimmed name and the byte length of the placeholder.
fn read_var(source: &str, at: usize) -> Result<(String, usize), TemplateError> {
    let after = &source[at + 2..];
    let end = after.find("}}").ok_or(TemplateError::Malformed {
        offset: at,
        what: "`{{` without `}}`",
    })?;
    let name = after[..end].trim();
    if name.is_empty() || !name.chars().all(is_label_char) {
        return Err(TemplateError::Malformed {
            offset: at,
            what: "a variable name is letters, digits and `_`",
        });
    }
    Ok((name.to_string(), end + 4))
}

/// If the string body `source[start..end]` is exactly one `{{name}}`, returns the name.
fn whole_var(source: &str, start: usize, end: usize) -> Option<String> {
    let body = &source[start..end];
    if !body.starts_with("{{") || !body.ends_with("}}") {
        return None;
    }
    let (name, len) = read_var(source, start).ok()?;
    (len == body.len()).then_some(name)
}

/// Byte index of the closing quote of the string starting at `start`.
fn string_end(source: &str, start: usize, quote: char) -> Result<usize, TemplateError> {
    let mut chars = source[start + 1..].char_indices();
    while let Some((i, c)) = chars.next() {
        if c == '\\' && quote != '`' {
            chars.next();
        } else if c == quote {
            return Ok(start + 1 + i);
        }
    }
    Err(TemplateError::Malformed {
        offset: start,
        what: "unterminated string literal",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> BTreeSet<String> {
        sluice_api::v1alpha1::gate::KNOWN_VARIABLES
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn render_one(source: &str, values: &[(&str, &str)]) -> Result<String, TemplateError> {
        let t = Template::parse(source, &allowed())?;
        let v = vars(values);
        let tuple = t.key_tuple(&v)?;
        let constants: BTreeMap<String, String> = t.constants(&v)?.into_iter().collect();
        t.render(&[tuple].into(), &constants, Duration::from_secs(120))
    }

    /// Undoes `escape_string` the way the PromQL lexer reads a double-quoted string.
    fn unescape(s: &str) -> String {
        let mut out = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some('t') => out.push('\t'),
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap());
                }
                Some(other) => out.push(other),
                None => {}
            }
        }
        out
    }

    #[test]
    fn syntax_is_checked_with_variables_given_values() {
        let good = [
            r#"sum by ({{by}}) (rate(istio_requests_total{destination_service_name="{{canaryService}}", response_code=~"5.."}[{{window}}]))"#,
            r#"sum(rate(x{a=~"{{namespace}}-.*", b!="{{route}}"}[{{window}}])) / sum(rate(x[5m]))"#,
            "# a comment with \"quotes\" and {{by}}\nsum(up)",
            r#"histogram_quantile(0.99, sum by (le, {{by}}) (rate(b_bucket{s="{{canaryService}}"}[{{window}}])))"#,
        ];
        for q in good {
            assert_eq!(check_syntax(q), Ok(()), "{q}");
        }
        let bad = [
            (
                r#"sum(rate(x{a="{{canaryService}}"}[{{window}}])"#,
                "unclosed left parenthesis",
            ),
            (r#"rate(x{a="{{canaryService}}"})"#, "expected type matrix"),
            ("sum(up) +", "invalid promql query"),
        ];
        for (q, want) in bad {
            let err = check_syntax(q).expect_err(q).to_string();
            assert!(
                err.starts_with("template is not valid PromQL once its variables have values: "),
                "{q}: {err}"
            );
            assert!(err.contains(want), "{q}: {err}");
            assert_eq!(check_syntax(q).unwrap_err().category(), "InvalidPromQL");
        }
        // Placement errors are reported before the syntax.
        assert!(matches!(
            check_syntax("sum(x{a={{route}}})"),
            Err(TemplateError::OutsideString { .. })
        ));
    }

    #[test]
    fn escaping_keeps_values_inside_the_string() {
        let cases = [
            "plain",
            "a\"b",
            "back\\slash",
            "x\"} or vector(1) #",
            "line\nbreak",
            "tab\tand\u{1}ctl",
            "ünï",
        ];
        for value in cases {
            let escaped = escape_string(value);
            // No unescaped quote can end the literal early.
            let mut prev_backslashes = 0;
            for c in escaped.chars() {
                if c == '"' {
                    assert_eq!(prev_backslashes % 2, 1, "unescaped quote in {escaped:?}");
                }
                prev_backslashes = if c == '\\' { prev_backslashes + 1 } else { 0 };
            }
            assert!(!escaped.contains('\n'));
            assert_eq!(unescape(&escaped), value, "round trip of {value:?}");
        }
    }

    #[test]
    fn regex_escaping_makes_metacharacters_literal() {
        let cases = [
            ("checkout", "checkout"),
            (".*", "\\.\\*"),
            ("a|b", "a\\|b"),
            ("v1.2(x)", "v1\\.2\\(x\\)"),
        ];
        for (value, want) in cases {
            assert_eq!(escape_regex(value), want);
        }
    }

    #[test]
    fn render_table() {
        let q = r#"sum by ({{by}}) (rate(m{cluster="{{cluster}}", svc="{{service}}", code=~"5.."}[{{window}}]))"#;
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Result<&'a str, &'a str>);
        let cases: &[Case] = &[
            (
                q,
                &[("cluster", "c1"), ("service", "checkout")],
                Ok(
                    r#"sum by (cluster, svc) (rate(m{cluster="c1", svc="checkout", code=~"5.."}[120s]))"#,
                ),
            ),
            // Injection attempt stays a literal label value.
            (
                q,
                &[("cluster", "c1"), ("service", "x\"} or vector(1) #")],
                Ok(
                    r#"sum by (cluster, svc) (rate(m{cluster="c1", svc="x\"} or vector(1) #", code=~"5.."}[120s]))"#,
                ),
            ),
            (q, &[("cluster", "c1")], Err("MissingVariable")),
            (
                q,
                &[("cluster", "c1"), ("service", "")],
                Err("EmptyKeyValue"),
            ),
            (r#"m{a="{{nope}}"}"#, &[], Err("UnknownVariable")),
            (
                r#"m{a="x"} > {{service}}"#,
                &[("service", "1")],
                Err("OutsideString"),
            ),
            (
                r#"m{a='{{service}}'}"#,
                &[("service", "1")],
                Err("WrongQuotes"),
            ),
            (
                r#"m{a="{{service"}"#,
                &[("service", "1")],
                Err("MalformedTemplate"),
            ),
            (r#"m{a="unterminated}"#, &[], Err("MalformedTemplate")),
            (
                r#"m{a="{{service}}", a="{{cluster}}"}"#,
                &[],
                Err("ConflictingKey"),
            ),
            // Constant inside a regex string: regex-escaped, then string-escaped.
            (
                r#"m{svc=~"{{service}}-.*"}"#,
                &[("service", "a.b")],
                Ok(r#"m{svc=~"a\\.b-.*"}"#),
            ),
            // Constant inside a plain string (not the whole literal).
            (
                r#"m{svc="{{service}}-canary"}"#,
                &[("service", "a\"")],
                Ok(r#"m{svc="a\"-canary"}"#),
            ),
            // `!=` with a whole-string variable is not a key matcher.
            (
                r#"m{svc!="{{service}}"}"#,
                &[("service", "a")],
                Ok(r#"m{svc!="a"}"#),
            ),
            (r#"m{a="{{window}}"}"#, &[], Err("OutsideString")),
            (
                "sum(m) # don't {{service}}\n+ m{a=\"{{service}}\"}",
                &[("service", "x")],
                Ok("sum(m) # don't {{service}}\n+ m{a=\"x\"}"),
            ),
        ];
        for (source, values, want) in cases {
            let got = render_one(source, values);
            match (got, want) {
                (Ok(q), Ok(w)) => assert_eq!(q, *w, "{source}"),
                (Err(e), Err(cat)) => assert_eq!(e.category(), *cat, "{source}: {e}"),
                (got, want) => panic!("{source}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn batch_render_unions_key_values_and_shares_constants() {
        let t = Template::parse(
            r#"sum by ({{by}}) (increase(m{cluster="{{cluster}}", svc="{{service}}", ns="{{namespace}}"}[{{window}}]))"#,
            &allowed(),
        )
        .unwrap();
        assert_eq!(t.key_labels(), ["cluster", "ns", "svc"]);
        let tuples: BTreeSet<Vec<String>> = [
            vec!["c1".into(), "shop".into(), "a".into()],
            vec!["c1".into(), "shop".into(), "b.c".into()],
            vec!["c2".into(), "shop".into(), "a".into()],
        ]
        .into();
        let q = t
            .render(&tuples, &BTreeMap::new(), Duration::from_millis(1500))
            .unwrap();
        assert_eq!(
            q,
            r#"sum by (cluster, ns, svc) (increase(m{cluster=~"c1|c2", svc=~"a|b\\.c", ns="shop"}[1500ms]))"#
        );
    }

    #[test]
    fn window_formatting() {
        assert_eq!(format_window(Duration::from_secs(120)), "120s");
        assert_eq!(format_window(Duration::from_millis(2500)), "2500ms");
    }
}
