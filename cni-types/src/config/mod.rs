//! The network configuration on stdin: the CNI envelope (`cniVersion`, `name`, `type`,
//! `capabilities`, `runtimeConfig`, `args`, `prevResult`, `cni.dev/*`) plus aliasnet's keys.
//!
//! Every key the parser reads is in [`KEYS`]; `docs/config/plugin.md` documents each of them
//! (checked by `tests/config_doc.rs`). Unknown keys are tolerated. A value of the wrong type or
//! out of range is a code-7 error naming the key.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::Duration,
};

use serde_json::{Map, Value};

use crate::{CniError, CniVersion, Dns, IpNet, RuntimeConfig};

pub const DEFAULT_MTU_MIN: u32 = 68;
pub const DEFAULT_TIMEOUT_MS: u64 = 5000;
/// Default `bpfPinRoot`: aliasnet-shaperd's default pin root.
pub const DEFAULT_BPF_PIN_ROOT: &str = "/sys/fs/bpf/aliasnet";

/// Every top-level key the parser reads: the CNI envelope, then aliasnet's own. Reading a key
/// not listed here is a debug assertion, so the list and the parser cannot drift apart.
pub const KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "capabilities",
    "runtimeConfig",
    "args",
    "prevResult",
    "cni.dev/valid-attachments",
    "cni.dev/attachments",
    "ipamSocket",
    "spoolDir",
    "pool",
    "mtu",
    "hostVethPrefix",
    "podRoutes",
    "ipFamilies",
    "asyncTeardown",
    "timeoutMs",
    "logFile",
    "logLevel",
    "dns",
    "datapath",
    "bpfPinRoot",
];

/// `datapath`: what ADD does about the eBPF datapath (classification, counters, shaping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DatapathMode {
    /// Every pod is attached; ADD fails (code 11) until aliasnet-shaperd has pinned it.
    #[default]
    Required,
    /// Attach when the pins exist; otherwise warn and go on, unless the pod asks for a
    /// bandwidth limit (then code 11: a limit is never silently dropped).
    Optional,
    /// Never touch bpf; a requested bandwidth limit is a config error (code 7).
    Off,
}

impl DatapathMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Required => "required",
            Self::Optional => "optional",
            Self::Off => "off",
        }
    }
}

/// An address family a pod can be given (`ipFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    Ipv4,
    Ipv6,
}

impl IpFamily {
    pub fn of(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Self::Ipv4,
            IpAddr::V6(_) => Self::Ipv6,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        }
    }

    /// The family's default route (`0.0.0.0/0` or `::/0`).
    pub fn default_route(self) -> IpNet {
        match self {
            Self::Ipv4 => IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            Self::Ipv6 => IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
        }
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Log verbosity for `logFile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// One entry of `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GcAttachment {
    pub container_id: String,
    pub ifname: String,
}

/// A decoded config whose `cniVersion` is known, before the other fields are checked. Split
/// out so an error in a later field can still be reported in the config's version.
#[derive(Debug, Clone)]
pub struct RawConf {
    pub version: CniVersion,
    obj: Map<String, Value>,
}

impl RawConf {
    /// JSON decode (code 6) and `cniVersion` (code 7 if missing, 1 if unsupported).
    pub fn decode(bytes: &[u8]) -> Result<Self, CniError> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| CniError::decode(format!("cannot decode network config: {e}")))?;
        let Value::Object(obj) = v else {
            return Err(CniError::decode("network config must be a JSON object"));
        };
        let version = match Fields(&obj).get("cniVersion") {
            Some(Value::String(s)) => CniVersion::parse(s)?,
            None => {
                return Err(CniError::config("cniVersion", "missing"));
            }
            Some(_) => return Err(CniError::config("cniVersion", "must be a string")),
        };
        Ok(Self { version, obj })
    }

    /// The raw JSON object.
    pub fn object(&self) -> &Map<String, Value> {
        &self.obj
    }
}

/// The validated configuration of one aliasnet plugin invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    pub cni_version: CniVersion,
    pub name: String,
    pub plugin_type: String,
    pub ipam_socket: PathBuf,
    pub spool_dir: PathBuf,
    pub pool: Option<String>,
    pub mtu: Option<u32>,
    pub host_veth_prefix: String,
    pub log_file: Option<PathBuf>,
    pub log_level: LogLevel,
    pub async_teardown: bool,
    pub timeout: Duration,
    pub dns: Option<Dns>,
    /// Destinations routed via the link-local gateway inside the pod (network addresses, both
    /// families); see [`NetConf::pod_routes_for`].
    pub pod_routes: Vec<IpNet>,
    /// `ipFamilies`: exactly these families (sorted, no duplicates); `None` = whatever the
    /// daemon's pools serve.
    pub ip_families: Option<Vec<IpFamily>>,
    pub capabilities: Map<String, Value>,
    pub runtime_config: RuntimeConfig,
    /// `args` (CNI conventions), kept verbatim.
    pub args: Option<Map<String, Value>>,
    /// `prevResult`, verbatim: parse with [`crate::CniResult::from_prev_result`] when needed,
    /// so DEL never fails on a broken one.
    pub prev_result: Option<Value>,
    /// `cni.dev/valid-attachments`, or the older `cni.dev/attachments`.
    pub valid_attachments: Option<Vec<GcAttachment>>,
    /// bpffs directory of the pinned datapath.
    pub bpf_pin_root: PathBuf,
    pub datapath: DatapathMode,
}

impl NetConf {
    /// Decode and validate in one step.
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        RawConf::decode(bytes)?.validate()
    }

    /// The pod routes of `family`: its entries of `podRoutes`, or the family's default route
    /// when the list has none of that family (so an IPv4-only list still gives an IPv6 address
    /// a way out).
    pub fn pod_routes_for(&self, family: IpFamily) -> Vec<IpNet> {
        let routes: Vec<IpNet> = self
            .pod_routes
            .iter()
            .filter(|r| IpFamily::of(r.addr) == family)
            .copied()
            .collect();
        if routes.is_empty() {
            vec![family.default_route()]
        } else {
            routes
        }
    }
}

impl RawConf {
    /// Check every field.
    pub fn validate(self) -> Result<NetConf, CniError> {
        let f = Fields(&self.obj);
        let name = f.req_str("name")?.to_owned();
        crate::validate_network_name(&name).map_err(|e| CniError::config("name", e))?;
        let plugin_type = f.req_str("type")?.to_owned();

        let ipam_socket = f
            .opt_abs_path("ipamSocket")?
            .unwrap_or_else(|| PathBuf::from("/run/aliasnet/ipamd.sock"));
        let spool_dir = f
            .opt_abs_path("spoolDir")?
            .unwrap_or_else(|| PathBuf::from("/var/lib/aliasnet/spool"));
        let pool = match f.opt_str("pool")? {
            Some("") => return Err(CniError::config("pool", "must not be empty")),
            p => p.map(str::to_owned),
        };
        let mtu = match f.opt_u64("mtu")? {
            None => None,
            Some(m) if (DEFAULT_MTU_MIN as u64..=65535).contains(&m) => Some(m as u32),
            Some(m) => {
                return Err(CniError::config(
                    "mtu",
                    format!("must be between 68 and 65535, got {m}"),
                ))
            }
        };
        let host_veth_prefix = f.opt_str("hostVethPrefix")?.unwrap_or("ali").to_owned();
        if host_veth_prefix.is_empty()
            || host_veth_prefix.len() > 8
            || !host_veth_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(CniError::config(
                "hostVethPrefix",
                format!("{host_veth_prefix:?} must be 1 to 8 characters of [A-Za-z0-9_-]"),
            ));
        }
        let log_file = f.opt_abs_path("logFile")?;
        let log_level = match f.opt_str("logLevel")? {
            None => LogLevel::Info,
            Some(s) => match s.to_ascii_lowercase().as_str() {
                "error" => LogLevel::Error,
                "warn" | "warning" => LogLevel::Warn,
                "info" => LogLevel::Info,
                "debug" => LogLevel::Debug,
                "trace" => LogLevel::Trace,
                _ => {
                    return Err(CniError::config(
                        "logLevel",
                        format!("{s:?} is not one of error, warn, info, debug, trace"),
                    ))
                }
            },
        };
        let async_teardown = f.opt_bool("asyncTeardown")?.unwrap_or(true);
        let bpf_pin_root = f
            .opt_abs_path("bpfPinRoot")?
            .unwrap_or_else(|| PathBuf::from(DEFAULT_BPF_PIN_ROOT));
        let datapath = match f.opt_str("datapath")? {
            None => DatapathMode::default(),
            Some(s) => match s.to_ascii_lowercase().as_str() {
                "required" => DatapathMode::Required,
                "optional" => DatapathMode::Optional,
                "off" => DatapathMode::Off,
                _ => {
                    return Err(CniError::config(
                        "datapath",
                        format!("{s:?} is not one of required, optional, off"),
                    ))
                }
            },
        };
        let timeout_ms = f.opt_u64("timeoutMs")?.unwrap_or(DEFAULT_TIMEOUT_MS);
        if !(1..=300_000).contains(&timeout_ms) {
            return Err(CniError::config(
                "timeoutMs",
                format!("must be between 1 and 300000, got {timeout_ms}"),
            ));
        }
        let dns = match f.get("dns") {
            None => None,
            Some(v) => Some(
                serde_json::from_value::<Dns>(v.clone()).map_err(|e| CniError::config("dns", e))?,
            ),
        };
        let ip_families = f.get("ipFamilies").map(parse_ip_families).transpose()?;
        let pod_routes = match f.get("podRoutes") {
            None => ip_families
                .as_deref()
                .unwrap_or(&[IpFamily::Ipv4, IpFamily::Ipv6])
                .iter()
                .map(|f| f.default_route())
                .collect(),
            Some(v) => parse_pod_routes(v, ip_families.as_deref())?,
        };
        let capabilities = f.opt_object("capabilities")?.cloned().unwrap_or_default();
        let runtime_config = match f.get("runtimeConfig") {
            None => RuntimeConfig::default(),
            Some(v) => RuntimeConfig::parse(v)?,
        };
        let args = f.opt_object("args")?.cloned();
        let prev_result = f
            .opt_object("prevResult")?
            .map(|m| Value::Object(m.clone()));
        let valid_attachments = match ["cni.dev/valid-attachments", "cni.dev/attachments"]
            .into_iter()
            .find_map(|k| f.get(k).map(|v| (k, v)))
        {
            None => None,
            Some((k, v)) => Some(parse_attachments(k, v)?),
        };
        Ok(NetConf {
            cni_version: self.version,
            name,
            plugin_type,
            ipam_socket,
            spool_dir,
            pool,
            mtu,
            host_veth_prefix,
            log_file,
            log_level,
            async_teardown,
            timeout: Duration::from_millis(timeout_ms),
            dns,
            pod_routes,
            ip_families,
            capabilities,
            runtime_config,
            args,
            prev_result,
            valid_attachments,
            bpf_pin_root,
            datapath,
        })
    }
}

/// `ipFamilies`: a non-empty list of `"ipv4"` / `"ipv6"`, no duplicates; returned sorted
/// (IPv4 first, the order results list addresses in).
fn parse_ip_families(v: &Value) -> Result<Vec<IpFamily>, CniError> {
    const K: &str = "ipFamilies";
    let arr = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        CniError::config(K, "must be a non-empty array of \"ipv4\" and/or \"ipv6\"")
    })?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, e) in arr.iter().enumerate() {
        let field = format!("{K}[{i}]");
        let fam = match e.as_str().map(str::to_ascii_lowercase).as_deref() {
            Some("ipv4") => IpFamily::Ipv4,
            Some("ipv6") => IpFamily::Ipv6,
            _ => {
                return Err(CniError::config(
                    &field,
                    format!("{e} is not \"ipv4\" or \"ipv6\""),
                ))
            }
        };
        if out.contains(&fam) {
            return Err(CniError::config(&field, format!("{fam} is listed twice")));
        }
        out.push(fam);
    }
    out.sort();
    Ok(out)
}

/// `podRoutes`: a non-empty list of IPv4 and IPv6 CIDRs without host bits, no duplicates, and
/// none of a family `ipFamilies` leaves out.
fn parse_pod_routes(v: &Value, families: Option<&[IpFamily]>) -> Result<Vec<IpNet>, CniError> {
    let arr = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        CniError::config("podRoutes", "must be a non-empty array of IPv4/IPv6 CIDRs")
    })?;
    let mut out: Vec<IpNet> = Vec::with_capacity(arr.len());
    for (i, e) in arr.iter().enumerate() {
        let field = format!("podRoutes[{i}]");
        let s = e.as_str().ok_or_else(|| {
            CniError::config(
                &field,
                "must be a string like \"10.0.0.0/8\" or \"fd00::/8\"",
            )
        })?;
        let net: IpNet = s.parse().map_err(|e| CniError::config(&field, e))?;
        let network = network_of(net);
        if network != net {
            return Err(CniError::config(
                &field,
                format!("{s:?} has host bits set; did you mean {network}?"),
            ));
        }
        let fam = IpFamily::of(net.addr);
        if families.is_some_and(|f| !f.contains(&fam)) {
            return Err(CniError::config(
                &field,
                format!("{s:?} is {fam} but ipFamilies does not list {fam}"),
            ));
        }
        if out.contains(&net) {
            return Err(CniError::config(&field, format!("{s:?} is listed twice")));
        }
        out.push(net);
    }
    Ok(out)
}

/// `net` with its host bits cleared.
fn network_of(net: IpNet) -> IpNet {
    let addr = match net.addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(net.prefix_len))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(net.prefix_len))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
        }
    };
    IpNet::new(addr, net.prefix_len)
}

fn parse_attachments(key: &str, v: &Value) -> Result<Vec<GcAttachment>, CniError> {
    let arr = v
        .as_array()
        .ok_or_else(|| CniError::config(key, "must be an array"))?;
    arr.iter()
        .enumerate()
        .map(|(i, a)| {
            let field = format!("{key}[{i}]");
            let obj = a
                .as_object()
                .ok_or_else(|| CniError::config(&field, "must be an object"))?;
            let get = |k: &str| {
                obj.get(k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        CniError::config(&format!("{field}.{k}"), "missing or not a string")
                    })
            };
            Ok(GcAttachment {
                container_id: get("containerID")?,
                ifname: get("ifname")?,
            })
        })
        .collect()
}

/// Typed field access with errors naming the field.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        debug_assert!(
            KEYS.contains(&k),
            "config key {k:?} is read but not in KEYS"
        );
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn opt_str(&self, k: &str) -> Result<Option<&'a str>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(CniError::config(k, "must be a string")),
        }
    }

    fn req_str(&self, k: &str) -> Result<&'a str, CniError> {
        match self.opt_str(k)? {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(CniError::config(k, "missing")),
        }
    }

    fn opt_abs_path(&self, k: &str) -> Result<Option<PathBuf>, CniError> {
        match self.opt_str(k)? {
            None => Ok(None),
            Some(s) if s.starts_with('/') => Ok(Some(PathBuf::from(s))),
            Some(s) => Err(CniError::config(
                k,
                format!("{s:?} must be an absolute path"),
            )),
        }
    }

    fn opt_u64(&self, k: &str) -> Result<Option<u64>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                CniError::config(k, format!("must be a non-negative integer, got {v}"))
            }),
        }
    }

    fn opt_bool(&self, k: &str) -> Result<Option<bool>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(CniError::config(
                k,
                format!("must be true or false, got {v}"),
            )),
        }
    }

    fn opt_object(&self, k: &str) -> Result<Option<&'a Map<String, Value>>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(_) => Err(CniError::config(k, "must be an object")),
        }
    }
}

#[cfg(test)]
mod tests;
