//! Reading the daemons' `/metrics` endpoints: a one-shot HTTP/1.0 GET over a loopback TCP
//! connection and a parser for the few Prometheus text lines aliasnetctl looks at. HTTP/1.0
//! keeps the answer free of chunked encoding, so no HTTP library is needed for this.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream, ToSocketAddrs},
    time::Duration,
};

/// Largest answer read (a 1,000-pod shaperd exposition is ~3 MB).
const MAX_ANSWER: u64 = 64 << 20;

/// Why a GET failed, worded for an operator.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{addr:?} is not a host:port address")]
    BadAddress { addr: String },
    #[error("nothing is listening on {addr}")]
    Refused { addr: String },
    #[error("{addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("{addr} answered HTTP {status}")]
    Status { addr: String, status: u16 },
    #[error("{addr} answered something that is not HTTP")]
    Garbled { addr: String },
    #[error("talking to {addr} failed ({kind})")]
    Other {
        addr: String,
        kind: std::io::ErrorKind,
    },
}

fn io_error(addr: &str, timeout: Duration, e: &std::io::Error) -> HttpError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => HttpError::Refused {
            addr: addr.to_owned(),
        },
        K::TimedOut | K::WouldBlock => HttpError::Timeout {
            addr: addr.to_owned(),
            timeout,
        },
        kind => HttpError::Other {
            addr: addr.to_owned(),
            kind,
        },
    }
}

/// `GET path` from `addr`; the body of a 200 answer.
pub fn get(addr: &str, path: &str, timeout: Duration) -> Result<String, HttpError> {
    let sock: SocketAddr = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| HttpError::BadAddress {
            addr: addr.to_owned(),
        })?;
    let mut s =
        TcpStream::connect_timeout(&sock, timeout).map_err(|e| io_error(addr, timeout, &e))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(|e| io_error(addr, timeout, &e))?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: aliasnetctl\r\n\r\n");
    s.write_all(req.as_bytes())
        .map_err(|e| io_error(addr, timeout, &e))?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER)
        .read_to_end(&mut raw)
        .map_err(|e| io_error(addr, timeout, &e))?;
    let garbled = || HttpError::Garbled {
        addr: addr.to_owned(),
    };
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(garbled)?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| garbled())?;
    let status: u16 = head
        .lines()
        .next()
        .filter(|l| l.starts_with("HTTP/"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(garbled)?;
    if status != 200 {
        return Err(HttpError::Status {
            addr: addr.to_owned(),
            status,
        });
    }
    Ok(String::from_utf8_lossy(&raw[split + 4..]).into_owned())
}

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one sample line (`name{k="v",...} value [timestamp]`); `None` for comments,
/// blank and malformed lines.
pub fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let end = loop {
            // key
            while chars
                .peek()
                .is_some_and(|(_, c)| *c == ',' || c.is_whitespace())
            {
                chars.next();
            }
            if let Some((i, '}')) = chars.peek().copied() {
                break i + 1;
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut val = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next()?.1 {
                        'n' => val.push('\n'),
                        other => val.push(other),
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => val.push(c),
                }
            }
            if !closed {
                return None;
            }
            labels.push((key.trim().to_owned(), val));
        };
        rest = &r[end..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Every sample named `name` in an exposition.
pub fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = Sample> + 'a {
    text.lines()
        .filter(move |l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(parse_sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_with_escapes() {
        let s =
            parse_sample(r#"aliasnet_build_info{component="shaperd",version="0.1.0"} 1"#).unwrap();
        assert_eq!(s.name, "aliasnet_build_info");
        assert_eq!(s.label("version"), Some("0.1.0"));
        assert_eq!(s.value, 1.0);
        let s = parse_sample(r#"x{a="q\"uote\\d\n",b="2"} 3.5e3 1700000000"#).unwrap();
        assert_eq!(s.label("a"), Some("q\"uote\\d\n"));
        assert_eq!(s.label("b"), Some("2"));
        assert_eq!(s.value, 3500.0);
        assert_eq!(parse_sample("up 1").unwrap().value, 1.0);
        assert!(parse_sample("# HELP x y").is_none());
        assert!(parse_sample(r#"x{a="unterminated} 1"#).is_none());
        let text = "a_total 1\na 2\nab 3\n";
        assert_eq!(
            samples(text, "a").map(|s| s.value).collect::<Vec<_>>(),
            [2.0]
        );
    }

    #[test]
    fn refused_and_bad_addresses_are_worded() {
        // Bind then drop: the port is very likely closed afterwards.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = get(
            &format!("127.0.0.1:{port}"),
            "/metrics",
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, HttpError::Refused { .. }), "{e}");
        assert!(e
            .to_string()
            .starts_with("nothing is listening on 127.0.0.1:"));
        let e = get("not an address", "/metrics", Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, HttpError::BadAddress { .. }));
    }
}
