use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/aliasnet/ipamd.toml"))
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

const FULL: &str = r#"
socket = "/run/aliasnet/ipamd.sock"
state_dir = "/var/lib/aliasnet/ipam"
spool_dir = "/var/lib/aliasnet/spool"
cooldown = "130s"
on_only_cooling = "fail"
host_veth_prefix = "ali"
log_level = "info"
[[pool]]
name = "secondary"
source = "static"
cidrs = ["10.240.1.0/24"]
ranges = ["10.240.2.10-10.240.2.20"]
ips = ["10.240.3.7"]
exclude = ["10.240.1.0/30", "10.240.1.255"]
"#;

#[test]
fn full_example_parses() {
    let c = parse(FULL).unwrap();
    assert_eq!(c.cooldown, Duration::from_secs(130));
    assert_eq!(c.on_only_cooling, OnOnlyCooling::Fail);
    assert_eq!(c.pools.len(), 1);
    let p = &c.pools[0];
    // 256 - 4 - 1 + 11 + 1
    assert_eq!(p.size, 263);
    assert_eq!(p.ranges[0].to_string(), "10.240.1.4-10.240.1.254");
    assert_eq!(p.ranges[1].to_string(), "10.240.2.10-10.240.2.20");
    assert_eq!(p.ranges[2].to_string(), "10.240.3.7");
    assert!(c.warnings.is_empty());
}

#[test]
fn defaults_apply() {
    let c = parse("[[pool]]\nname=\"p\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n").unwrap();
    assert_eq!(c.socket, Path::new("/run/aliasnet/ipamd.sock"));
    assert_eq!(c.cooldown, DEFAULT_COOLDOWN);
    assert_eq!(c.host_veth_prefix, "ali");
}

#[test]
fn durations() {
    assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    for bad in ["", "10", "s", "10x", "1.5s", "-1s"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn invalid_configs_name_the_field() {
    let pool = |body: &str| format!("[[pool]]\nname=\"p\"\nsource=\"static\"\n{body}\n");
    let cases = [
        (pool("cidrs=[\"10.0.0.0/33\"]"), "cidrs[0]"),
        (pool("cidrs=[\"10.0.0.5/24\"]"), "did you mean 10.0.0.0/24"),
        (pool("cidrs=[\"banana\"]"), "cidrs[0]"),
        (pool("ranges=[\"10.0.0.9-10.0.0.1\"]"), "ranges[0]"),
        (pool("ips=[\"10.0.0.256\"]"), "ips[0]"),
        (pool("exclude=[\"10.0.0.1\"]"), "no addresses"),
        (
            pool("ips=[\"10.0.0.1\"]\nexclude=[\"10.0.0.0/24\"]"),
            "pool would be empty",
        ),
        (pool("ips=[\"10.0.0.1\"]\nmtu=5"), "unknown field `mtu`"),
        (
            format!("colour=\"red\"\n{}", pool("ips=[\"10.0.0.1\"]")),
            "unknown field `colour`",
        ),
        (
            format!("cooldown=\"soon\"\n{}", pool("ips=[\"10.0.0.1\"]")),
            "`cooldown`",
        ),
        (
            format!("on_only_cooling=\"panic\"\n{}", pool("ips=[\"10.0.0.1\"]")),
            "on_only_cooling",
        ),
        (
            format!("host_veth_prefix=\"a/b\"\n{}", pool("ips=[\"10.0.0.1\"]")),
            "`host_veth_prefix`",
        ),
        (
            format!("state_dir=\"relative\"\n{}", pool("ips=[\"10.0.0.1\"]")),
            "`state_dir`",
        ),
        (
            format!(
                "{}{}",
                pool("ips=[\"10.0.0.1\"]"),
                pool("ips=[\"10.0.0.2\"]")
            ),
            "duplicate pool name 'p'",
        ),
        (
            pool("cidrs=[\"10.0.0.0/24\"]\nips=[\"10.0.0.7\"]"),
            "overlaps",
        ),
        (
            "[[pool]]\nname=\"p\"\nsource=\"azure\"\nips=[\"10.0.0.1\"]\n".to_owned(),
            "unknown source",
        ),
        (
            "[[pool]]\nname=\"\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n".to_owned(),
            "pool[0].name",
        ),
        ("socket=\"/run/x.sock\"\n".to_owned(), "no [[pool]]"),
        (pool("cidrs=[\"10.0.0.0/8\"]"), "at most"),
    ];
    for (text, want) in cases {
        let e = err(&text);
        assert!(
            e.contains(want),
            "config:\n{text}\nerror {e:?} lacks {want:?}"
        );
        assert!(e.contains("/etc/aliasnet/ipamd.toml"), "{e}");
    }
}

#[test]
fn overlapping_pools_are_refused() {
    let e = err(
        "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/24\"]\n\
         [[pool]]\nname=\"b\"\nsource=\"static\"\nranges=[\"10.0.0.200-10.0.1.5\"]\n",
    );
    assert!(e.contains("pools 'a' and 'b' overlap"), "{e}");
    assert!(e.contains("10.0.0.200"), "{e}");
}

#[test]
fn excluded_addresses_may_belong_to_another_pool() {
    let c = parse(
        "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/24\"]\nexclude=[\"10.0.0.5\"]\n\
         [[pool]]\nname=\"b\"\nsource=\"static\"\nips=[\"10.0.0.5\"]\n",
    )
    .unwrap();
    assert_eq!(c.total_addresses(), 256);
}

#[test]
fn exclusion_outside_pool_warns() {
    let c = parse(
        "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/30\"]\nexclude=[\"10.9.9.9\"]\n",
    )
    .unwrap();
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
}

#[test]
fn prefix_and_metadata_pools() {
    let c = parse(
        "metrics_address = \"\"\nreconcile_interval = \"0s\"\nreconcile_grace = \"2m\"\n\
         [[pool]]\nname=\"blocks\"\nsource=\"prefixes\"\nprefixes=[\"10.64.0.0/28\", \"10.64.0.16/28\"]\n\
         [[pool]]\nname=\"nic\"\nsource=\"azure-imds\"\nexclude=[\"10.1.0.9\"]\n",
    )
    .unwrap();
    assert_eq!(c.metrics_address, None);
    assert_eq!(c.reconcile_interval, Duration::ZERO);
    assert_eq!(c.reconcile_grace, Duration::from_secs(120));
    assert_eq!(c.pools[0].source, PoolSource::Prefixes);
    assert_eq!(c.pools[0].size, 32);
    let imds = c.pools[1].imds.as_ref().unwrap();
    assert_eq!(imds.url, DEFAULT_IMDS_URL);
    assert_eq!(imds.authority, "169.254.169.254:80");
    assert_eq!(imds.refresh_min, Duration::from_secs(4));
    assert_eq!(imds.refresh_max, Duration::from_secs(1024));
    assert!(c.pools[1].is_excluded(u32::from(Ipv4Addr::new(10, 1, 0, 9)).into()));
    let six = parse(
        "[[pool]]\nname=\"nic6\"\nsource=\"azure-imds\"\nfamily=\"ipv6\"\n\
         exclude=[\"fd00:8::99\", \"10.1.0.9\"]\n",
    )
    .unwrap();
    assert_eq!(six.pools[0].family, aliasnet_ipam_proto::Family::Ipv6);
    assert!(six.pools[0].is_excluded(u128::from("fd00:8::99".parse::<Ipv6Addr>().unwrap())));
    // Only the exclusion of the pool's family is kept (the other is warned about).
    assert_eq!(six.pools[0].exclude.len(), 1);
    assert!(six.pools[0].imds.is_some());
    assert_eq!(six.warnings.len(), 1, "{:?}", six.warnings);
    let d = parse("[[pool]]\nname=\"p\"\nsource=\"static\"\nips=[\"10.0.0.1\"]\n").unwrap();
    assert_eq!(d.metrics_address, Some("127.0.0.1:9545".parse().unwrap()));
    assert_eq!(d.reconcile_grace, DEFAULT_RECONCILE_GRACE);
}

#[test]
fn invalid_new_keys_name_the_field() {
    let p = |src: &str, body: &str| format!("[[pool]]\nname=\"p\"\nsource=\"{src}\"\n{body}\n");
    let cases = [
        (p("prefixes", "prefixes=[\"10.64.0.1/28\"]"), "prefixes[0]"),
        (p("prefixes", ""), "lists no blocks"),
        (
            p("prefixes", "cidrs=[\"10.64.0.0/28\"]"),
            "pool 'p'.cidrs`: not used by source \"prefixes\"",
        ),
        (
            p("static", "prefixes=[\"10.64.0.0/28\"]\nips=[\"10.0.0.1\"]"),
            "'p'.prefixes",
        ),
        (p("azure-imds", "ips=[\"10.0.0.1\"]"), "'p'.ips"),
        (
            p("azure-imds", "url=\"https://169.254.169.254/x\""),
            "must start with http://",
        ),
        (
            p("azure-imds", "url=\"http://10.0.0.1/x\""),
            "neither loopback",
        ),
        (
            p("azure-imds", "url=\"http://metadata/x\""),
            "IPv4 address literal",
        ),
        (p("azure-imds", "url=\"http://127.0.0.1:0/x\""), "bad port"),
        (p("azure-imds", "refresh_min=\"10ms\""), "refresh_min"),
        (
            p("azure-imds", "refresh_min=\"10s\"\nrefresh_max=\"5s\""),
            "refresh_max",
        ),
        (p("azure-imds", "timeout=\"0s\""), "timeout"),
        (
            p("azure-imds", "family=\"ipv5\""),
            "'p'.family`: unknown family",
        ),
        (
            p("static", "ips=[\"fd00::1\"]\nfamily=\"ipv6\""),
            "'p'.family`: not used by source \"static\"",
        ),
        (
            p("azure-imds", "family=\"ipv6\"\nexclude=[\"fd00::/200\"]"),
            "'p'.exclude[0]",
        ),
        (
            format!(
                "metrics_address=\"localhost\"\n{}",
                p("static", "ips=[\"10.0.0.1\"]")
            ),
            "`metrics_address`",
        ),
        (
            format!(
                "reconcile_grace=\"1s\"\n{}",
                p("static", "ips=[\"10.0.0.1\"]")
            ),
            "`reconcile_grace`",
        ),
        (
            format!(
                "reconcile_interval=\"10ms\"\n{}",
                p("static", "ips=[\"10.0.0.1\"]")
            ),
            "`reconcile_interval`",
        ),
    ];
    for (text, want) in cases {
        let e = err(&text);
        assert!(
            e.contains(want),
            "config:\n{text}\nerror {e:?} lacks {want:?}"
        );
    }
}

#[test]
fn a_slash_14_fits() {
    let c = parse("[[pool]]\nname=\"big\"\nsource=\"static\"\ncidrs=[\"10.64.0.0/14\"]\n").unwrap();
    assert_eq!(c.total_addresses(), 262_144);
}

#[test]
fn cidr_messages_name_the_mistake() {
    use super::addr::parse_cidr;
    let e = |s: &str| parse_cidr(s).unwrap_err().to_string();
    assert_eq!(
        e("banana"),
        "\"banana\" is not a CIDR (expected a.b.c.d/len)"
    );
    assert_eq!(
        e("10.0.0/24"),
        "\"10.0.0/24\": \"10.0.0\" is not an IPv4 address"
    );
    assert_eq!(
        e("10.0.0.0/33"),
        "\"10.0.0.0/33\": prefix length must be 0..=32"
    );
    assert_eq!(
        e("10.0.0.0/x"),
        "\"10.0.0.0/x\": prefix length must be 0..=32"
    );
    assert_eq!(
        e("10.0.0.5/24"),
        "\"10.0.0.5/24\" has host bits set (did you mean 10.0.0.0/24?)"
    );
    assert_eq!(
        e("10.0.0.5/0"),
        "\"10.0.0.5/0\" has host bits set (did you mean 0.0.0.0/0?)"
    );
    // The same mistakes in IPv6.
    assert_eq!(
        e("fd00::"),
        "\"fd00::\" is not a CIDR (expected an IPv6 prefix such as fd00::/112)"
    );
    assert_eq!(
        e("fd00:::/64"),
        "\"fd00:::/64\": \"fd00:::\" is not an IPv6 address"
    );
    assert_eq!(
        e("fd00::/129"),
        "\"fd00::/129\": prefix length must be 0..=128"
    );
    assert_eq!(
        e("fd00::5/120"),
        "\"fd00::5/120\" has host bits set (did you mean fd00::/120?)"
    );
    let whole = |s: &str| parse_cidr(s).unwrap().to_string();
    assert_eq!(whole(" 10.0.0.0 / 30 "), "10.0.0.0-10.0.0.3");
    assert_eq!(whole("10.0.0.7/32"), "10.0.0.7");
    assert_eq!(whole("0.0.0.0/0"), "0.0.0.0-255.255.255.255");
    assert_eq!(whole("fd00::/126"), "fd00::-fd00::3");
}

#[test]
fn ipv6_cidrs_skip_the_subnet_router_anycast_address_and_prefixes_do_not() {
    let v6 = |s: &str| u128::from(s.parse::<Ipv6Addr>().unwrap());
    let one = |body: &str| {
        let c = parse(&format!("[[pool]]\nname=\"p\"\n{body}\n")).unwrap();
        c.pools.into_iter().next().unwrap()
    };
    // Each CIDR's all-zero host address is left out; listed ranges and ips are not touched.
    let p = one(
        "source=\"static\"\ncidrs=[\"fd00:240::/112\", \"fd00:241::/126\"]\n\
         ranges=[\"fd00:250::-fd00:250::3\"]\nips=[\"fd00:260::\"]",
    );
    assert_eq!(p.size, 65_535 + 3 + 4 + 1);
    let first: Vec<u128> = p.ranges.iter().map(|r| r.bounds().0).collect();
    assert_eq!(
        first,
        [
            v6("fd00:240::1"),
            v6("fd00:241::1"),
            v6("fd00:250::"),
            v6("fd00:260::")
        ]
    );
    // /127 and /128 have no subnet-router anycast address (RFC 6164).
    assert_eq!(one("source=\"static\"\ncidrs=[\"fd00:240::/127\"]").size, 2);
    assert_eq!(
        one("source=\"static\"\ncidrs=[\"fd00:240::7/128\"]").size,
        1
    );
    // A delegated prefix is routed to the node whole: every address is usable.
    let d = one("source=\"prefixes\"\nprefixes=[\"2001:db8:1:2:3::/80\", \"fd00:9::/112\"]");
    assert_eq!(d.size, (1 << 48) + 65_536);
    assert_eq!(d.ranges[0].bounds().0, v6("2001:db8:1:2:3::"));
    assert_eq!(d.ranges[1].bounds().0, v6("fd00:9::"));
    // An exclusion of the anycast address as well is harmless.
    let e = one(
        "source=\"static\"\ncidrs=[\"fd00:240::/120\"]\nexclude=[\"fd00:240::\", \"fd00:240::ff\"]",
    );
    assert_eq!(e.size, 254);
}

#[test]
fn reserved_addresses_are_left_out_of_static_and_prefix_pools_with_a_warning() {
    let one = |body: &str| parse(&format!("[[pool]]\nname=\"p\"\n{body}\n"));
    // A pool of nothing else is refused, naming the addresses and why.
    let refused = |body: &str, named: &[&str]| {
        let e = one(body).unwrap_err().to_string();
        assert!(named.iter().all(|n| e.contains(n)), "{e}");
    };
    // Otherwise the rest is served, and a warning names each reserved part.
    let served = |body: &str, size: u64, named: &[&str]| {
        let c = one(body).unwrap();
        assert_eq!(c.pools[0].size, size, "{body}");
        for n in named {
            assert!(
                c.warnings.iter().any(|w| w.contains(n)),
                "{n}: {:?}",
                c.warnings
            );
        }
        c
    };
    // The pods' gateway among them.
    refused(
        "source=\"static\"\nranges=[\"169.254.1.1-169.254.1.4\"]",
        &["169.254.1.1-169.254.1.4", "link-local"],
    );
    let c = served(
        "source=\"static\"\ncidrs=[\"10.0.0.0/30\"]\n\
         ips=[\"0.0.0.0\", \"127.0.0.5\", \"169.254.1.1\", \"224.0.0.1\", \"255.255.255.255\"]",
        4,
        &[
            "0.0.0.0",
            "127.0.0.5",
            "169.254.1.1",
            "224.0.0.1",
            "255.255.255.255",
        ],
    );
    let inside = |a: &str| {
        let a = u32::from(a.parse::<Ipv4Addr>().unwrap());
        c.pools[0].ranges.iter().any(|r| r.contains(a.into()))
    };
    assert!(inside("10.0.0.3") && !inside("169.254.1.1") && !inside("224.0.0.1"));
    // Delegated blocks likewise.
    served(
        "source=\"prefixes\"\nprefixes=[\"10.64.0.0/28\", \"169.254.0.0/28\"]",
        16,
        &["169.254.0.0-169.254.0.15"],
    );
    refused(
        "source=\"prefixes\"\nprefixes=[\"224.0.0.0/28\"]",
        &["224.0.0.0-224.0.0.15", "multicast"],
    );
    // IPv6: link-local (the gateway fe80::1 among them) and multicast.
    refused(
        "source=\"static\"\nranges=[\"fe80::1-fe80::4\"]",
        &["fe80::1-fe80::4", "link-local"],
    );
    served(
        "source=\"static\"\ncidrs=[\"fd00:240::/126\"]\nips=[\"ff02::1\", \"fe80::1\"]",
        3,
        &["ff02::1", "fe80::1"],
    );
    served(
        "source=\"prefixes\"\nprefixes=[\"fd00:9::/112\", \"fe80::/112\"]",
        65_536,
        &["fe80::-fe80::ffff"],
    );
}

#[test]
fn ipv6_pools_are_accepted_and_mixing_is_refused() {
    let c = parse(
        "[[pool]]\nname=\"p6\"\nsource=\"static\"\ncidrs=[\"fd00:240::/112\"]\n\
         ranges=[\"fd00:241::10-fd00:241::1f\"]\nips=[\"fd00:242::1\"]\n\
         exclude=[\"fd00:240::/120\", \"fd00:241::10\", \"10.0.0.1\"]\n\
         [[pool]]\nname=\"aws\"\nsource=\"prefixes\"\nprefixes=[\"2001:db8:1:2:3::/80\"]\n",
    )
    .unwrap();
    assert_eq!(c.pools[0].family, aliasnet_ipam_proto::Family::Ipv6);
    assert_eq!(c.pools[0].size, 65536 - 256 + 16 - 1 + 1);
    assert_eq!(c.pools[1].size, 1 << 48);
    assert!(
        c.warnings.iter().any(|w| w.contains("exclude[2]")),
        "{:?}",
        c.warnings
    );
    let e = err(
        "[[pool]]\nname=\"mixed\"\nsource=\"static\"\ncidrs=[\"10.0.0.0/30\", \"fd00::/126\"]\n",
    );
    assert!(
        e.contains("pool 'mixed'") && e.contains("mixes IPv4"),
        "{e}"
    );
    let e = err("[[pool]]\nname=\"low\"\nsource=\"static\"\ncidrs=[\"::/64\"]\n");
    assert!(e.contains("::/96"), "{e}");
    let e = err(
        "[[pool]]\nname=\"a\"\nsource=\"static\"\ncidrs=[\"fd00::/120\"]\n\
         [[pool]]\nname=\"b\"\nsource=\"static\"\nips=[\"fd00::7\"]\n",
    );
    assert!(e.contains("overlap"), "{e}");
    // A /64 is accepted: it is never enumerated.
    let c = parse("[[pool]]\nname=\"big\"\nsource=\"static\"\ncidrs=[\"fd00:1::/64\"]\n").unwrap();
    assert_eq!(c.pools[0].size, u64::MAX);
}
