//! The head of one HTTP/1.1 request, as the test kit's small servers (the registry's token
//! service, the referrers API front) read it: request line and headers, bounded to 64 KiB, with
//! whatever body bytes arrived in the same reads.

use tokio::io::{AsyncRead, AsyncReadExt};

/// The largest request head read.
const MAX_HEAD: usize = 64 * 1024;

/// One request's head and the body bytes read with it.
#[derive(Debug, Default)]
pub(crate) struct Head {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    /// Header names lowercased, values trimmed, in order.
    pub headers: Vec<(String, String)>,
    /// Body bytes that arrived with the head.
    pub body_start: Vec<u8>,
}

impl Head {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads a request head from `stream`; `None` when the peer closes first or the head is larger
/// than 64 KiB.
pub(crate) async fn read<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Head> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let text = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = text.lines();
    let mut first = lines.next().unwrap_or_default().split_whitespace();
    let method = first.next().unwrap_or_default().to_owned();
    let target = first.next().unwrap_or_default().to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Head {
        method,
        target,
        headers,
        body_start: buf[head_end..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_the_request_line_headers_and_early_body() {
        let mut input: &[u8] =
            b"POST /token?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nAuthorization:  Basic eA== \r\n\r\nabc";
        let head = read(&mut input).await.unwrap();
        assert_eq!(head.method, "POST");
        assert_eq!(head.target, "/token?x=1");
        assert_eq!(head.header("authorization"), Some("Basic eA=="));
        assert_eq!(head.header("content-length"), Some("3"));
        assert_eq!(head.body_start, b"abc");
        let mut cut: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n";
        assert!(
            read(&mut cut).await.is_none(),
            "a head the peer never finished"
        );
    }
}
