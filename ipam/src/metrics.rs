//! Prometheus metrics of `aliasnet-ipamd` and the HTTP endpoint that serves them.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `aliasnet_ipam_pool_addresses` | gauge | pool, state (allocated, cooling, free, pending_teardown, missing) |
//! | `aliasnet_ipam_pool_size` | gauge | pool |
//! | `aliasnet_ipam_allocations_total` | counter | pool |
//! | `aliasnet_ipam_releases_total` | counter | pool |
//! | `aliasnet_ipam_allocation_errors_total` | counter | pool, reason |
//! | `aliasnet_ipam_allocation_duration_seconds` | histogram | |
//! | `aliasnet_ipam_metadata_refresh_total` | counter | pool, result |
//! | `aliasnet_ipam_metadata_last_success_timestamp_seconds` | gauge | pool |
//! | `aliasnet_ipam_orphan_veths` | gauge | |
//! | `aliasnet_ipam_reconcile_released_total` | counter | |
//! | `aliasnet_cni_operations_total` | counter | verb, code |
//! | `aliasnet_cni_operation_duration_seconds` | histogram | verb, code |
//! | `aliasnet_build_info` | gauge (1) | component, version |
//!
//! `state` values partition a pool's addresses: `allocated` (leased, still in the pool's
//! source), `missing` (leased, gone from the metadata), `cooling` (released within the
//! cooldown), `pending_teardown` (cooldown over, the old host veth still being deleted) and
//! `free`. `pool_size` is the number of addresses the source provides now (for metadata pools,
//! the secondary addresses of the last good read). `reason` is the protocol error kind in
//! snake case (`pool_exhausted`, `only_cooling`, `unknown_pool`, `storage`, `unavailable`,
//! `bad_request`, `internal`); the `pool` label of an error is the requested pool, or empty
//! when the request named none or an unknown one (its name is not echoed into a label).
//!
//! Gauges are computed at scrape time from one reading of the state under its lock, and
//! counters are atomic, so a scrape is always complete and self-consistent; series exist
//! (at zero) from start for every configured pool, so rates and alerts work before the first
//! event.

use std::{
    net::SocketAddr,
    sync::{atomic::AtomicU64, Arc, Mutex},
    time::Duration,
};

use aliasnet_ipam_proto::{ErrorKind, RECORDED_CODE_MAX, RECORDED_VERBS};
use prometheus_client::{
    encoding::{prometheus_text, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use tokio::{net::TcpListener, sync::watch};

use crate::state::PoolCounts;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolState {
    pool: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolReason {
    pool: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolResult {
    pool: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbCode {
    verb: &'static str,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildInfo {
    component: &'static str,
    version: &'static str,
}

/// Outcome of one metadata refresh, as exported in `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshResult {
    /// Read and applied; nothing changed.
    Ok,
    /// Read and applied; addresses appeared or disappeared.
    Changed,
    /// HTTP 429.
    Throttled,
    /// Any other non-200 status.
    HttpError,
    /// A 200 whose body is not a complete, valid document.
    ParseError,
    /// No answer (connection refused, timeout, cut short).
    Unreachable,
}

impl RefreshResult {
    pub const ALL: [Self; 6] = [
        Self::Ok,
        Self::Changed,
        Self::Throttled,
        Self::HttpError,
        Self::ParseError,
        Self::Unreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Changed => "changed",
            Self::Throttled => "throttled",
            Self::HttpError => "http_error",
            Self::ParseError => "parse_error",
            Self::Unreachable => "unreachable",
        }
    }
}

/// The `reason` label of an error kind.
pub fn reason(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::PoolExhausted => "pool_exhausted",
        ErrorKind::OnlyCooling => "only_cooling",
        ErrorKind::UnknownPool => "unknown_pool",
        ErrorKind::BadRequest => "bad_request",
        ErrorKind::UnsupportedVersion => "unsupported_version",
        ErrorKind::Storage => "storage",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Internal => "internal",
    }
}

const POOL_STATES: [&str; 5] = [
    "allocated",
    "cooling",
    "free",
    "pending_teardown",
    "missing",
];
const COMMON_REASONS: [ErrorKind; 4] = [
    ErrorKind::PoolExhausted,
    ErrorKind::OnlyCooling,
    ErrorKind::Storage,
    ErrorKind::Unavailable,
];

fn histogram_allocation() -> Histogram {
    // A durable allocation is one fdatasync plus microseconds; the tail is the disk's.
    Histogram::new([
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        10.0,
    ])
}

fn histogram_cni() -> Histogram {
    // Whole CNI operations: netlink work, veth creation, tens of milliseconds typically.
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// A CNI operation report the metrics refuse to count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CniOperationError {
    #[error("unknown CNI verb {verb:?}; expected one of {}", RECORDED_VERBS.join(", "))]
    Verb { verb: String },
    #[error("code {code} is out of range (0 to {RECORDED_CODE_MAX})")]
    Code { code: u32 },
}

/// The daemon's metrics. Cheap to share: every family is reference-counted inside.
pub struct Metrics {
    registry: Registry,
    render: Mutex<()>,
    pools: Vec<String>,
    pool_addresses: Family<PoolState, Gauge>,
    pool_size: Family<PoolLabel, Gauge>,
    allocations: Family<PoolLabel, Counter>,
    releases: Family<PoolLabel, Counter>,
    alloc_errors: Family<PoolReason, Counter>,
    alloc_duration: Histogram,
    refresh: Family<PoolResult, Counter>,
    last_success: Family<PoolLabel, Gauge<f64, AtomicU64>>,
    orphan_veths: Gauge,
    reconcile_released: Counter,
    cni_ops: Family<VerbCode, Counter>,
    cni_duration: Family<VerbCode, Histogram, fn() -> Histogram>,
}

impl Metrics {
    /// Metrics for these pools (`metadata_pools`: the `azure-imds` ones).
    pub fn new(pools: &[String], metadata_pools: &[String]) -> Self {
        let mut registry = Registry::with_prefix("aliasnet");
        let pool_addresses = Family::<PoolState, Gauge>::default();
        let pool_size = Family::<PoolLabel, Gauge>::default();
        let allocations = Family::<PoolLabel, Counter>::default();
        let releases = Family::<PoolLabel, Counter>::default();
        let alloc_errors = Family::<PoolReason, Counter>::default();
        let alloc_duration = histogram_allocation();
        let refresh = Family::<PoolResult, Counter>::default();
        let last_success = Family::<PoolLabel, Gauge<f64, AtomicU64>>::default();
        let orphan_veths = Gauge::default();
        let reconcile_released = Counter::default();
        let cni_ops = Family::<VerbCode, Counter>::default();
        let cni_duration =
            Family::<VerbCode, Histogram, fn() -> Histogram>::new_with_constructor(histogram_cni);
        let build_info = Family::<BuildInfo, Gauge>::default();

        registry.register(
            "ipam_pool_addresses",
            "Addresses of the pool by state (allocated, cooling, free, pending_teardown, missing)",
            pool_addresses.clone(),
        );
        registry.register(
            "ipam_pool_size",
            "Addresses the pool's source provides now",
            pool_size.clone(),
        );
        registry.register(
            "ipam_allocations",
            "Addresses newly allocated (idempotent repeats not counted)",
            allocations.clone(),
        );
        registry.register(
            "ipam_releases",
            "Leases released (by DEL, GC, the spool or the reconcile)",
            releases.clone(),
        );
        registry.register(
            "ipam_allocation_errors",
            "Allocate requests refused, by reason",
            alloc_errors.clone(),
        );
        registry.register(
            "ipam_allocation_duration_seconds",
            "Allocate requests from arrival to the durable reply",
            alloc_duration.clone(),
        );
        registry.register(
            "ipam_metadata_refresh",
            "Metadata refresh attempts by result",
            refresh.clone(),
        );
        registry.register(
            "ipam_metadata_last_success_timestamp_seconds",
            "Unix time of the last metadata read that was applied (0: none yet)",
            last_success.clone(),
        );
        registry.register(
            "ipam_orphan_veths",
            "Host veths named like aliasnet's that no lease claims (last reconcile)",
            orphan_veths.clone(),
        );
        registry.register(
            "ipam_reconcile_released",
            "Leases released because their host veth stayed gone",
            reconcile_released.clone(),
        );
        registry.register(
            "cni_operations",
            "CNI operations reported by the plugin, by verb and result code",
            cni_ops.clone(),
        );
        registry.register(
            "cni_operation_duration_seconds",
            "Duration of CNI operations reported by the plugin",
            cni_duration.clone(),
        );
        registry.register(
            "build_info",
            "Build of this component (always 1)",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildInfo {
                component: "ipamd",
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        for p in pools {
            let pool = p.clone();
            let _ = allocations.get_or_create(&PoolLabel { pool: pool.clone() });
            let _ = releases.get_or_create(&PoolLabel { pool: pool.clone() });
            for k in COMMON_REASONS {
                let _ = alloc_errors.get_or_create(&PoolReason {
                    pool: pool.clone(),
                    reason: reason(k),
                });
            }
        }
        for p in metadata_pools {
            for r in RefreshResult::ALL {
                let _ = refresh.get_or_create(&PoolResult {
                    pool: p.clone(),
                    result: r.as_str(),
                });
            }
            let _ = last_success.get_or_create(&PoolLabel { pool: p.clone() });
        }
        Self {
            registry,
            render: Mutex::new(()),
            pools: pools.to_vec(),
            pool_addresses,
            pool_size,
            allocations,
            releases,
            alloc_errors,
            alloc_duration,
            refresh,
            last_success,
            orphan_veths,
            reconcile_released,
            cni_ops,
            cni_duration,
        }
    }

    pub fn allocated(&self, pool: &str) {
        self.allocations
            .get_or_create(&PoolLabel { pool: pool.into() })
            .inc();
    }

    pub fn released(&self, pool: &str) {
        self.releases
            .get_or_create(&PoolLabel { pool: pool.into() })
            .inc();
    }

    /// An Allocate refused; `pool` is what it asked for (`None`: any pool).
    pub fn allocation_error(&self, pool: Option<&str>, kind: ErrorKind) {
        // Only configured names become label values.
        let pool = pool
            .filter(|p| self.pools.iter().any(|c| c == p))
            .unwrap_or("");
        self.alloc_errors
            .get_or_create(&PoolReason {
                pool: pool.into(),
                reason: reason(kind),
            })
            .inc();
    }

    pub fn allocation_duration(&self, d: Duration) {
        self.alloc_duration.observe(d.as_secs_f64());
    }

    pub fn metadata_refresh(&self, pool: &str, result: RefreshResult) {
        self.refresh
            .get_or_create(&PoolResult {
                pool: pool.into(),
                result: result.as_str(),
            })
            .inc();
    }

    pub fn metadata_success(&self, pool: &str, unix_ms: u64) {
        self.last_success
            .get_or_create(&PoolLabel { pool: pool.into() })
            .set(unix_ms as f64 / 1000.0);
    }

    pub fn set_orphan_veths(&self, n: u64) {
        self.orphan_veths.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn reconcile_released(&self) {
        self.reconcile_released.inc();
    }

    /// Count one CNI operation. Errors when `verb` is not a CNI command or `code` is out of
    /// range (labels stay bounded whatever clients send).
    pub fn cni_operation(
        &self,
        verb: &str,
        code: u32,
        duration: Duration,
    ) -> Result<(), CniOperationError> {
        let lower = verb.to_ascii_lowercase();
        let verb = RECORDED_VERBS
            .iter()
            .find(|v| **v == lower)
            .copied()
            .ok_or_else(|| CniOperationError::Verb {
                verb: verb.to_owned(),
            })?;
        if code > RECORDED_CODE_MAX {
            return Err(CniOperationError::Code { code });
        }
        let labels = VerbCode {
            verb,
            code: code.to_string(),
        };
        self.cni_ops.get_or_create(&labels).inc();
        self.cni_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
        Ok(())
    }

    /// The exposition (Prometheus text format 0.0.4) with the pool gauges set from `counts`.
    pub fn render(&self, counts: &[PoolCounts], orphan_veths: Option<u64>) -> String {
        // One render at a time: the gauges set here are those the encoder reads.
        let _g = self.render.lock().unwrap_or_else(|e| e.into_inner());
        for c in counts {
            for (state, v) in [
                ("allocated", c.allocated),
                ("cooling", c.cooling),
                ("free", c.free),
                ("pending_teardown", c.pending_teardown),
                ("missing", c.missing),
            ] {
                debug_assert!(POOL_STATES.contains(&state));
                self.pool_addresses
                    .get_or_create(&PoolState {
                        pool: c.name.clone(),
                        state,
                    })
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
            self.pool_size
                .get_or_create(&PoolLabel {
                    pool: c.name.clone(),
                })
                .set(i64::try_from(c.size).unwrap_or(i64::MAX));
        }
        if let Some(n) = orphan_veths {
            self.set_orphan_veths(n);
        }
        let mut out = String::with_capacity(16 << 10);
        // Writing into a String cannot fail.
        prometheus_text::encode(&mut out, &self.registry).expect("encoding into a String");
        out
    }
}

/// What the endpoint calls to render a scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Bind the endpoint (so a bad address fails the start).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serve `GET /metrics` on `listener` until `shutdown` turns true (`aliasnet_serve::metrics`:
/// other paths get 404, other methods 405, malformed requests 400; deadlines and eviction keep
/// hostile clients from holding it).
pub async fn serve(listener: TcpListener, render: Render, mut shutdown: watch::Receiver<bool>) {
    let render: aliasnet_serve::metrics::RenderFn = Arc::new(move || Ok(render()));
    aliasnet_serve::metrics::serve(listener, render, async move {
        let _ = shutdown.wait_for(|s| *s).await;
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_the_documented_names() {
        let m = Metrics::new(&["a".into(), "nic".into()], &["nic".into()]);
        m.allocated("a");
        m.released("a");
        m.allocation_error(Some("bogus"), ErrorKind::UnknownPool);
        m.allocation_error(Some("a"), ErrorKind::PoolExhausted);
        m.allocation_duration(Duration::from_micros(700));
        m.metadata_refresh("nic", RefreshResult::Throttled);
        m.metadata_success("nic", 1_700_000_000_500);
        m.reconcile_released();
        m.cni_operation("ADD", 0, Duration::from_millis(12))
            .unwrap();
        assert!(m.cni_operation("FROB", 0, Duration::ZERO).is_err());
        assert!(m.cni_operation("del", 5000, Duration::ZERO).is_err());
        let text = m.render(
            &[PoolCounts {
                name: "a".into(),
                size: 10,
                allocated: 3,
                cooling: 2,
                pending_teardown: 1,
                free: 4,
                missing: 0,
            }],
            Some(2),
        );
        for want in [
            "# TYPE aliasnet_ipam_pool_addresses gauge",
            "aliasnet_ipam_pool_addresses{pool=\"a\",state=\"free\"} 4",
            "aliasnet_ipam_pool_size{pool=\"a\"} 10",
            "# TYPE aliasnet_ipam_allocations_total counter",
            "aliasnet_ipam_allocations_total{pool=\"a\"} 1",
            "aliasnet_ipam_allocations_total{pool=\"nic\"} 0",
            "aliasnet_ipam_releases_total{pool=\"a\"} 1",
            "aliasnet_ipam_allocation_errors_total{pool=\"\",reason=\"unknown_pool\"} 1",
            "aliasnet_ipam_allocation_errors_total{pool=\"a\",reason=\"pool_exhausted\"} 1",
            "aliasnet_ipam_allocation_duration_seconds_bucket{le=\"0.001\"} 1",
            "aliasnet_ipam_allocation_duration_seconds_count 1",
            "aliasnet_ipam_metadata_refresh_total{pool=\"nic\",result=\"throttled\"} 1",
            "aliasnet_ipam_metadata_refresh_total{pool=\"nic\",result=\"ok\"} 0",
            "aliasnet_ipam_metadata_last_success_timestamp_seconds{pool=\"nic\"} 1700000000.5",
            "aliasnet_ipam_orphan_veths 2",
            "aliasnet_ipam_reconcile_released_total 1",
            "aliasnet_cni_operations_total{verb=\"add\",code=\"0\"} 1",
            "aliasnet_cni_operation_duration_seconds_bucket{verb=\"add\",code=\"0\",le=\"0.025\"} 1",
            "aliasnet_build_info{component=\"ipamd\",version=\"",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert!(!text.contains("bogus"), "user input leaked into a label");
    }
}
