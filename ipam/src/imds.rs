//! `azure-imds` pools: the node's secondary IPs, polled from an Azure Instance Metadata
//! Service-format endpoint (`GET /metadata/instance/network?api-version=...` with the header
//! `Metadata: true`).
//!
//! Per interface, `ipv4.ipAddress[0]` is the primary ipconfig (the node's own address) and is
//! never handed out; the other entries are the secondary addresses that make up the pool.
//! IPv6 addresses are listed the same way under `ipv6.ipAddress[]`: the first of each
//! interface is the node's own, the others are secondaries; a pool with `family = "ipv6"`
//! serves those.
//!
//! Only a complete read is acted on: a non-200 status, a body cut short, JSON that does not
//! parse, an unparsable address, or a document with no interface (IMDS always lists the
//! primary NIC, so an empty list is a broken answer, not "every address is gone") leave the
//! pool as it was. A newly listed address is usable at once: IMDS lists an ipconfig once the
//! platform has programmed it on the NIC, and aliasnet routes pod addresses itself (a /32 via
//! the pod's veth), so there is nothing further to wait for. (AWS's ipamd waits 60 s because
//! EC2's metadata can lag its API; Azure's IMDS is the NIC's own view.)
//!
//! Refresh is adaptive, like Azure CNS's NodeSubnet poller: `refresh_min` after a change,
//! doubling up to `refresh_max` while nothing changes. Failures back off the same way (from
//! `refresh_min`, doubling), and a 429 or 5xx with `Retry-After` waits at least that long.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
    time::Duration,
};

use aliasnet_ipam_proto::Family;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde::Deserialize;
use tokio::sync::watch;

use crate::{config::ImdsSpec, metrics::RefreshResult, service::Ipam};

/// Largest metadata document accepted (a NIC has at most 256 addresses: a few tens of KiB).
const MAX_BODY: usize = 1 << 20;
/// Longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

#[derive(Deserialize)]
struct Doc {
    interface: Vec<Interface>,
}

#[derive(Deserialize)]
struct Interface {
    #[serde(default)]
    ipv4: Option<AddrList>,
    #[serde(default)]
    ipv6: Option<AddrList>,
    #[serde(default, rename = "macAddress")]
    mac: Option<String>,
}

#[derive(Deserialize)]
struct AddrList {
    #[serde(rename = "ipAddress", default)]
    ip_address: Vec<IpEntry>,
}

#[derive(Deserialize)]
struct IpEntry {
    #[serde(rename = "privateIpAddress")]
    private: String,
}

/// A parsed metadata document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Secondary addresses of every interface, sorted, without duplicates and without any
    /// interface's primary.
    pub secondary: Vec<Ipv4Addr>,
    /// The primary address of each interface.
    pub primaries: Vec<Ipv4Addr>,
    /// Secondary IPv6 addresses of every interface (`ipv6.ipAddress[1..]`), likewise.
    pub secondary6: Vec<Ipv6Addr>,
    /// The first IPv6 address of each interface that has one (the node's own).
    pub primaries6: Vec<Ipv6Addr>,
}

/// Why a metadata document is unusable (nothing of it is applied).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid JSON: not UTF-8 ({0})")]
    NotUtf8(std::str::Utf8Error),
    /// The JSON parser's message, which names the line and column.
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("the document lists no interface")]
    NoInterface,
    #[error("no interface has an IPv4 address")]
    NoIpv4,
    /// `interface` is `interface <mac>` or `interface[<index>]`; `list` is `ipv4` or `ipv6`.
    #[error(
        "{interface}: {list}.ipAddress[{index}].privateIpAddress {value:?} is not an {family} \
         address"
    )]
    NotAnAddress {
        interface: String,
        list: &'static str,
        index: usize,
        value: String,
        family: &'static str,
    },
}

/// (first address of each interface, the other addresses) of one family's lists.
type Split<A> = (Vec<A>, BTreeSet<A>);

/// Split `ipvN.ipAddress[]` of every interface into primaries and secondaries.
fn split<A: FromStr + Ord + Copy>(
    doc: &Doc,
    list: impl Fn(&Interface) -> Option<&AddrList>,
    family: &'static str,
) -> Result<Split<A>, ParseError> {
    let mut primaries = Vec::new();
    let mut secondary = BTreeSet::new();
    for (i, iface) in doc.interface.iter().enumerate() {
        let Some(l) = list(iface) else { continue };
        let name = iface
            .mac
            .as_deref()
            .map_or_else(|| format!("interface[{i}]"), |m| format!("interface {m}"));
        for (j, e) in l.ip_address.iter().enumerate() {
            let ip: A = e
                .private
                .trim()
                .parse()
                .map_err(|_| ParseError::NotAnAddress {
                    interface: name.clone(),
                    list: family,
                    index: j,
                    value: e.private.clone(),
                    family: if family == "ipv4" { "IPv4" } else { "IPv6" },
                })?;
            if j == 0 {
                primaries.push(ip);
            } else {
                secondary.insert(ip);
            }
        }
    }
    for p in &primaries {
        secondary.remove(p);
    }
    Ok((primaries, secondary))
}

/// Parse an IMDS `instance/network` document; any defect is an error (nothing is applied).
pub fn parse(body: &[u8]) -> Result<Parsed, ParseError> {
    // serde_json skips fields it ignores without checking their UTF-8: check the whole
    // document, so that only valid JSON is ever acted on.
    let text = std::str::from_utf8(body).map_err(ParseError::NotUtf8)?;
    let doc: Doc = serde_json::from_str(text).map_err(|e| ParseError::Json(e.to_string()))?;
    if doc.interface.is_empty() {
        return Err(ParseError::NoInterface);
    }
    let (primaries, secondary) = split::<Ipv4Addr>(&doc, |i| i.ipv4.as_ref(), "ipv4")?;
    if primaries.is_empty() {
        return Err(ParseError::NoIpv4);
    }
    let (primaries6, secondary6) = split::<Ipv6Addr>(&doc, |i| i.ipv6.as_ref(), "ipv6")?;
    Ok(Parsed {
        secondary: secondary.into_iter().collect(),
        primaries,
        secondary6: secondary6.into_iter().collect(),
        primaries6,
    })
}

/// Why a fetch gave nothing to apply.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A non-200 status, with `Retry-After` when given.
    #[error("answered HTTP {0}")]
    Status(u16, Option<Duration>),
    /// No complete answer: refused, timed out, cut short, too large.
    #[error("unreachable: {0}")]
    Unreachable(String),
}

/// The HTTP client of the metadata pollers.
#[derive(Clone)]
pub struct Fetcher {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Default for Fetcher {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Self {
            client: Client::builder(TokioExecutor::new())
                // A fresh connection per poll: minutes apart, and never a stale keep-alive.
                .pool_max_idle_per_host(0)
                .build(connector),
        }
    }
}

fn retry_after(h: &hyper::HeaderMap) -> Option<Duration> {
    // Only the delta-seconds form; an HTTP date is ignored (the backoff applies).
    let v = h.get(hyper::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim()
        .parse::<u64>()
        .ok()
        .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

impl Fetcher {
    /// GET `spec.url` with `Metadata: true`; the whole body, within `spec.timeout`.
    pub async fn fetch(&self, spec: &ImdsSpec) -> Result<Bytes, FetchError> {
        let req = hyper::Request::get(spec.url.as_str())
            .header("Metadata", "true")
            .body(Empty::<Bytes>::new())
            .map_err(|e| FetchError::Unreachable(format!("bad request: {e}")))?;
        let work = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| FetchError::Unreachable(crate::error_chain(&e)))?;
            let status = resp.status().as_u16();
            if status != 200 {
                return Err(FetchError::Status(status, retry_after(resp.headers())));
            }
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| FetchError::Unreachable(format!("reading the body: {e}")))?;
            Ok(body.to_bytes())
        };
        match tokio::time::timeout(spec.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(FetchError::Unreachable(format!(
                "no complete answer within {}ms",
                spec.timeout.as_millis()
            ))),
        }
    }
}

/// The adaptive schedule of one poller.
#[derive(Debug, Clone)]
pub struct Schedule {
    min: Duration,
    max: Duration,
    /// Interval after the next unchanged success.
    interval: Duration,
    /// Delay after the next failure.
    backoff: Duration,
}

impl Schedule {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            interval: min,
            backoff: min,
        }
    }

    /// Delay before the next attempt after a successful read.
    pub fn success(&mut self, changed: bool) -> Duration {
        self.backoff = self.min;
        if changed {
            self.interval = self.min;
        } else {
            self.interval = (self.interval * 2).min(self.max);
        }
        self.interval
    }

    /// Delay before the next attempt after a failure; `retry_after` (from the server) is a
    /// lower bound.
    pub fn failure(&mut self, retry_after: Option<Duration>) -> Duration {
        let d = self.backoff;
        self.backoff = (self.backoff * 2).min(self.max);
        d.max(retry_after.unwrap_or(Duration::ZERO))
    }
}

/// Poll one pool's endpoint until `shutdown`; apply every complete read.
pub async fn run(
    ipam: Ipam,
    pool: String,
    spec: ImdsSpec,
    fetcher: Fetcher,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(idx) = ipam.with_state(|st| st.metadata_target(&pool)) else {
        tracing::error!(pool, "not a metadata pool; its poller does not run");
        return;
    };
    let mut schedule = Schedule::new(spec.refresh_min, spec.refresh_max);
    let mut refused_before: Vec<(IpAddr, String)> = Vec::new();
    loop {
        let (result, delay, err) = match fetcher.fetch(&spec).await {
            Ok(body) => match parse(&body) {
                Ok(parsed) => {
                    let now = ipam.now_ms();
                    let change = ipam.with_state(|st| {
                        let c =
                            st.apply_metadata_read(idx, &parsed.secondary, &parsed.secondary6, now);
                        st.set_metadata_status(idx, |m| {
                            m.last_success_ms = Some(now);
                            m.primaries = match idx.family {
                                Family::Ipv4 => parsed.primaries.len(),
                                Family::Ipv6 => parsed.primaries6.len(),
                            } as u64;
                        });
                        c
                    });
                    ipam.metrics().metadata_success(&pool, now);
                    if !change.is_empty() {
                        tracing::info!(
                            pool,
                            added = ?change.added,
                            removed = ?change.removed,
                            addresses = match idx.family {
                                Family::Ipv4 => parsed.secondary.len(),
                                Family::Ipv6 => parsed.secondary6.len(),
                            },
                            "metadata changed"
                        );
                    }
                    for l in &change.missing {
                        tracing::warn!(
                            pool,
                            address = %l.address,
                            key = %l.key,
                            namespace = l.pod.namespace.as_deref().unwrap_or(""),
                            pod = l.pod.name.as_deref().unwrap_or(""),
                            "a leased address disappeared from the metadata; the pod keeps it, \
                             but it will not be handed out again after release unless the \
                             metadata lists it again"
                        );
                    }
                    if change.refused != refused_before {
                        for (a, why) in &change.refused {
                            tracing::warn!(pool, address = %a, why, "metadata address not used");
                        }
                        refused_before = change.refused.clone();
                    }
                    let changed = !change.is_empty();
                    let r = if changed {
                        RefreshResult::Changed
                    } else {
                        RefreshResult::Ok
                    };
                    (r, schedule.success(changed), None)
                }
                Err(e) => (
                    RefreshResult::ParseError,
                    schedule.failure(None),
                    Some(format!("unusable metadata from {}: {e}", spec.url)),
                ),
            },
            Err(FetchError::Status(429, ra)) => (
                RefreshResult::Throttled,
                schedule.failure(ra),
                Some(format!("{} answered 429 (throttled)", spec.url)),
            ),
            Err(FetchError::Status(s, ra)) => (
                RefreshResult::HttpError,
                // Retry-After is honoured on 5xx (503 Service Unavailable carries it).
                schedule.failure(if s >= 500 { ra } else { None }),
                Some(format!("{} answered HTTP {s}", spec.url)),
            ),
            Err(FetchError::Unreachable(e)) => (
                RefreshResult::Unreachable,
                schedule.failure(None),
                Some(format!("{} unreachable: {e}", spec.url)),
            ),
        };
        ipam.metrics().metadata_refresh(&pool, result);
        let next = ipam
            .now_ms()
            .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        ipam.with_state(|st| {
            st.set_metadata_status(idx, |m| {
                m.last_result = Some(result.as_str().to_owned());
                m.last_error = err.clone();
                m.next_refresh_ms = Some(next);
            })
        });
        if let Some(e) = &err {
            // Failures keep the pool as it was; say so once per attempt at warn level.
            tracing::warn!(
                pool,
                retry_in_ms = delay.as_millis() as u64,
                "{e}; the pool is unchanged"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"interface":[
        {"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.8.5","publicIpAddress":""},
                              {"privateIpAddress":"10.0.8.6","publicIpAddress":""},
                              {"privateIpAddress":"10.0.8.7","publicIpAddress":""}],
                 "subnet":[{"address":"10.0.8.0","prefix":"24"}]},
         "ipv6":{"ipAddress":[]},"macAddress":"000D3A328570"},
        {"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.9.4"},{"privateIpAddress":"10.0.9.5"},
                              {"privateIpAddress":"10.0.8.6"}]},
         "macAddress":"000D3A328571"}]}"#;

    #[test]
    fn primaries_are_never_secondaries() {
        let p = parse(SAMPLE.as_bytes()).unwrap();
        assert_eq!(
            p.primaries,
            vec![Ipv4Addr::new(10, 0, 8, 5), Ipv4Addr::new(10, 0, 9, 4)]
        );
        assert_eq!(
            p.secondary,
            vec![
                Ipv4Addr::new(10, 0, 8, 6),
                Ipv4Addr::new(10, 0, 8, 7),
                Ipv4Addr::new(10, 0, 9, 5)
            ]
        );
    }

    #[test]
    fn ipv6_secondaries_are_read_next_to_ipv4() {
        let body = r#"{"interface":[
            {"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.8.5"},{"privateIpAddress":"10.0.8.6"}]},
             "ipv6":{"ipAddress":[{"privateIpAddress":"fd00:100::5"},
                                  {"privateIpAddress":"fd00:100::7"},
                                  {"privateIpAddress":" fd00:100::6 "}]},
             "macAddress":"000D3A328570"},
            {"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.9.4"}]},
             "ipv6":{"ipAddress":[{"privateIpAddress":"fd00:100::9"},
                                  {"privateIpAddress":"fd00:100::5"}]}}]}"#;
        let p = parse(body.as_bytes()).unwrap();
        assert_eq!(p.secondary, vec![Ipv4Addr::new(10, 0, 8, 6)]);
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(p.primaries6, vec![v6("fd00:100::5"), v6("fd00:100::9")]);
        // Sorted, and never another interface's first address.
        assert_eq!(p.secondary6, vec![v6("fd00:100::6"), v6("fd00:100::7")]);
        // No IPv6 list at all, or an empty one: no IPv6 addresses.
        let p = parse(SAMPLE.as_bytes()).unwrap();
        assert!(p.secondary6.is_empty() && p.primaries6.is_empty());
        let bad = r#"{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.1"}]},
            "ipv6":{"ipAddress":[{"privateIpAddress":"fd00::1"},{"privateIpAddress":"10.0.0.2"}]}}]}"#;
        let e = parse(bad.as_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("ipv6.ipAddress[1]") && e.contains("not an IPv6 address"),
            "{e}"
        );
    }

    #[test]
    fn defective_documents_are_refused() {
        for (body, want) in [
            (&SAMPLE[..SAMPLE.len() / 2], "invalid JSON"),
            ("", "invalid JSON"),
            ("{}", "invalid JSON"),
            (r#"{"interface":[]}"#, "no interface"),
            (r#"{"interface":[{"ipv6":{}}]}"#, "no interface has an IPv4"),
            (
                r#"{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.1"},{"privateIpAddress":"10.0.0.300"}]}}]}"#,
                "ipAddress[1]",
            ),
            (
                r#"{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.1"},{"publicIpAddress":"1.2.3.4"}]}}]}"#,
                "invalid JSON",
            ),
        ] {
            let e = parse(body.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn schedule_adapts_and_backs_off() {
        let s = Duration::from_secs;
        let mut sch = Schedule::new(s(4), s(1024));
        assert_eq!(sch.success(true), s(4));
        assert_eq!(sch.success(false), s(8));
        assert_eq!(sch.success(false), s(16));
        for _ in 0..20 {
            sch.success(false);
        }
        assert_eq!(sch.success(false), s(1024));
        assert_eq!(sch.success(true), s(4));
        assert_eq!(sch.failure(None), s(4));
        assert_eq!(sch.failure(None), s(8));
        assert_eq!(sch.failure(Some(s(60))), s(60));
        assert_eq!(sch.failure(Some(s(1))), s(32));
        // A success resets the error backoff.
        sch.success(false);
        assert_eq!(sch.failure(None), s(4));
    }
}
