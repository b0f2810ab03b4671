//! Downloads by destination class, limited per pod, per namespace and per node, through the
//! real `aliasnet`, `aliasnet-ipamd` and `aliasnet-shaperd` on the namespace fabric.

use aliasnet_tests::{
    fabric::{Fabric, INTERNET_IP, INTERNET_IP2},
    require_root,
    traffic::{concurrent_downloads, jain, received_bps},
};

const SECS: u32 = 4;

fn mbps(v: f64) -> f64 {
    v / 1e6
}

#[test]
fn a_namespace_shares_its_download_limit_among_its_pods() {
    require_root();
    let f = Fabric::with_limits(
        r#"
        internal_cidrs = ["10.0.0.0/8", "fd00::/8"]
        [internet]
        namespace_ingress_rate = "40M"
        [namespaces.other.internet]
        namespace_ingress_rate = "unlimited"
        "#,
        "1.0.0",
    );
    let n = f.node(1);
    let team: Vec<_> = (0..3)
        .map(|i| n.add_pod_in(&format!("t{i}"), "team", None).unwrap())
        .collect();
    let other = n.add_pod_in("o", "other", None).unwrap();
    // shaperd reconciles the aggregates within a poll of the pods epoch.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let dp = n.datapath();
    eprintln!("config {:?}", dp.config().unwrap());
    for p in team.iter().chain([&other]) {
        let r = n.record(p);
        eprintln!(
            "{} entity {} leaves {:?} flags {}",
            p.name, r.meta.entity, r.meta.agg_leaves, r.meta.flags
        );
    }
    eprintln!("entity1 {:?}", dp.entity(1).unwrap());
    for cmd in [
        vec!["tc", "-s", "class", "show", "dev", "aliasnet-nsin"],
        vec!["tc", "filter", "show", "dev", "aliasnet-nsin"],
        vec!["ip", "link"],
    ] {
        let out = n.ns.exec_status(cmd[0], &cmd[1..]).unwrap();
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    }
    let veth = team[0].result["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let out =
        n.ns.exec_status("tc", &["filter", "show", "dev", &veth, "egress"])
            .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    let clients: Vec<_> = team.iter().map(|p| &p.ns).chain([&other.ns]).collect();
    let runs = concurrent_downloads(
        &clients,
        &f.internet.name,
        &INTERNET_IP.to_string(),
        SECS,
        None,
    )
    .unwrap();
    let got: Vec<f64> = runs.iter().map(received_bps).collect();
    let team_total: f64 = got[..3].iter().sum();
    eprintln!(
        "team {:?} Mbit/s (total {:.1}, Jain {:.3}), other {:.1} Mbit/s",
        got[..3].iter().map(|v| mbps(*v)).collect::<Vec<_>>(),
        mbps(team_total),
        jain(&got[..3]),
        mbps(got[3])
    );
    let _ = INTERNET_IP2;
    let out =
        n.ns.exec_status("tc", &["-s", "class", "show", "dev", "aliasnet-nsin"])
            .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    let out =
        n.ns.exec_status("tc", &["-s", "filter", "show", "dev", &veth, "egress"])
            .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        (36e6..=42e6).contains(&team_total),
        "team total {team_total}"
    );
    assert!(jain(&got[..3]) >= 0.95, "fairness {:?}", got);
    assert!(
        got[3] > 80e6,
        "another namespace is not limited: {}",
        got[3]
    );
}
