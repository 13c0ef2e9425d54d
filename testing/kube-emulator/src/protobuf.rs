//! Decoding of the Kubernetes protobuf envelope for the few built-in kinds kubectl's imperative
//! generators send that way (`kubectl create namespace|configmap|secret|serviceaccount`).
//!
//! Owns only the translation of those messages into the JSON the rest of the emulator speaks.
//! Never encodes protobuf (responses are JSON, which kubectl accepts) and never guesses at a
//! kind it does not know: those are refused with a message saying what to send instead.

use serde_json::{Map, Value, json};

/// The 4-byte prefix of every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

/// Why a protobuf body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ProtobufError {
    /// The body is not well-formed.
    #[error("protobuf body is malformed at byte {0}; send JSON instead")]
    Malformed(usize),
    /// The body does not start with the Kubernetes envelope.
    #[error("protobuf body lacks the k8s envelope; send JSON instead")]
    NoEnvelope,
    /// The kind is not one the emulator decodes.
    #[error(
        "the emulator decodes protobuf only for Namespace, ConfigMap, Secret and ServiceAccount, not {0}; send JSON (kubectl apply -f or kubectl create -f)"
    )]
    Unsupported(String),
}

impl ProtobufError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One field of a message: its number and its payload.
#[derive(Debug, Clone, PartialEq)]
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(b: &[u8], pos: &mut usize) -> Result<u64, ProtobufError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos).ok_or(ProtobufError::Malformed(*pos))?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ProtobufError::Malformed(*pos))
}

fn fields(b: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ProtobufError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let tag = varint(b, &mut pos)?;
        let (num, wire) = (tag >> 3, tag & 7);
        let f = match wire {
            0 => Field::Varint(varint(b, &mut pos)?),
            1 => {
                pos += 8;
                Field::Fixed
            }
            2 => {
                let len = varint(b, &mut pos)? as usize;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= b.len())
                    .ok_or(ProtobufError::Malformed(pos))?;
                let s = &b[pos..end];
                pos = end;
                Field::Bytes(s)
            }
            5 => {
                pos += 4;
                Field::Fixed
            }
            _ => return Err(ProtobufError::Malformed(pos)),
        };
        if pos > b.len() {
            return Err(ProtobufError::Malformed(pos));
        }
        out.push((num, f));
    }
    Ok(out)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A `map<string, string|bytes>` entry list.
fn map_entry(b: &[u8], bytes_as_base64: bool) -> Result<(String, Value), ProtobufError> {
    let mut k = String::new();
    let mut v = Value::String(String::new());
    for (n, f) in fields(b)? {
        if let Field::Bytes(s) = f {
            match n {
                1 => k = text(s),
                2 => v = Value::String(if bytes_as_base64 { base64(s) } else { text(s) }),
                _ => {}
            }
        }
    }
    Ok((k, v))
}

fn object_meta(b: &[u8]) -> Result<Value, ProtobufError> {
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(s)) => {
                m.insert("name".into(), json!(text(s)));
            }
            (2, Field::Bytes(s)) => {
                m.insert("generateName".into(), json!(text(s)));
            }
            (3, Field::Bytes(s)) => {
                m.insert("namespace".into(), json!(text(s)));
            }
            (11, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, false)?;
                labels.insert(k, v);
            }
            (12, Field::Bytes(s)) => {
                let (k, v) = map_entry(s, false)?;
                annotations.insert(k, v);
            }
            (14, Field::Bytes(s)) => finalizers.push(json!(text(s))),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(m))
}

/// Decodes a Kubernetes protobuf body into the JSON object it carries.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let inner = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoEnvelope)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(inner)? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                for (tn, tf) in fields(tm)? {
                    match (tn, tf) {
                        (1, Field::Bytes(s)) => api_version = text(s),
                        (2, Field::Bytes(s)) => kind = text(s),
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(s)) => raw = s,
            _ => {}
        }
    }
    let mut obj = json!({"apiVersion": api_version, "kind": kind});
    let (mut data, mut string_data) = (Map::new(), Map::new());
    for (n, f) in fields(raw)? {
        let Field::Bytes(s) = f else {
            if let (Field::Varint(v), "ConfigMap", 4) | (Field::Varint(v), "Secret", 5) =
                (&f, kind.as_str(), n)
            {
                obj["immutable"] = json!(*v != 0);
            }
            continue;
        };
        match (kind.as_str(), n) {
            (_, 1) => obj["metadata"] = object_meta(s)?,
            ("Namespace", 2) => {
                let mut fin = Vec::new();
                for (n, f) in fields(s)? {
                    if let (1, Field::Bytes(b)) = (n, f) {
                        fin.push(json!(text(b)));
                    }
                }
                if !fin.is_empty() {
                    obj["spec"] = json!({"finalizers": fin});
                }
            }
            ("ConfigMap", 2) => {
                let (k, v) = map_entry(s, false)?;
                data.insert(k, v);
            }
            ("ConfigMap", 3) => {
                let (k, v) = map_entry(s, true)?;
                obj["binaryData"][k] = v;
            }
            ("Secret", 2) => {
                let (k, v) = map_entry(s, true)?;
                data.insert(k, v);
            }
            ("Secret", 3) => obj["type"] = json!(text(s)),
            ("Secret", 4) => {
                let (k, v) = map_entry(s, false)?;
                string_data.insert(k, v);
            }
            ("Namespace" | "ConfigMap" | "Secret" | "ServiceAccount", _) => {}
            (other, _) => return Err(ProtobufError::Unsupported(other.to_string())),
        }
    }
    if !matches!(
        kind.as_str(),
        "Namespace" | "ConfigMap" | "Secret" | "ServiceAccount"
    ) {
        return Err(ProtobufError::Unsupported(kind));
    }
    if !data.is_empty() {
        obj["data"] = Value::Object(data);
    }
    if !string_data.is_empty() {
        obj["stringData"] = Value::Object(string_data);
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = field(1, api_version.as_bytes());
        tm.extend(field(2, kind.as_bytes()));
        let mut body = MAGIC.to_vec();
        body.extend(field(1, &tm));
        body.extend(field(2, raw));
        body
    }

    #[test]
    fn decodes_the_kinds_kubectl_generators_send() {
        let mut meta = field(1, b"cfg");
        let mut label = field(1, b"app");
        label.extend(field(2, b"web"));
        meta.extend(field(11, &label));
        let mut entry = field(1, b"k");
        entry.extend(field(2, b"v"));
        let mut raw = field(1, &meta);
        raw.extend(field(2, &entry));
        let cm = decode(&envelope("v1", "ConfigMap", &raw)).unwrap();
        assert_eq!(
            cm,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cfg", "labels": {"app": "web"}}, "data": {"k": "v"}})
        );

        let mut raw = field(1, &field(1, b"s"));
        raw.extend(field(2, &[field(1, b"pw"), field(2, b"hi!")].concat()));
        raw.extend(field(3, b"Opaque"));
        let secret = decode(&envelope("v1", "Secret", &raw)).unwrap();
        assert_eq!(secret["data"]["pw"], "aGkh");
        assert_eq!(secret["type"], "Opaque");

        let ns = decode(&envelope("v1", "Namespace", &field(1, &field(1, b"team")))).unwrap();
        assert_eq!(ns["metadata"]["name"], "team");
    }

    #[test]
    fn refuses_what_it_cannot_decode() {
        assert_eq!(decode(b"{}").unwrap_err().category(), "no_envelope");
        assert_eq!(
            decode(&envelope(
                "apps/v1",
                "Deployment",
                &field(1, &field(1, b"d"))
            ))
            .unwrap_err()
            .category(),
            "unsupported"
        );
        let mut bad = MAGIC.to_vec();
        bad.extend([0x0a, 0x10, 0x01]);
        assert_eq!(decode(&bad).unwrap_err().category(), "malformed");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
    }
}
