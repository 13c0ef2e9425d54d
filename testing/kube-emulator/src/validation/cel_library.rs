//! The CEL environment the emulator evaluates `x-kubernetes-validations` and admission policies
//! in: the standard library, the strings and lists extensions, and the Kubernetes libraries
//! (lists, regex, URLs, quantities, sets, IP/CIDR, format), plus the conversion of JSON objects
//! into CEL values (with Kubernetes property-name escaping).
//!
//! Owns: which functions exist and what they do. Must never: evaluate a function it does not
//! know as passing — [`unknown_functions`] lets the compiler refuse such a rule at load.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use cel::common::functions::Function;
use cel::common::types::{DYN_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::objects::{Key, Map, Opaque, OptionalValue};
use cel::{Env, ExecutionError, Value};

use super::quantity::Quantity;

/// The shared environment, built once per process.
pub(crate) fn env() -> Arc<Env> {
    static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(build_env()));
    ENV.clone()
}

/// Wraps a `fn(&[Value]) -> Result<Value, ExecutionError>` as a CEL overload.
macro_rules! overload {
    ($f:path) => {{
        fn adapter<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            let values = args
                .iter()
                .map(|a| Value::try_from(a.as_ref()))
                .collect::<Result<Vec<_>, _>>()?;
            let out: Value = $f(&values)?;
            let boxed: Box<dyn Val> = out.try_into()?;
            Ok(CowVal::Owned(boxed))
        }
        adapter as Function
    }};
}

/// Every function name a rule may call, operators excluded. Used to refuse unknown functions at
/// load time, since the interpreter itself only notices them when a call is reached.
const KNOWN_FUNCTIONS: &[&str] = &[
    // standard library
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "type",
    "dyn",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    // optionals
    "optional.of",
    "optional.none",
    "optional.ofNonZeroValue",
    "hasValue",
    "value",
    "orValue",
    "or", // strings extension
    "charAt",
    "indexOf",
    "lastIndexOf",
    "join",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "substring",
    "format",
    "strings.quote",
    "reverse",
    // lists extension
    "slice",
    "flatten",
    "distinct",
    "sort",
    "sortBy",
    "lists.range",
    // encoders
    "base64.encode",
    "base64.decode",
    // Kubernetes lists library
    "isSorted",
    "sum",
    "min",
    "max",
    // Kubernetes regex library
    "find",
    "findAll",
    // Kubernetes URL library
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
    // Kubernetes quantity library
    "quantity",
    "isQuantity",
    "isInteger",
    "asInteger",
    "asApproximateFloat",
    "sign",
    "add",
    "sub",
    "isLessThan",
    "isGreaterThan",
    "compareTo",
    // sets extension
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    // Kubernetes IP and CIDR libraries
    "ip",
    "isIP",
    "ip.isCanonical",
    "family",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "cidr",
    "isCIDR",
    "containsIP",
    "containsCIDR",
    "prefixLength",
    "masked",
    // Kubernetes format library
    "format.dns1123Label",
    "format.dns1123Subdomain",
    "format.dns1035Label",
    "format.qualifiedName",
    "format.dns1123LabelPrefix",
    "format.dns1123SubdomainPrefix",
    "format.dns1035LabelPrefix",
    "format.labelValue",
    "format.uri",
    "format.uuid",
    "format.byte",
    "format.date",
    "format.datetime",
    "format.named",
    "validate",
];

/// The function names `expr` calls that the environment does not provide, operators excluded.
pub(crate) fn unknown_functions(program: &cel::Program) -> Vec<String> {
    // A qualified call (`sets.equivalent(a, b)`) is recorded under its last name.
    let known: BTreeSet<&str> = KNOWN_FUNCTIONS
        .iter()
        .map(|f| f.rsplit('.').next().unwrap_or(f))
        .collect();
    let mut unknown: Vec<String> = program
        .references()
        .functions()
        .into_iter()
        .filter(|f| {
            !(f.starts_with('_') || f.ends_with('_') || f.starts_with('@') || known.contains(f))
        })
        .map(str::to_owned)
        .collect();
    unknown.sort();
    unknown
}

fn build_env() -> Env {
    let mut env = Env::stdlib();
    let add = |r: Result<(), cel::DeclarationError>| {
        if let Err(e) = r {
            // Every declaration below is fixed at compile time; a clash is a programming error
            // caught by the unit tests, not a runtime condition.
            panic!("CEL library declaration clash: {e}");
        }
    };
    add(env.add_extension(cel::extensions::strings));
    add(env.add_extension(cel::extensions::lists));
    add(env.add_extension(cel::extensions::encoders));

    // Kubernetes lists library.
    add(env.add_member_overload(
        "isSorted",
        "k8s_list_is_sorted",
        LIST_TYPE,
        vec![],
        overload!(list_is_sorted),
    ));
    add(env.add_member_overload(
        "sum",
        "k8s_list_sum",
        LIST_TYPE,
        vec![],
        overload!(list_sum),
    ));
    add(env.add_member_overload(
        "min",
        "k8s_list_min",
        LIST_TYPE,
        vec![],
        overload!(list_min),
    ));
    add(env.add_member_overload(
        "max",
        "k8s_list_max",
        LIST_TYPE,
        vec![],
        overload!(list_max),
    ));
    add(env.add_member_overload(
        "indexOf",
        "k8s_list_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        overload!(list_index_of),
    ));
    add(env.add_member_overload(
        "lastIndexOf",
        "k8s_list_last_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        overload!(list_last_index_of),
    ));

    // Kubernetes regex library.
    add(env.add_member_overload(
        "find",
        "k8s_string_find",
        STRING_TYPE,
        vec![STRING_TYPE],
        overload!(regex_find),
    ));
    add(env.add_member_overload(
        "findAll",
        "k8s_string_find_all",
        STRING_TYPE,
        vec![STRING_TYPE],
        overload!(regex_find_all),
    ));
    add(env.add_member_overload(
        "findAll",
        "k8s_string_find_all_n",
        STRING_TYPE,
        vec![STRING_TYPE, DYN_TYPE],
        overload!(regex_find_all),
    ));

    // Kubernetes URL library.
    add(env.add_overload("url", "k8s_url", vec![STRING_TYPE], overload!(url_new)));
    add(env.add_overload("isURL", "k8s_is_url", vec![STRING_TYPE], overload!(url_is)));
    for (name, f) in [
        ("getScheme", overload!(url_scheme)),
        ("getHost", overload!(url_host)),
        ("getHostname", overload!(url_hostname)),
        ("getPort", overload!(url_port)),
        ("getEscapedPath", overload!(url_path)),
        ("getQuery", overload!(url_query)),
    ] {
        add(env.add_member_overload(name, &format!("k8s_url_{name}"), DYN_TYPE, vec![], f));
    }

    // Kubernetes quantity library.
    add(env.add_overload(
        "quantity",
        "k8s_quantity",
        vec![STRING_TYPE],
        overload!(quantity_new),
    ));
    add(env.add_overload(
        "isQuantity",
        "k8s_is_quantity",
        vec![STRING_TYPE],
        overload!(quantity_is),
    ));
    for (name, f) in [
        ("isInteger", overload!(quantity_is_integer)),
        ("asInteger", overload!(quantity_as_integer)),
        ("asApproximateFloat", overload!(quantity_as_float)),
        ("sign", overload!(quantity_sign)),
    ] {
        add(env.add_member_overload(name, &format!("k8s_quantity_{name}"), DYN_TYPE, vec![], f));
    }
    for (name, f) in [
        ("add", overload!(quantity_add)),
        ("sub", overload!(quantity_sub)),
        ("isLessThan", overload!(quantity_less)),
        ("isGreaterThan", overload!(quantity_greater)),
        ("compareTo", overload!(quantity_compare)),
    ] {
        add(env.add_member_overload(
            name,
            &format!("k8s_quantity_{name}"),
            DYN_TYPE,
            vec![DYN_TYPE],
            f,
        ));
    }

    // sets extension.
    add(env.add_overload(
        "sets.contains",
        "sets_contains",
        vec![LIST_TYPE, LIST_TYPE],
        overload!(sets_contains),
    ));
    add(env.add_overload(
        "sets.equivalent",
        "sets_equivalent",
        vec![LIST_TYPE, LIST_TYPE],
        overload!(sets_equivalent),
    ));
    add(env.add_overload(
        "sets.intersects",
        "sets_intersects",
        vec![LIST_TYPE, LIST_TYPE],
        overload!(sets_intersects),
    ));

    // Kubernetes IP and CIDR libraries.
    add(env.add_overload("ip", "k8s_ip", vec![STRING_TYPE], overload!(ip_new)));
    add(env.add_overload("isIP", "k8s_is_ip", vec![STRING_TYPE], overload!(ip_is)));
    add(env.add_overload(
        "ip.isCanonical",
        "k8s_ip_is_canonical",
        vec![STRING_TYPE],
        overload!(ip_is_canonical),
    ));
    add(env.add_overload("cidr", "k8s_cidr", vec![STRING_TYPE], overload!(cidr_new)));
    add(env.add_overload(
        "isCIDR",
        "k8s_is_cidr",
        vec![STRING_TYPE],
        overload!(cidr_is),
    ));
    for (name, f) in [
        ("family", overload!(ip_family)),
        ("isUnspecified", overload!(ip_is_unspecified)),
        ("isLoopback", overload!(ip_is_loopback)),
        (
            "isLinkLocalMulticast",
            overload!(ip_is_link_local_multicast),
        ),
        ("isLinkLocalUnicast", overload!(ip_is_link_local_unicast)),
        ("isGlobalUnicast", overload!(ip_is_global_unicast)),
        ("prefixLength", overload!(cidr_prefix_length)),
        ("masked", overload!(cidr_masked)),
        ("ip", overload!(cidr_ip)),
    ] {
        add(env.add_member_overload(name, &format!("k8s_net_{name}"), DYN_TYPE, vec![], f));
    }
    add(env.add_member_overload(
        "containsIP",
        "k8s_cidr_contains_ip",
        DYN_TYPE,
        vec![DYN_TYPE],
        overload!(cidr_contains_ip),
    ));
    add(env.add_member_overload(
        "containsCIDR",
        "k8s_cidr_contains_cidr",
        DYN_TYPE,
        vec![DYN_TYPE],
        overload!(cidr_contains_cidr),
    ));
    add(env.add_overload(
        "string",
        "k8s_net_string",
        vec![DYN_TYPE],
        overload!(net_string),
    ));

    // Kubernetes format library.
    for name in FORMAT_NAMES {
        add(env.add_overload(
            &format!("format.{name}"),
            &format!("k8s_format_{name}"),
            vec![],
            format_fn(name),
        ));
    }
    add(env.add_overload(
        "format.named",
        "k8s_format_named",
        vec![STRING_TYPE],
        overload!(format_named),
    ));
    add(env.add_member_overload(
        "validate",
        "k8s_format_validate",
        DYN_TYPE,
        vec![STRING_TYPE],
        overload!(format_validate),
    ));
    env
}

// ---------------------------------------------------------------------------------------------
// helpers

fn err(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn arg_str<'a>(args: &'a [Value], i: usize, function: &str) -> Result<&'a str, ExecutionError> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s.as_str()),
        other => Err(err(
            function,
            format!("expected a string argument, got {other:?}"),
        )),
    }
}

fn arg_list<'a>(
    args: &'a [Value],
    i: usize,
    function: &str,
) -> Result<&'a [Value], ExecutionError> {
    match args.get(i) {
        Some(Value::List(l)) => Ok(l.as_slice()),
        other => Err(err(
            function,
            format!("expected a list argument, got {other:?}"),
        )),
    }
}

fn opaque<'a, T: 'static>(
    args: &'a [Value],
    i: usize,
    function: &str,
) -> Result<&'a T, ExecutionError> {
    match args.get(i) {
        Some(Value::Opaque(o)) => o.downcast_ref::<T>().ok_or_else(|| {
            err(
                function,
                format!("not applicable to {}", o.runtime_type_name()),
            )
        }),
        other => Err(err(function, format!("not applicable to {other:?}"))),
    }
}

fn optional_of(v: Value) -> Value {
    Value::Opaque(Arc::new(OptionalValue::of(v)))
}

fn optional_none() -> Value {
    Value::Opaque(Arc::new(OptionalValue::none()))
}

fn string_list(items: impl IntoIterator<Item = String>) -> Value {
    Value::List(Arc::new(
        items
            .into_iter()
            .map(|s| Value::String(Arc::new(s)))
            .collect(),
    ))
}

/// Orders two comparable CEL values (numbers, strings, bools, durations, timestamps).
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    use Value::*;
    match (a, b) {
        (Int(x), Int(y)) => x.partial_cmp(y),
        (UInt(x), UInt(y)) => x.partial_cmp(y),
        (Float(x), Float(y)) => x.partial_cmp(y),
        (Int(x), Float(y)) => (*x as f64).partial_cmp(y),
        (Float(x), Int(y)) => x.partial_cmp(&(*y as f64)),
        (Int(x), UInt(y)) => (*x as i128).partial_cmp(&(*y as i128)),
        (UInt(x), Int(y)) => (*x as i128).partial_cmp(&(*y as i128)),
        (String(x), String(y)) => x.partial_cmp(y),
        (Bool(x), Bool(y)) => x.partial_cmp(y),
        (Bytes(x), Bytes(y)) => x.partial_cmp(y),
        (Duration(x), Duration(y)) => x.partial_cmp(y),
        (Timestamp(x), Timestamp(y)) => x.partial_cmp(y),
        _ => None,
    }
}

/// CEL equality with numeric cross-type comparison, as `==` does.
fn cel_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::List(x), Value::List(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| cel_equal(p, q))
        }
        (Value::Map(x), Value::Map(y)) => {
            x.map.len() == y.map.len()
                && x.map
                    .iter()
                    .all(|(k, v)| y.map.get(k).is_some_and(|w| cel_equal(v, w)))
        }
        _ => match compare(a, b) {
            Some(o) => o == std::cmp::Ordering::Equal,
            None => a == b,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// lists

fn list_is_sorted(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = arg_list(args, 0, "isSorted")?;
    for w in l.windows(2) {
        match compare(&w[0], &w[1]) {
            Some(std::cmp::Ordering::Greater) => return Ok(Value::Bool(false)),
            Some(_) => {}
            None => return Err(err("isSorted", "list elements are not comparable")),
        }
    }
    Ok(Value::Bool(true))
}

fn list_sum(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = arg_list(args, 0, "sum")?;
    let mut acc: Option<Value> = None;
    for v in l {
        acc = Some(match (acc, v) {
            (None, v) => v.clone(),
            (Some(Value::Int(a)), Value::Int(b)) => Value::Int(
                a.checked_add(*b)
                    .ok_or_else(|| err("sum", "integer overflow"))?,
            ),
            (Some(Value::UInt(a)), Value::UInt(b)) => Value::UInt(
                a.checked_add(*b)
                    .ok_or_else(|| err("sum", "integer overflow"))?,
            ),
            (Some(Value::Float(a)), Value::Float(b)) => Value::Float(a + b),
            (Some(Value::Duration(a)), Value::Duration(b)) => Value::Duration(a + *b),
            (Some(a), b) => return Err(err("sum", format!("cannot add {a:?} and {b:?}"))),
        });
    }
    Ok(acc.unwrap_or(Value::Int(0)))
}

fn list_extreme(
    args: &[Value],
    function: &str,
    want: std::cmp::Ordering,
) -> Result<Value, ExecutionError> {
    let l = arg_list(args, 0, function)?;
    let mut best: Option<&Value> = None;
    for v in l {
        best = Some(match best {
            None => v,
            Some(b) => match compare(v, b) {
                Some(o) if o == want => v,
                Some(_) => b,
                None => return Err(err(function, "list elements are not comparable")),
            },
        });
    }
    best.cloned()
        .ok_or_else(|| err(function, "called on an empty list"))
}

fn list_min(args: &[Value]) -> Result<Value, ExecutionError> {
    list_extreme(args, "min", std::cmp::Ordering::Less)
}

fn list_max(args: &[Value]) -> Result<Value, ExecutionError> {
    list_extreme(args, "max", std::cmp::Ordering::Greater)
}

fn list_index_of(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = arg_list(args, 0, "indexOf")?;
    let needle = &args[1];
    Ok(Value::Int(
        l.iter()
            .position(|v| cel_equal(v, needle))
            .map_or(-1, |i| i as i64),
    ))
}

fn list_last_index_of(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = arg_list(args, 0, "lastIndexOf")?;
    let needle = &args[1];
    Ok(Value::Int(
        l.iter()
            .rposition(|v| cel_equal(v, needle))
            .map_or(-1, |i| i as i64),
    ))
}

// ---------------------------------------------------------------------------------------------
// regex

fn compile_regex(function: &str, pattern: &str) -> Result<regex::Regex, ExecutionError> {
    regex::Regex::new(pattern)
        .map_err(|e| err(function, format!("invalid regular expression: {e}")))
}

fn regex_find(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = arg_str(args, 0, "find")?;
    let re = compile_regex("find", arg_str(args, 1, "find")?)?;
    Ok(Value::String(Arc::new(
        re.find(s)
            .map(|m| m.as_str().to_owned())
            .unwrap_or_default(),
    )))
}

fn regex_find_all(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = arg_str(args, 0, "findAll")?;
    let re = compile_regex("findAll", arg_str(args, 1, "findAll")?)?;
    let limit = match args.get(2) {
        None => usize::MAX,
        Some(Value::Int(n)) if *n < 0 => usize::MAX,
        Some(Value::Int(n)) => *n as usize,
        Some(other) => {
            return Err(err(
                "findAll",
                format!("expected an int limit, got {other:?}"),
            ));
        }
    };
    Ok(string_list(
        re.find_iter(s).take(limit).map(|m| m.as_str().to_owned()),
    ))
}

// ---------------------------------------------------------------------------------------------
// URLs

/// A parsed URL, as the Kubernetes URL library exposes it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CelUrl {
    scheme: String,
    host: String,
    path: String,
    query: String,
}

impl Opaque for CelUrl {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.URL"
    }
}

/// Parses an absolute URI or an absolute path, as Go's `url.ParseRequestURI` accepts them.
fn parse_url(s: &str) -> Option<CelUrl> {
    if s.is_empty() || s.chars().any(|c| c.is_control() || c == ' ') {
        return None;
    }
    let (rest, query) = match s.split_once('?') {
        Some((r, q)) => (r, q.to_owned()),
        None => (s, String::new()),
    };
    if rest.starts_with('/') {
        return Some(CelUrl {
            scheme: String::new(),
            host: String::new(),
            path: rest.to_owned(),
            query,
        });
    }
    let (scheme, after) = rest.split_once(':')?;
    let mut chars = scheme.chars();
    if !chars.next()?.is_ascii_alphabetic()
        || !chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return None;
    }
    if let Some(auth_path) = after.strip_prefix("//") {
        let (authority, path) = match auth_path.find('/') {
            Some(i) => (&auth_path[..i], &auth_path[i..]),
            None => (auth_path, ""),
        };
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if host.starts_with('[') && !host.contains(']') {
            return None;
        }
        return Some(CelUrl {
            scheme: scheme.to_owned(),
            host: host.to_owned(),
            path: path.to_owned(),
            query,
        });
    }
    if after.is_empty() {
        return None;
    }
    Some(CelUrl {
        scheme: scheme.to_owned(),
        host: String::new(),
        path: after.to_owned(),
        query,
    })
}

/// Whether `s` is an absolute URI or an absolute path (the `isURL` function).
pub(crate) fn is_url(s: &str) -> bool {
    parse_url(s).is_some()
}

fn url_new(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = arg_str(args, 0, "url")?;
    parse_url(s)
        .map(|u| Value::Opaque(Arc::new(u)))
        .ok_or_else(|| {
            err(
                "url",
                format!("URL parse error during conversion from string: {s:?}"),
            )
        })
}

fn url_is(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(parse_url(arg_str(args, 0, "isURL")?).is_some()))
}

fn split_host_port(host: &str) -> (String, String) {
    if let Some(rest) = host.strip_prefix('[')
        && let Some((h, after)) = rest.split_once(']')
    {
        return (
            h.to_owned(),
            after.strip_prefix(':').unwrap_or("").to_owned(),
        );
    }
    match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h.to_owned(), p.to_owned()),
        _ => (host.to_owned(), String::new()),
    }
}

fn url_scheme(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::String(Arc::new(
        opaque::<CelUrl>(args, 0, "getScheme")?.scheme.clone(),
    )))
}

fn url_host(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::String(Arc::new(
        opaque::<CelUrl>(args, 0, "getHost")?.host.clone(),
    )))
}

fn url_hostname(args: &[Value]) -> Result<Value, ExecutionError> {
    let u = opaque::<CelUrl>(args, 0, "getHostname")?;
    Ok(Value::String(Arc::new(split_host_port(&u.host).0)))
}

fn url_port(args: &[Value]) -> Result<Value, ExecutionError> {
    let u = opaque::<CelUrl>(args, 0, "getPort")?;
    Ok(Value::String(Arc::new(split_host_port(&u.host).1)))
}

fn url_path(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::String(Arc::new(
        opaque::<CelUrl>(args, 0, "getEscapedPath")?.path.clone(),
    )))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn url_query(args: &[Value]) -> Result<Value, ExecutionError> {
    let u = opaque::<CelUrl>(args, 0, "getQuery")?;
    let mut out: HashMap<Key, Vec<Value>> = HashMap::new();
    for pair in u.query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.entry(Key::String(Arc::new(percent_decode(k))))
            .or_default()
            .push(Value::String(Arc::new(percent_decode(v))));
    }
    let map = out
        .into_iter()
        .map(|(k, v)| (k, Value::List(Arc::new(v))))
        .collect();
    Ok(Value::Map(Map { map: Arc::new(map) }))
}

// ---------------------------------------------------------------------------------------------
// quantities

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

fn quantity_new(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = arg_str(args, 0, "quantity")?;
    Quantity::parse(s)
        .map(|q| Value::Opaque(Arc::new(q)))
        .map_err(|e| err("quantity", format!("{s:?}: {e}")))
}

fn quantity_is(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        Quantity::parse(arg_str(args, 0, "isQuantity")?).is_ok(),
    ))
}

fn quantity_is_integer(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        opaque::<Quantity>(args, 0, "isInteger")?.as_i64().is_some(),
    ))
}

fn quantity_as_integer(args: &[Value]) -> Result<Value, ExecutionError> {
    let q = opaque::<Quantity>(args, 0, "asInteger")?;
    q.as_i64().map(Value::Int).ok_or_else(|| {
        err(
            "asInteger",
            "cannot convert value to integer: not an integer or out of range",
        )
    })
}

fn quantity_as_float(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Float(
        opaque::<Quantity>(args, 0, "asApproximateFloat")?.as_f64(),
    ))
}

fn quantity_sign(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(opaque::<Quantity>(args, 0, "sign")?.sign()))
}

fn quantity_operand(args: &[Value], function: &str) -> Result<Quantity, ExecutionError> {
    match args.get(1) {
        Some(Value::Int(i)) => Ok(Quantity::from_i64(*i)),
        _ => opaque::<Quantity>(args, 1, function).cloned(),
    }
}

fn quantity_add(args: &[Value]) -> Result<Value, ExecutionError> {
    let a = opaque::<Quantity>(args, 0, "add")?;
    let b = quantity_operand(args, "add")?;
    a.add(&b)
        .map(|q| Value::Opaque(Arc::new(q)))
        .ok_or_else(|| err("add", "overflow"))
}

fn quantity_sub(args: &[Value]) -> Result<Value, ExecutionError> {
    let a = opaque::<Quantity>(args, 0, "sub")?;
    let b = quantity_operand(args, "sub")?.negate();
    a.add(&b)
        .map(|q| Value::Opaque(Arc::new(q)))
        .ok_or_else(|| err("sub", "overflow"))
}

fn quantity_cmp(args: &[Value], function: &str) -> Result<std::cmp::Ordering, ExecutionError> {
    let a = opaque::<Quantity>(args, 0, function)?;
    let b = opaque::<Quantity>(args, 1, function)?;
    Ok(a.cmp_value(b))
}

fn quantity_less(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(quantity_cmp(args, "isLessThan")?.is_lt()))
}

fn quantity_greater(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(quantity_cmp(args, "isGreaterThan")?.is_gt()))
}

fn quantity_compare(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(quantity_cmp(args, "compareTo")? as i64))
}

// ---------------------------------------------------------------------------------------------
// sets

fn sets_contains(args: &[Value]) -> Result<Value, ExecutionError> {
    let a = arg_list(args, 0, "sets.contains")?;
    let b = arg_list(args, 1, "sets.contains")?;
    Ok(Value::Bool(
        b.iter().all(|x| a.iter().any(|y| cel_equal(x, y))),
    ))
}

fn sets_equivalent(args: &[Value]) -> Result<Value, ExecutionError> {
    let a = arg_list(args, 0, "sets.equivalent")?;
    let b = arg_list(args, 1, "sets.equivalent")?;
    Ok(Value::Bool(
        b.iter().all(|x| a.iter().any(|y| cel_equal(x, y)))
            && a.iter().all(|x| b.iter().any(|y| cel_equal(x, y))),
    ))
}

fn sets_intersects(args: &[Value]) -> Result<Value, ExecutionError> {
    let a = arg_list(args, 0, "sets.intersects")?;
    let b = arg_list(args, 1, "sets.intersects")?;
    Ok(Value::Bool(
        b.iter().any(|x| a.iter().any(|y| cel_equal(x, y))),
    ))
}

// ---------------------------------------------------------------------------------------------
// IP and CIDR

/// An IP address value (`net.IP` library).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CelIp(IpAddr);

impl Opaque for CelIp {
    fn runtime_type_name(&self) -> &str {
        "net.IP"
    }
}

/// A CIDR value (`net.CIDR` library): the address as written and the prefix length.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CelCidr {
    addr: IpAddr,
    prefix: u8,
}

impl Opaque for CelCidr {
    fn runtime_type_name(&self) -> &str {
        "net.CIDR"
    }
}

fn parse_ip(s: &str) -> Option<IpAddr> {
    // Kubernetes refuses IPv4-mapped IPv6 and zones; std refuses zones already.
    let ip: IpAddr = s.parse().ok()?;
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
    {
        return None;
    }
    Some(ip)
}

fn parse_cidr(s: &str) -> Option<CelCidr> {
    let (a, p) = s.split_once('/')?;
    let addr = parse_ip(a)?;
    let prefix: u8 = p.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max && !p.starts_with('+')).then_some(CelCidr { addr, prefix })
}

fn ip_new(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = arg_str(args, 0, "ip")?;
    parse_ip(s)
        .map(|ip| Value::Opaque(Arc::new(CelIp(ip))))
        .ok_or_else(|| {
            err(
                "ip",
                format!("IP Address {s:?} parse error during conversion from string"),
            )
        })
}

fn ip_is(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(parse_ip(arg_str(args, 0, "isIP")?).is_some()))
}

fn ip_is_canonical(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = arg_str(args, 0, "ip.isCanonical")?;
    let ip = parse_ip(s)
        .ok_or_else(|| err("ip.isCanonical", format!("IP Address {s:?} parse error")))?;
    Ok(Value::Bool(ip.to_string() == s))
}

fn cidr_new(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = arg_str(args, 0, "cidr")?;
    parse_cidr(s)
        .map(|c| Value::Opaque(Arc::new(c)))
        .ok_or_else(|| {
            err(
                "cidr",
                format!("network address {s:?} parse error during conversion from string"),
            )
        })
}

fn cidr_is(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        parse_cidr(arg_str(args, 0, "isCIDR")?).is_some(),
    ))
}

fn ip_of(args: &[Value], function: &str) -> Result<IpAddr, ExecutionError> {
    opaque::<CelIp>(args, 0, function).map(|ip| ip.0)
}

fn ip_family(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(if ip_of(args, "family")?.is_ipv4() {
        4
    } else {
        6
    }))
}

fn ip_is_unspecified(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(ip_of(args, "isUnspecified")?.is_unspecified()))
}

fn ip_is_loopback(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(ip_of(args, "isLoopback")?.is_loopback()))
}

fn ip_is_link_local_multicast(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(match ip_of(args, "isLinkLocalMulticast")? {
        IpAddr::V4(v4) => v4.octets()[0] == 224 && v4.octets()[1] == 0 && v4.octets()[2] == 0,
        IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
    }))
}

fn ip_is_link_local_unicast(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(match ip_of(args, "isLinkLocalUnicast")? {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }))
}

fn ip_is_global_unicast(args: &[Value]) -> Result<Value, ExecutionError> {
    let ip = ip_of(args, "isGlobalUnicast")?;
    Ok(Value::Bool(match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.segments()[0] & 0xffc0 == 0xfe80)
        }
    }))
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix as u32)
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix as u32)
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

fn cidr_of<'a>(args: &'a [Value], function: &str) -> Result<&'a CelCidr, ExecutionError> {
    opaque::<CelCidr>(args, 0, function)
}

fn cidr_prefix_length(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(cidr_of(args, "prefixLength")?.prefix as i64))
}

fn cidr_masked(args: &[Value]) -> Result<Value, ExecutionError> {
    let c = cidr_of(args, "masked")?;
    Ok(Value::Opaque(Arc::new(CelCidr {
        addr: mask(c.addr, c.prefix),
        prefix: c.prefix,
    })))
}

fn cidr_ip(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Opaque(Arc::new(CelIp(cidr_of(args, "ip")?.addr))))
}

fn cidr_contains_ip(args: &[Value]) -> Result<Value, ExecutionError> {
    let c = cidr_of(args, "containsIP")?;
    let ip = match &args[1] {
        Value::String(s) => {
            parse_ip(s).ok_or_else(|| err("containsIP", format!("IP Address {s:?} parse error")))?
        }
        _ => opaque::<CelIp>(args, 1, "containsIP")?.0,
    };
    Ok(Value::Bool(
        ip.is_ipv4() == c.addr.is_ipv4() && mask(ip, c.prefix) == mask(c.addr, c.prefix),
    ))
}

fn cidr_contains_cidr(args: &[Value]) -> Result<Value, ExecutionError> {
    let c = cidr_of(args, "containsCIDR")?;
    let other = match &args[1] {
        Value::String(s) => parse_cidr(s)
            .ok_or_else(|| err("containsCIDR", format!("network address {s:?} parse error")))?,
        _ => {
            let o = opaque::<CelCidr>(args, 1, "containsCIDR")?;
            CelCidr {
                addr: o.addr,
                prefix: o.prefix,
            }
        }
    };
    Ok(Value::Bool(
        other.addr.is_ipv4() == c.addr.is_ipv4()
            && other.prefix >= c.prefix
            && mask(other.addr, c.prefix) == mask(c.addr, c.prefix),
    ))
}

fn net_string(args: &[Value]) -> Result<Value, ExecutionError> {
    match args.first() {
        Some(Value::Opaque(o)) => {
            if let Some(ip) = o.downcast_ref::<CelIp>() {
                return Ok(Value::String(Arc::new(ip.0.to_string())));
            }
            if let Some(c) = o.downcast_ref::<CelCidr>() {
                return Ok(Value::String(Arc::new(format!("{}/{}", c.addr, c.prefix))));
            }
            if let Some(q) = o.downcast_ref::<Quantity>() {
                return Ok(Value::String(Arc::new(q.to_string())));
            }
            Err(err(
                "string",
                format!("cannot convert {} to string", o.runtime_type_name()),
            ))
        }
        other => Err(err("string", format!("cannot convert {other:?} to string"))),
    }
}

// ---------------------------------------------------------------------------------------------
// format library

const FORMAT_NAMES: &[&str] = &[
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

/// A named string format of the Kubernetes format library.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CelFormat(&'static str);

impl Opaque for CelFormat {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.NamedFormat"
    }
}

fn format_fn(name: &str) -> Function {
    macro_rules! named {
        ($($n:literal),*) => {
            match name {
                $($n => {
                    fn f<'b, 'v>(_args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
                        let boxed: Box<dyn Val> = Value::Opaque(Arc::new(CelFormat($n))).try_into()?;
                        Ok(CowVal::Owned(boxed))
                    }
                    f as Function
                })*
                _ => unreachable!("format names are fixed"),
            }
        };
    }
    named!(
        "dns1123Label",
        "dns1123Subdomain",
        "dns1035Label",
        "qualifiedName",
        "dns1123LabelPrefix",
        "dns1123SubdomainPrefix",
        "dns1035LabelPrefix",
        "labelValue",
        "uri",
        "uuid",
        "byte",
        "date",
        "datetime"
    )
}

fn format_named(args: &[Value]) -> Result<Value, ExecutionError> {
    let name = arg_str(args, 0, "format.named")?;
    Ok(match FORMAT_NAMES.iter().find(|n| **n == name) {
        Some(n) => optional_of(Value::Opaque(Arc::new(CelFormat(n)))),
        None => optional_none(),
    })
}

fn format_validate(args: &[Value]) -> Result<Value, ExecutionError> {
    let f = opaque::<CelFormat>(args, 0, "validate")?;
    let s = arg_str(args, 1, "validate")?;
    let errors = super::formats::validate_named(f.0, s);
    Ok(if errors.is_empty() {
        optional_none()
    } else {
        optional_of(string_list(errors))
    })
}

// ---------------------------------------------------------------------------------------------
// JSON conversion

/// Converts JSON into a CEL value without any schema: numbers become `int` when integral,
/// object keys are kept as written. Used for admission's `object`, `oldObject` and `request`.
pub(crate) fn json_to_cel(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => number_to_cel(n, false),
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(a) => Value::List(Arc::new(a.iter().map(json_to_cel).collect())),
        serde_json::Value::Object(o) => Value::Map(Map {
            map: Arc::new(
                o.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_cel(v)))
                    .collect(),
            ),
        }),
    }
}

/// A JSON number as CEL: `double` when the schema says `number` (or it has a fraction).
pub(crate) fn number_to_cel(n: &serde_json::Number, as_double: bool) -> Value {
    if !as_double {
        if let Some(i) = n.as_i64() {
            return Value::Int(i);
        }
        if let Some(u) = n.as_u64() {
            return Value::UInt(u);
        }
    }
    Value::Float(n.as_f64().unwrap_or(f64::NAN))
}

/// CEL reserved words: a property with one of these names is exposed as `__name__`.
const CEL_RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The name a schema property is accessible by in CEL, or `None` when it cannot be accessed
/// (Kubernetes' escaping rules: reserved words become `__word__`; `__`, `.`, `-` and `/` become
/// `__underscores__`, `__dot__`, `__dash__` and `__slash__`).
pub(crate) fn escape_property(name: &str) -> Option<String> {
    if CEL_RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first = chars.next()?;
    let ok_first = first.is_ascii_alphabetic() || "_.-/".contains(first);
    if !ok_first || !chars.all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c)) {
        return None;
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("__") {
            out.push_str("__underscores__");
            rest = r;
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cel::Context;

    fn eval(expr: &str, vars: &[(&str, serde_json::Value)]) -> Result<Value, String> {
        let env = env();
        let program = env.compile(expr).map_err(|e| e.to_string())?;
        let unknown = unknown_functions(&program);
        if !unknown.is_empty() {
            return Err(format!("unknown functions {unknown:?}"));
        }
        let mut ctx = Context::with_env(env);
        for (name, v) in vars {
            ctx.add_variable_from_value(*name, json_to_cel(v));
        }
        program.execute(&ctx).map_err(|e| e.to_string())
    }

    #[test]
    fn library_functions_evaluate_as_kubernetes_documents_them() {
        let cases: &[(&str, bool)] = &[
            (r#"'GET'.matches(r"""^[A-Za-z_][A-Za-z_0-9]*$""")"#, true),
            (
                r#"'Svc.Foo'.matches(r"""^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$""")"#,
                true,
            ),
            ("duration('10s') > duration('500ms')", true),
            ("duration('1h') == duration('60m')", true),
            ("[1, 2, 2].exists_one(x, x == 2)", false),
            ("[1, 2, 3].exists_one(x, x == 2)", true),
            ("[1, 2, 3].isSorted() && [3, 1].isSorted() == false", true),
            (
                "[1, 2, 3].sum() == 6 && [1, 5, 3].max() == 5 && [4, 2].min() == 2",
                true,
            ),
            (
                "['a', 'b', 'a'].indexOf('a') == 0 && ['a', 'b', 'a'].lastIndexOf('a') == 2",
                true,
            ),
            ("'abc'.indexOf('c') == 2", true),
            ("'123 abc 456'.find('[0-9]+') == '123'", true),
            ("'123 abc 456'.findAll('[0-9]+') == ['123', '456']", true),
            ("isURL('https://example.com:8443/a/b?x=1')", true),
            ("isURL('not a url')", false),
            (
                "url('https://example.com:8443/a/b').getHost() == 'example.com:8443'",
                true,
            ),
            (
                "url('https://example.com:8443/a/b').getHostname() == 'example.com'",
                true,
            ),
            (
                "url('https://example.com:8443/a/b').getPort() == '8443'",
                true,
            ),
            (
                "url('https://example.com/a/b').getEscapedPath() == '/a/b'",
                true,
            ),
            (
                "url('https://example.com/?k=v&k=w').getQuery()['k'] == ['v', 'w']",
                true,
            ),
            ("url('https://[::1]:80/').getHostname() == '::1'", true),
            ("quantity('1Gi').isGreaterThan(quantity('1G'))", true),
            ("quantity('500m').isLessThan(quantity('1'))", true),
            (
                "quantity('1.5').isInteger() == false && quantity('2k').asInteger() == 2000",
                true,
            ),
            (
                "quantity('1').add(quantity('500m')).compareTo(quantity('1500m')) == 0",
                true,
            ),
            ("quantity('1').sub(1).sign() == 0", true),
            ("isQuantity('1Zi') == false && isQuantity('100Mi')", true),
            (
                "sets.contains([1, 2, 3], [2, 3]) && !sets.contains([1], [2])",
                true,
            ),
            (
                "sets.equivalent([1, 2], [2, 1, 1]) && sets.intersects([1, 2], [2, 5])",
                true,
            ),
            (
                "isIP('10.0.0.1') && !isIP('10.0.0.300') && ip('::1').family() == 6",
                true,
            ),
            ("cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))", true),
            ("cidr('10.0.0.0/8').containsIP('11.1.2.3')", false),
            ("cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')", true),
            ("string(cidr('10.1.2.3/8').masked()) == '10.0.0.0/8'", true),
            (
                "format.dns1123Label().validate('my-name').hasValue() == false",
                true,
            ),
            ("format.dns1123Label().validate('My_Name').hasValue()", true),
            (
                "format.named('uuid').hasValue() && !format.named('nope').hasValue()",
                true,
            ),
            (
                "'a-b'.split('-') == ['a', 'b'] && 'AbC'.lowerAscii() == 'abc'",
                true,
            ),
            ("'%s/%d'.format(['a', 3]) == 'a/3'", true),
            (
                "optional.of(1).orValue(2) == 1 && optional.none().orValue(2) == 2",
                true,
            ),
            ("{'a': 1}.?b.orValue(7) == 7", true),
            ("[3, 1, 2].sort() == [1, 2, 3]", true),
        ];
        for (expr, want) in cases {
            assert_eq!(eval(expr, &[]), Ok(Value::Bool(*want)), "{expr}");
        }
    }

    #[test]
    fn unknown_functions_are_reported() {
        let program = env()
            .compile("self.frobnicate(1) && size(self) > 0")
            .unwrap();
        assert_eq!(unknown_functions(&program), vec!["frobnicate".to_owned()]);
        let program = env().compile("self.all(x, x.startsWith('a'))").unwrap();
        assert!(unknown_functions(&program).is_empty());
    }

    #[test]
    fn property_names_are_escaped_like_kubernetes() {
        let cases = [
            ("namespace", Some("__namespace__")),
            ("if", Some("__if__")),
            ("x-prop", Some("x__dash__prop")),
            ("a.b", Some("a__dot__b")),
            ("a/b", Some("a__slash__b")),
            ("a__b", Some("a__underscores__b")),
            ("plain", Some("plain")),
            ("1abc", None),
            ("has space", None),
        ];
        for (name, want) in cases {
            assert_eq!(escape_property(name).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn request_style_expressions_evaluate() {
        let object = serde_json::json!({"metadata": {"annotations": {"sluice.dev/owner": "r"}}, "spec": {"rules": [1, 2]}});
        let old = serde_json::json!({"metadata": {}, "spec": {"rules": [1, 2]}});
        let vars = [("object", object), ("oldObject", old)];
        assert_eq!(
            eval(
                "has(object.metadata.annotations) && 'sluice.dev/owner' in object.metadata.annotations",
                &vars
            ),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            eval("object.spec.rules == oldObject.spec.rules", &vars),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            eval("has(oldObject.metadata.annotations)", &vars),
            Ok(Value::Bool(false))
        );
    }
}
