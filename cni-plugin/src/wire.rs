//! ADD's netlink requests for a [`Wiring`]: one batch of independent requests on the two
//! sockets (host and pod), then the IPv4 pod routes, which need the gateway's /32 link route.

use std::{future::Future, pin::Pin};

use aliasnet_cni_types::CniError;

use crate::{
    nl::{nl_err, Nl, GATEWAY, GATEWAY6},
    wiring::Wiring,
};

type Op<'a> = Pin<Box<dyn Future<Output = Result<(), CniError>> + 'a>>;

/// Both ends of a fresh veth pair.
pub struct Links<'a> {
    pub host: &'a Nl,
    pub pod: &'a Nl,
    pub host_veth: &'a str,
    pub host_index: u32,
    pub ifname: &'a str,
    pub pod_index: u32,
    pub host_mac: [u8; 6],
}

/// `fut`, its netlink error described by `what`.
fn op<'a>(
    what: impl FnOnce() -> String + 'a,
    fut: impl Future<Output = Result<(), rtnetlink::Error>> + 'a,
) -> Op<'a> {
    Box::pin(async move { fut.await.map_err(|e| nl_err(what(), e)) })
}

impl Links<'_> {
    pub async fn wire(&self, w: &Wiring) -> Result<(), CniError> {
        let (host, pod, hi, pi) = (self.host, self.pod, self.host_index, self.pod_index);
        let (ifname, veth, mac) = (self.ifname, self.host_veth, &self.host_mac);
        let mut batch: Vec<Op<'_>> = Vec::with_capacity(8);
        if let Some(ip) = w.v4 {
            batch.push(op(
                move || format!("pod: add address {ip}/32 on {ifname}"),
                pod.add_addr32(pi, ip),
            ));
            batch.push(op(
                move || format!("pod: add route {GATEWAY}/32 dev {ifname} scope link"),
                pod.add_link_route(pi, GATEWAY.into(), 32),
            ));
            batch.push(op(
                move || format!("pod: add permanent neighbour {GATEWAY} on {ifname}"),
                pod.add_permanent_neigh(pi, GATEWAY.into(), mac),
            ));
            batch.push(op(
                move || format!("host: add route {ip}/32 dev {veth}"),
                host.add_link_route(hi, ip.into(), 32),
            ));
        }
        if let Some(ip) = w.v6 {
            batch.push(op(
                move || format!("pod: add address {ip}/128 nodad on {ifname}"),
                pod.add_addr6_nodad(pi, ip, 128),
            ));
            batch.push(op(
                move || format!("pod: add permanent neighbour {GATEWAY6} on {ifname}"),
                pod.add_permanent_neigh(pi, GATEWAY6.into(), mac),
            ));
            batch.push(op(
                move || format!("host: add address {GATEWAY6}/64 nodad on {veth}"),
                host.add_addr6_nodad(hi, GATEWAY6, 64),
            ));
            batch.push(op(
                move || format!("host: add route {ip}/128 dev {veth}"),
                host.add_link_route(hi, ip.into(), 128),
            ));
            // A link-local gateway on a named device needs no route of its own, so these go
            // in the same batch.
            for &(dst, len) in &w.routes6 {
                batch.push(op(
                    move || format!("pod: add route {dst}/{len} via {GATEWAY6} dev {ifname}"),
                    pod.add_gateway_route(pi, dst.into(), len, GATEWAY6.into()),
                ));
            }
        }
        // Every request runs; the first failure in the order above is reported.
        for r in futures::future::join_all(batch).await {
            r?;
        }
        for &(dst, len) in &w.routes4 {
            pod.add_gateway_route(pi, dst.into(), len, GATEWAY.into())
                .await
                .map_err(|e| {
                    nl_err(
                        format!("pod: add route {dst}/{len} via {GATEWAY} dev {ifname}"),
                        e,
                    )
                })?;
        }
        Ok(())
    }
}
