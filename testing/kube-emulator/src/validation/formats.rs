//! String formats: the OpenAPI `format` values kube-apiserver checks on custom resources, and the
//! named formats of the CEL format library.
//!
//! Owns: deciding whether a string has a format, with the apiserver's wording. Must never: reject
//! a format it does not know (unknown formats are accepted, as the apiserver does).

use std::sync::LazyLock;

use regex::Regex;

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap_or_else(|e| panic!("built-in format pattern {pattern:?}: {e}"))
}

static DNS1123_LABEL: LazyLock<Regex> = LazyLock::new(|| re("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"));
static DNS1123_SUBDOMAIN: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"));
static DNS1035_LABEL: LazyLock<Regex> = LazyLock::new(|| re("^[a-z]([-a-z0-9]*[a-z0-9])?$"));
static QUALIFIED_NAME: LazyLock<Regex> =
    LazyLock::new(|| re("^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"));
static UUID: LazyLock<Regex> =
    LazyLock::new(|| re("^(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"));
static DATE: LazyLock<Regex> = LazyLock::new(|| re(r"^\d{4}-\d{2}-\d{2}$"));
static BASE64: LazyLock<Regex> =
    LazyLock::new(|| re("^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"));
static HOSTNAME: LazyLock<Regex> = LazyLock::new(|| {
    re(r"^[a-zA-Z0-9]([-a-zA-Z0-9]{0,62})?(\.[a-zA-Z0-9]([-a-zA-Z0-9]{0,62})?)*\.?$")
});
static GO_DURATION: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[-+]?(0|([0-9]*(\.[0-9]*)?(ns|us|µs|μs|ms|s|m|h))+)$"));

fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !DNS1123_LABEL.is_match(s) {
        errs.push("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_owned());
    }
    errs
}

fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_owned());
    }
    if !DNS1123_SUBDOMAIN.is_match(s) {
        errs.push("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_owned());
    }
    errs
}

fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !DNS1035_LABEL.is_match(s) {
        errs.push("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_owned());
    }
    errs
}

fn qualified_name(s: &str) -> Vec<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let mut errs = Vec::new();
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".to_owned());
        } else {
            errs.extend(
                dns1123_subdomain(p)
                    .into_iter()
                    .map(|e| format!("prefix part {e}")),
            );
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else {
        if name.len() > 63 {
            errs.push("name part must be no more than 63 characters".to_owned());
        }
        if !QUALIFIED_NAME.is_match(name) {
            errs.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_owned());
        }
    }
    errs
}

fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !s.is_empty() && !QUALIFIED_NAME.is_match(s) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_owned());
    }
    errs
}

/// A prefix (as used by `generateName`) may end in `-`: validate it with one appended letter.
fn prefix_of(f: fn(&str) -> Vec<String>, s: &str) -> Vec<String> {
    let probe = if s.ends_with('-') {
        format!("{s}a")
    } else {
        s.to_owned()
    };
    f(&probe)
}

fn is_datetime(s: &str) -> bool {
    s.parse::<jiff::Timestamp>().is_ok()
}

fn is_date(s: &str) -> bool {
    DATE.is_match(s) && s.parse::<jiff::civil::Date>().is_ok()
}

/// Errors of the CEL format library's named format `name` for `s`; empty when valid.
pub(crate) fn validate_named(name: &str, s: &str) -> Vec<String> {
    let single = |ok: bool, what: &str| {
        if ok {
            Vec::new()
        } else {
            vec![format!("does not match the format {what}")]
        }
    };
    match name {
        "dns1123Label" => dns1123_label(s),
        "dns1123Subdomain" => dns1123_subdomain(s),
        "dns1035Label" => dns1035_label(s),
        "qualifiedName" => qualified_name(s),
        "dns1123LabelPrefix" => prefix_of(dns1123_label, s),
        "dns1123SubdomainPrefix" => prefix_of(dns1123_subdomain, s),
        "dns1035LabelPrefix" => prefix_of(dns1035_label, s),
        "labelValue" => label_value(s),
        "uri" => single(super::cel_library::is_url(s), "uri"),
        "uuid" => single(UUID.is_match(s), "uuid"),
        "byte" => single(BASE64.is_match(s), "byte"),
        "date" => single(is_date(s), "date"),
        "datetime" => single(is_datetime(s), "datetime"),
        _ => Vec::new(),
    }
}

/// Whether `s` has the OpenAPI `format`; unknown formats pass, as kube-apiserver accepts them.
pub(crate) fn has_openapi_format(format: &str, s: &str) -> bool {
    match format {
        "date-time" | "datetime" => is_datetime(s),
        "date" => is_date(s),
        "uuid" | "uuid3" | "uuid4" | "uuid5" => UUID.is_match(s),
        "byte" => BASE64.is_match(s),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s
            .split_once('/')
            .is_some_and(|(a, p)| a.parse::<std::net::IpAddr>().is_ok() && p.parse::<u8>().is_ok()),
        "hostname" => s.len() <= 255 && HOSTNAME.is_match(s),
        "duration" => GO_DURATION.is_match(s),
        "uri" => super::cel_library::is_url(s),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_formats() {
        let cases = [
            ("date-time", "2024-01-02T03:04:05Z", true),
            ("date-time", "2024-01-02", false),
            ("date", "2024-01-02", true),
            ("date", "2024-13-02", false),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid", "nope", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "a", false),
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "::1", false),
            ("hostname", "example.com", true),
            ("hostname", "-bad", false),
            ("duration", "1h30m", true),
            ("duration", "soon", false),
            ("int32", "anything", true),
        ];
        for (format, s, want) in cases {
            assert_eq!(has_openapi_format(format, s), want, "{format} {s}");
        }
    }

    #[test]
    fn named_formats() {
        assert!(validate_named("dns1123Label", "my-name").is_empty());
        assert_eq!(validate_named("dns1123Label", "My_Name").len(), 1);
        assert_eq!(validate_named("dns1123Label", &"a".repeat(64)).len(), 1);
        assert!(validate_named("qualifiedName", "sluice.dev/owner").is_empty());
        assert!(!validate_named("qualifiedName", "/owner").is_empty());
        assert!(validate_named("labelValue", "").is_empty());
        assert!(validate_named("dns1123LabelPrefix", "web-").is_empty());
    }
}
