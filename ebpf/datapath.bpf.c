// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aliasnet datapath: tc programs that class every IPv4 and IPv6 packet of a pod as
 * internal / internet / blocked by longest-prefix match on the remote address,
 * count it per pod x direction x class, drop blocked traffic, and pick the HTB
 * class that shapes it.
 *
 *   an_host_ingress  host veth ingress  (pod egress,  remote = dst): drop what is not from
 *                    the pod's address (see from_pod()), count, drop blocked, police the
 *                    pod's egress limits (see policed()), clamp the TCP windows of a pod
 *                    with an ingress limit (see pod_tcp())
 *   an_host_egress   host veth egress   (pod ingress, remote = src): count, drop blocked,
 *                    leaf of the pod's ingress limit, CE-mark above it (see shape_remote())
 *   an_pod_egress    pod eth0 egress    (remote = dst): skb->priority = leaf of the internet
 *                    or other class, CE-mark above the pod's egress limits
 *   an_uplink        node uplink egress (pod src, remote = dst): skb->priority = leaf of the
 *                    node cap class, CE-mark above the node cap
 *
 * Every shaped class has a sparse and a bulk leaf; pick_sparse() chooses (see an_flows).
 * The parts live in lib/ by concern: parse.h (packet headers), classify.h (prefix match),
 * counters.h, queue.h (queue model, CE marks), flow.h (flow isolation), shape.h (leaf and
 * model of forwarded traffic), police.h (the host veth's backstop of the egress limits),
 * wndclamp.h (handshakes, MSS and window clamps), maps.h.
 *
 * The per-pod programs run as direct-action cls_bpf filters (clsact), an_uplink
 * with TCX. Paths that do not decide return TC_ACT_UNSPEC: the next filter runs
 * (TCX_NEXT under TCX), and at the end of the chain the packet passes. TC_ACT_OK
 * would end processing on the hook and hide the packet from later programs;
 * TC_ACT_SHOT drops.
 */
#include "lib/classify.h"
#include "lib/counters.h"
#include "lib/queue.h"
#include "lib/flow.h"
#include "lib/police.h"
#include "lib/shape.h"
#include "lib/wndclamp.h"

/*
 * An IPv6 packet that stays on the link: from a link-local or the unspecified source to a
 * link-local or link-scope multicast (ff02::/16) destination. Neighbour discovery with the
 * gateway, router solicitations, MLD and DAD are such packets; the kernel delivers them
 * locally and never forwards them, so their source cannot be abused beyond the host.
 */
static __always_inline int link_scoped6(const struct an_pkt *p)
{
	__u32 s = bpf_ntohl(p->saddr6[0]), d = bpf_ntohl(p->daddr6[0]);
	int unspec = !(p->saddr6[0] | p->saddr6[1] | p->saddr6[2] | p->saddr6[3]);

	return (unspec || (s >> 22) == (0xfe80 >> 6)) &&
	       ((d >> 22) == (0xfe80 >> 6) || (d >> 16) == 0xff02);
}

/*
 * Whether a frame the pod sent (host veth ingress) may be from it: IPv4 and IPv6 only with
 * the pod's own source address of that family (IPv6 also link-scoped, see link_scoped6()),
 * whatever the kernel's reverse-path filter is set to. ARP passes (the pod needs it for its
 * gateway). A frame still VLAN-tagged here (the kernel took off an outer tag before tc
 * ingress) hides its header from the programs, and the kernel would strip a second priority
 * tag and route it: it is dropped too. Malformed IPv4 or IPv6 (`parsed` 0) passes, as
 * ip_rcv and ipv6_rcv drop it.
 */
static __always_inline int from_pod(const struct __sk_buff *skb, const struct an_pod *pod,
				    int parsed, const struct an_pkt *p)
{
	if (skb->protocol == bpf_htons(ETH_P_8021Q) || skb->protocol == bpf_htons(ETH_P_8021AD))
		return 0;
	if (!parsed)
		return 1;
	if (!p->v6)
		return p->saddr == pod->ipv4;
	if ((pod->ipv6[0] | pod->ipv6[1] | pod->ipv6[2] | pod->ipv6[3]) &&
	    p->saddr6[0] == pod->ipv6[0] && p->saddr6[1] == pod->ipv6[1] &&
	    p->saddr6[2] == pod->ipv6[2] && p->saddr6[3] == pod->ipv6[3])
		return 1;
	return link_scoped6(p);
}

/* The slot of the pod whose address is the packet's source, if any. */
static __always_inline __u32 *pod_of_source(const struct an_pkt *p)
{
	if (p->v6)
		return bpf_map_lookup_elem(&an_pod_ips6, p->saddr6);
	return bpf_map_lookup_elem(&an_pod_ips, &p->saddr);
}

/*
 * Both host veth programs: class, count and enforce a pod's traffic in direction `dir`,
 * learn and clamp its TCP connections, and shape what goes to the pod.
 *
 * The pod is the host veth the packet is on (an_pods by skb->ifindex): its slot keys every
 * counter, queue model and flow state here, never an address the pod chose. Sources are
 * checked before anything is counted or learnt, so an_conns entries (keyed by the pod's
 * address) and the uplink program (which finds pods by source address) only ever see a
 * pod's own address.
 */
static __always_inline int host_side(struct __sk_buff *skb, __u32 dir)
{
	struct an_pkt p = {};
	__u32 class = AN_CLASS_OTHER;
	__u32 zero = 0, ifindex = skb->ifindex;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);
	struct an_pod *pod;
	struct an_pod_meta *meta;
	__u32 slot;
	int parsed = parse(skb, &p);

	if (parsed)
		class = classify_pkt(cfg, &p, dir == AN_DIR_EGRESS);
	pod = bpf_map_lookup_elem(&an_pods, &ifindex);
	if (dir == AN_DIR_EGRESS && pod && !from_pod(skb, pod, parsed, &p)) {
		count_spoofed(pod->slot, &p);
		return TC_ACT_SHOT;
	}
	/* Not registered (yet, or any more): classify and enforce, but nothing to count into. */
	if (!pod)
		return class == AN_CLASS_BLOCKED ? TC_ACT_SHOT : TC_ACT_UNSPEC;
	slot = pod->slot;
	count(slot, dir, class, &p);
	if (class == AN_CLASS_BLOCKED)
		return TC_ACT_SHOT;
	meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
	if (dir == AN_DIR_EGRESS && meta && policed(slot, meta, class, &p)) {
		count_policed(slot, &p);
		return TC_ACT_SHOT;
	}
	/*
	 * Ports are read only for unfragmented TCP and UDP, and a TCP port is never 0. The
	 * node cap shapes what the pods send to the internet: those connections are clamped
	 * too while a cap is set.
	 */
	if (p.proto == IPPROTO_TCP && p.ports) {
		int ingress_limited = pod->flags & AN_POD_INGRESS_LIMIT;
		int capped = class == AN_CLASS_INTERNET && cfg && cfg->node_internet_cap;
		/* The pod's egress class for this remote, for the MSS of connections' handshakes. */
		__u64 erate = 0, irate = 0;

		if (meta && dir == AN_DIR_INGRESS) {
			erate = meta->egress_rate;
			irate = class == AN_CLASS_INTERNET ? meta->internet_egress_rate : 0;
			if (irate && (!erate || irate < erate))
				erate = irate;
		}
		if (ingress_limited || capped || erate)
			pod_tcp(skb, cfg, slot, dir, &p, ingress_limited, capped, erate,
				frame_of(meta ? meta->frame : 0));
	}
	/*
	 * Traffic to the pod next meets the HTB class of its ingress limit on this device. Its
	 * senders are remote, so a drop would be a loss: only ECN-capable packets are signalled.
	 * Without the program's choice HTB's default is the bulk leaf.
	 */
	if (dir == AN_DIR_INGRESS) {
		if (meta && meta->ingress_rate)
			shape_remote(skb, cfg, AN_CLASSID_POD_INGRESS,
				     slot * AN_VQ_PER_POD + AN_VQ_INGRESS, meta->ingress_rate,
				     class_credit(meta->ingress_burst, meta->ingress_rate,
						  frame_of(meta->frame)),
				     frame_of(meta->frame), &p);
	}
	return TC_ACT_UNSPEC;
}

SEC("classifier")
int an_host_ingress(struct __sk_buff *skb)
{
	return host_side(skb, AN_DIR_EGRESS);
}

SEC("classifier")
int an_host_egress(struct __sk_buff *skb)
{
	return host_side(skb, AN_DIR_INGRESS);
}

/*
 * On the pod's eth0 (in the pod netns): choose the HTB leaf of the pod's egress qdisc, and
 * keep the class queues short. Above the marking threshold a bulk packet that is
 * ECN-capable is CE-marked and a local TCP data segment is dropped (a congestion signal,
 * not a loss, for its local sender); anything else is left to the leaf queue. Sparse
 * packets (pings, DNS, ACKs) take the sparse leaf and are neither marked nor dropped.
 * Blocked traffic goes to "other" and is counted and dropped on the host side.
 */
SEC("classifier")
int an_pod_egress(struct __sk_buff *skb)
{
	struct an_pkt p = {};
	/* Set by cls_bpf from our filter's classid (see AN_POD_FILTER_CLASSID_BASE). */
	__u32 classid = skb->tc_classid;
	__u32 zero = 0, slot, *s, base;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);
	struct an_pod_meta *meta;
	struct an_vqueue *qi, *qe, *hot = NULL;
	struct an_flow *f;
	__u64 now, irate, erate, rate, ti, te, frame;
	int internet, sparse;
	__u32 class;

	/*
	 * What is neither IPv4 nor IPv6, and link-scoped IPv6 (class other: NDP, MLD), is not
	 * modelled, as ARP is not.
	 */
	if (!parse(skb, &p) || (class = classify_pkt(cfg, &p, 1)) == AN_CLASS_OTHER) {
		skb->priority = AN_CLASSID_POD_OTHER + AN_LEAF_BULK;
		return TC_ACT_UNSPEC;
	}
	internet = class == AN_CLASS_INTERNET;
	base = internet ? AN_CLASSID_POD_INTERNET : AN_CLASSID_POD_OTHER;
	skb->priority = base + AN_LEAF_BULK;
	/*
	 * This device is in the pod's namespace, where its ifindex names no pod: the pod is the
	 * one whose slot userspace put in this filter's classid, never the source address the
	 * pod wrote, so forged packets (a raw socket) charge only the forger's own model and
	 * flow state, and the host veth then drops them (from_pod()). Without a classid (a
	 * filter not attached by aliasnet, or a test run, which cannot set one) the source
	 * address picks the slot.
	 */
	if (classid) {
		slot = classid - AN_POD_FILTER_CLASSID_BASE;
		if (slot >= AN_MAX_PODS)
			return TC_ACT_UNSPEC;
	} else {
		s = pod_of_source(&p);
		if (!s)
			return TC_ACT_UNSPEC;
		slot = *s;
	}
	meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
	if (!meta)
		return TC_ACT_UNSPEC;
	/* Internet traffic passes its own class (1:10) and the total (1:1), if set. */
	irate = internet ? meta->internet_egress_rate : 0;
	erate = meta->egress_rate;
	/* The leaf's class drains at the tighter of the two. */
	rate = irate && (!erate || irate < erate) ? irate : erate;
	if (!rate)
		return TC_ACT_UNSPEC;
	frame = frame_of(meta->frame);
	qi = vq_of(slot * AN_VQ_PER_POD + AN_VQ_INTERNET, irate);
	qe = vq_of(slot * AN_VQ_PER_POD + AN_VQ_EGRESS, erate);
	now = bpf_ktime_get_ns();
	f = flow_of(slot * AN_VQ_PER_POD + (irate ? AN_VQ_INTERNET : AN_VQ_EGRESS), flow_bucket(&p));
	ti = qi ? class_credit(0, irate, frame) : 0;
	te = qe ? class_credit(meta->egress_burst, erate, frame) : 0;
	sparse = pick_sparse(cfg, f, rate, ti > te ? ti : te, frame, &p, now);
	if (sparse) {
		skb->priority = base + AN_LEAF_SPARSE;
	} else if (feature_on(cfg, AN_CFG_AQM_OFF)) {
		if (congested(qi, irate, frame, now))
			hot = qi;
		else if (congested(qe, erate, frame, now))
			hot = qe;
		if (hot && !ce_mark(skb, &p, hot) && (p.tos & 3) != 3 && local_tcp_data(skb, &p)) {
			__sync_fetch_and_add(&hot->dropped, p.segs);
			return TC_ACT_SHOT;
		}
	}
	/*
	 * The class's burst is the credit, the default one for the internet class and the
	 * pod's own (effective, in bytes) for the total.
	 */
	if (qi)
		vq_add(qi, irate, ti, frame, &p, now);
	if (qe)
		vq_add(qe, erate, te, frame, &p, now);
	if (!sparse) {
		ti = t_empty_of(qi);
		te = t_empty_of(qe);
		flow_bulk(f, ti > te ? ti : te);
	}
	return TC_ACT_UNSPEC;
}

/*
 * On the node uplink: internet-bound packets from registered pods go to the
 * node-wide cap class. Everything else keeps its priority, which names no HTB
 * class, and leaves through HTB's unshaped direct queue. Identifying pods by
 * source address assumes no SNAT on the node, as in the alias-IP design; a pod's packets
 * reach the uplink only with its own address (host_side() drops the others). Only the
 * node cap's model and counter are touched here, never a pod's.
 */
SEC("classifier")
int an_uplink(struct __sk_buff *skb)
{
	struct an_pkt p = {};
	__u32 zero = 0;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);

	if (!parse(skb, &p))
		return TC_ACT_UNSPEC;
	if (!pod_of_source(&p))
		return TC_ACT_UNSPEC;
	if (classify_pkt(cfg, &p, 1) != AN_CLASS_INTERNET)
		return TC_ACT_UNSPEC;
	skb->priority = AN_CLASSID_NODE_CAP + AN_LEAF_BULK;
	count_capped(&p);
	if (cfg && cfg->node_internet_cap)
		shape_remote(skb, cfg, AN_CLASSID_NODE_CAP, AN_VQ_NODE_CAP, cfg->node_internet_cap,
			     class_credit(0, cfg->node_internet_cap, frame_of(cfg->uplink_frame)),
			     frame_of(cfg->uplink_frame), &p);
	return TC_ACT_UNSPEC;
}

/* Dual licence so GPL-only helpers stay available; none is used today. */
char _license[] SEC("license") = "Dual BSD/GPL";
