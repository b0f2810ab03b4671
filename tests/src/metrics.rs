//! Metrics over the fabric: netns-local HTTP to the daemons' `/metrics`, `promtool`, and a
//! real (Debian) Prometheus running in a node's netns with the shipped rules.

use std::{
    fs::File,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{netns::Netns, ChildGuard};

/// Where the fabric's aliasnet-ipamd serves `/metrics` inside a node's netns.
pub const IPAMD_METRICS: &str = "127.0.0.1:9545";
/// Where the fabric's aliasnet-shaperd serves `/metrics` inside a node's netns.
pub const SHAPERD_METRICS: &str = "127.0.0.1:9546";

/// Runs `f` on a thread inside the network namespace `ns`; sockets it opens stay there.
pub fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> T + Send) -> T {
    aliasnet_netns::run_in(ns, f).unwrap_or_else(|e| panic!("run in {}: {e}", ns.display()))
}

/// One raw HTTP/1.0 exchange with `addr` inside `ns`: (status, body). `None` when nothing
/// listens (yet).
pub fn http_raw(ns: &Path, addr: &str, request: &[u8]) -> Option<(u16, String)> {
    let addr: SocketAddr = addr.parse().expect("socket address");
    let request = request.to_vec();
    in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
        s.write_all(&request).ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    })
}

/// `GET path` from `addr` inside `ns`: (status, body).
pub fn http_get(ns: &Path, addr: &str, path: &str) -> Option<(u16, String)> {
    http_raw(
        ns,
        addr,
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
}

/// Polls `addr/metrics` in `ns` until it answers 200.
pub fn wait_metrics(ns: &Path, addr: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some((200, body)) = http_get(ns, addr, "/metrics") {
            return body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no metrics at {addr} after 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `promtool check metrics` on `text`: exit code and output.
pub fn promtool_check_metrics(text: &str) -> (i32, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Asserts `promtool check KIND FILE` succeeds (`config`, `rules`).
#[track_caller]
pub fn assert_promtool_check(kind: &str, file: &Path) {
    let out = Command::new("promtool")
        .args(["check", kind])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("promtool (Debian package prometheus) is needed: {e}"));
    assert!(
        out.status.success(),
        "promtool check {kind} {}: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A free TCP port on the loopback of `ns`.
pub fn free_port(ns: &Path) -> u16 {
    in_netns(ns, || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind loopback")
            .local_addr()
            .expect("local addr")
            .port()
    })
}

/// Debian's Prometheus in a node's netns, stopped (SIGTERM) on drop.
pub struct Prometheus {
    _child: ChildGuard,
    ns: PathBuf,
    addr: String,
    dir: tempfile::TempDir,
}

/// The Prometheus rules shipped in install/monitoring.
pub fn rules_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../install/monitoring/aliasnet-rules.yml")
}

/// The Grafana dashboard shipped in install/monitoring.
pub fn dashboard_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../install/monitoring/aliasnet-dashboard.json")
}

impl Prometheus {
    pub fn start(ns: &Netns) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("aliasnet-prometheus-")
            .tempdir()
            .expect("tempdir");
        let config = format!(
            r#"global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: aliasnet-ipamd
    static_configs:
      - targets: ['{IPAMD_METRICS}']
  - job_name: aliasnet-shaperd
    static_configs:
      - targets: ['{SHAPERD_METRICS}']
"#,
            rules = rules_file().canonicalize().expect("rules file").display()
        );
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config).expect("write prometheus.yml");
        assert_promtool_check("config", &cfg);
        let port = free_port(&ns.path());
        let addr = format!("127.0.0.1:{port}");
        let log = File::create(dir.path().join("prometheus.log")).expect("log");
        let child = ns
            .command("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let p = Self {
            _child: ChildGuard(child),
            ns: ns.path(),
            addr,
            dir,
        };
        let start = Instant::now();
        while !matches!(http_get(&p.ns, &p.addr, "/-/ready"), Some((200, _))) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "prometheus not ready after 30 s; log:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    pub fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(&self.ns, &self.addr, path)
            .unwrap_or_else(|| panic!("prometheus unreachable for {path}"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: HTTP {status}, not JSON ({e}): {body}"));
        v
    }

    /// An instant query; panics on a PromQL error (a broken expression must fail the test).
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let v = self.api(&format!("/api/v1/query?query={}", urlencode(expr)));
        assert_eq!(v["status"], "success", "query {expr:?} failed: {v}");
        match v["data"]["resultType"].as_str() {
            Some("vector" | "matrix") => {
                v["data"]["result"].as_array().cloned().unwrap_or_default()
            }
            // A scalar or string always "has data".
            _ => vec![v["data"]["result"].clone()],
        }
    }

    /// The single value of `expr`, if it returns exactly one series.
    pub fn value(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr);
        match r.as_slice() {
            [one] => one["value"][1].as_str().and_then(|s| s.parse().ok()),
            _ => None,
        }
    }

    /// Polls until `expr` has the value `want`.
    #[track_caller]
    pub fn wait_value(&self, expr: &str, want: f64, timeout: Duration) {
        let start = Instant::now();
        loop {
            let got = self.value(expr);
            if got == Some(want) {
                return;
            }
            if start.elapsed() > timeout {
                panic!(
                    "{expr} = {got:?} after {timeout:?}, want {want}; full result: {:?}",
                    self.query(expr)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Polls until `expr` returns data.
    #[track_caller]
    pub fn wait_data(&self, expr: &str, timeout: Duration) -> Vec<Value> {
        self.wait_data_ctx(expr, timeout, "")
    }

    /// As `wait_data`, with `context` in the failure message.
    #[track_caller]
    pub fn wait_data_ctx(&self, expr: &str, timeout: Duration, context: &str) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let r = self.query(expr);
            if !r.is_empty() {
                return r;
            }
            assert!(
                start.elapsed() < timeout,
                "{expr} returned no data within {timeout:?}; {context}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Every `expr` string in the dashboard JSON (panel targets, nested rows included).
pub fn dashboard_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

/// The dashboard's template variables with the values its queries get by default: the
/// "All" value of a variable that includes all and selects it, else the current value.
pub fn dashboard_variables(dash: &Value) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] != "datasource")
        .map(|v| {
            let name = v["name"].as_str().expect("variable name").to_owned();
            let current = v["current"]["value"].as_str().unwrap_or_default();
            let value = if current == "$__all" {
                v["allValue"].as_str().expect("allValue")
            } else {
                current
            };
            (name, value.to_owned())
        })
        .collect();
    // Longest names first: `$price` must not replace the start of `$price_per_gb`.
    vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    vars
}

/// A dashboard expression as Grafana sends it with the dashboard's defaults (`vars`, from
/// [`dashboard_variables`]), a 1-minute rate window and a 5-minute range.
pub fn grafana_to_promql(expr: &str, vars: &[(String, String)]) -> String {
    let mut e = expr
        .replace("$__rate_interval", "1m")
        .replace("$__range", "5m");
    for (name, value) in vars {
        for form in [
            format!("${{{name}:raw}}"),
            format!("${{{name}}}"),
            format!("${name}"),
        ] {
            e = e.replace(&form, value);
        }
    }
    assert!(!e.contains('$'), "an unknown variable in {expr:?}: {e}");
    e
}
