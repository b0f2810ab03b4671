// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aliasnet datapath: tc programs that class every IPv4 and IPv6 packet of a pod as
 * internal / internet / blocked by longest-prefix match on the remote address,
 * count it per pod x direction x class, drop blocked traffic, and pick the HTB
 * class that shapes it.
 *
 *   an_host_ingress  host veth ingress  (pod egress,  remote = dst): drop what is not from
 *                    the pod's address (see from_pod()), IPv6 to the link the pod does not
 *                    need or above its rate (see link_gate()), count, drop blocked, police the
 *                    pod's egress limits (see policed()), clamp the TCP windows of
 *                    connections with limits (see pod_tcp()), and send what its
 *                    namespace's upload limits shape to their device (an IFB)
 *   an_host_egress   host veth egress   (pod ingress, remote = src): count, drop blocked,
 *                    clamp, leaf of the pod's own download limits on this device, and
 *                    the leaf of its namespace's for an_ns_gate and an_ns_classify
 *   an_ns_gate       host veth egress, after an_host_egress: redirects (mirred action)
 *                    what an_host_egress chose to the namespaces' download device
 *   an_ns_classify   the HTB of the namespaces' download device: the leaf
 *                    an_host_egress chose
 *   an_pod_egress    pod eth0 egress    (remote = dst): leaf of the pod's own upload
 *                    limits, CE-mark or drop local TCP above them
 *   an_uplink        node uplink egress (pod src, remote = dst): leaf of the node's upload
 *                    limits on the uplink's HTB, CE-mark above them
 *   an_uplink_in     node uplink ingress (pod dst, remote = src): leaf of the node's
 *                    download limits, sent to their device (an IFB)
 *
 * Every limit is shaped on the device of its level (lib/stage.h): a pod's own limits on
 * its devices, a namespace's and the node's on aggregate devices every pod's traffic of
 * that direction crosses, so that the limits of all three levels hold at once, named
 * classes inside the internet limits. Each limit has a sparse and a bulk leaf;
 * pick_sparse() chooses (see an_flows).
 * The parts live in lib/ by concern: parse.h (packet headers), classify.h (prefix match),
 * counters.h, queue.h (queue model, CE marks), flow.h (flow isolation), stage.h (the limits
 * of a level, leaves and models), police.h (the host veth's backstop of the egress limits),
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
#include "lib/stage.h"
#include "lib/wndclamp.h"

/* Whether `w0`, an IPv6 address's first word in host order, is link-local (fe80::/10). */
static __always_inline int link_local6(__u32 w0)
{
	return (w0 >> 22) == (0xfe80 >> 6);
}

/*
 * Whether an IPv6 packet's destination is on the link only: link-local (the gateway
 * fe80::1, or the host veth's own link-local address) or multicast (a socket of the node's
 * that joined a group on any interface receives it). The kernel delivers such packets to
 * the node itself and never forwards them: from a pod they reach the node's services.
 */
static __always_inline int link_dest6(const struct an_pkt *p)
{
	__u32 d = bpf_ntohl(p->daddr6[0]);

	return link_local6(d) || (d >> 24) == 0xff;
}

/*
 * Whether a frame the pod sent (host veth ingress) may be from it: IPv4 and IPv6 only with
 * the pod's own source address of that family, whatever the kernel's reverse-path filter is
 * set to. IPv6 to a link-scoped destination (link_dest6()) may also come from the pod's own
 * link-local address or the unspecified one, never another: each link-local source the node
 * hears a neighbour solicitation from takes an entry of its neighbour table, which every
 * namespace shares. ARP passes (the pod needs it for its gateway). A frame still VLAN-tagged
 * here (the kernel took off an outer tag before tc ingress) hides its header from the
 * programs, and the kernel would strip a second priority tag and route it: it is dropped
 * too. Malformed IPv4 or IPv6 (`parsed` 0) passes, as ip_rcv and ipv6_rcv drop it.
 */
static __always_inline int from_pod(const struct __sk_buff *skb, const struct an_pod *pod,
				    int parsed, const struct an_pkt *p)
{
	const __u32 *s = p->saddr6;

	if (skb->protocol == bpf_htons(ETH_P_8021Q) || skb->protocol == bpf_htons(ETH_P_8021AD))
		return 0;
	if (!parsed)
		return 1;
	if (!p->v6)
		return p->saddr == pod->ipv4;
	if ((pod->ipv6[0] | pod->ipv6[1] | pod->ipv6[2] | pod->ipv6[3]) && s[0] == pod->ipv6[0] &&
	    s[1] == pod->ipv6[1] && s[2] == pod->ipv6[2] && s[3] == pod->ipv6[3])
		return 1;
	if (!link_dest6(p))
		return 0;
	if (!(s[0] | s[1] | s[2] | s[3]))
		return 1;
	return (pod->ipv6_ll[0] | pod->ipv6_ll[1] | pod->ipv6_ll[2] | pod->ipv6_ll[3]) &&
	       s[0] == pod->ipv6_ll[0] && s[1] == pod->ipv6_ll[1] && s[2] == pod->ipv6_ll[2] &&
	       s[3] == pod->ipv6_ll[3];
}

#define AN_ICMPV6_ERROR_MAX 4 /* destination unreachable .. parameter problem */
#define AN_ICMPV6_MLD_REPORT 131
#define AN_ICMPV6_MLD_DONE 132
#define AN_ICMPV6_RS 133
#define AN_ICMPV6_NS 135
#define AN_ICMPV6_NA 136
#define AN_ICMPV6_MLD2_REPORT 143

/* Takes one packet of the pod's link-scoped budget (AN_ND_PPS, AN_ND_BURST); 0 if empty. */
static __always_inline int nd_budget(__u32 slot)
{
	const __u64 t = NSEC_PER_SEC / AN_ND_PPS;
	struct an_pod_rt *rt = bpf_map_lookup_elem(&an_pod_rt, &slot);
	__u64 now = bpf_ktime_get_ns(), tat;

	if (!rt)
		return 0;
	tat = rt->nd_tat > now ? rt->nd_tat : now;
	if (tat - now > (AN_ND_BURST - 1) * t)
		return 0;
	/* Two CPUs may both take the last packet: the bound is loose by one per CPU. */
	rt->nd_tat = tat + t;
	return 1;
}

/*
 * What a pod may send to a link-scoped destination (link_dest6()): what it needs of the
 * link, ICMPv6 router and neighbour solicitation, neighbour advertisement, MLD reports and
 * ICMPv6 errors (they answer the node's own packets), unfragmented, within its budget.
 * Everything else would reach the node's services, which IPv4 pods cannot reach through
 * their gateway either. Returns 0 to pass, else 1 + the drop's AN_DROP_* reason.
 */
static __always_inline __u32 link_gate(struct __sk_buff *skb, const struct an_pkt *p,
				       __u32 slot)
{
	__u8 type;

	if (p->proto != IPPROTO_ICMPV6 || p->frag ||
	    bpf_skb_load_bytes(skb, l4_off(p), &type, sizeof(type)) < 0)
		return 1 + AN_DROP_GATEWAY;
	switch (type) {
	case 1 ... AN_ICMPV6_ERROR_MAX:
	case AN_ICMPV6_MLD_REPORT:
	case AN_ICMPV6_MLD_DONE:
	case AN_ICMPV6_RS:
	case AN_ICMPV6_NS:
	case AN_ICMPV6_NA:
	case AN_ICMPV6_MLD2_REPORT:
		break;
	default:
		return 1 + AN_DROP_GATEWAY;
	}
	return nd_budget(slot) ? 0 : 1 + AN_DROP_ND;
}

/* The slot of the pod whose address is the packet's source, if any. */
static __always_inline __u32 *pod_of_source(const struct an_pkt *p)
{
	if (p->v6)
		return bpf_map_lookup_elem(&an_pod_ips6, p->saddr6);
	return bpf_map_lookup_elem(&an_pod_ips, &p->saddr);
}

/* The slot of the pod whose address is the packet's destination, if any. */
static __always_inline __u32 *pod_of_dest(const struct an_pkt *p)
{
	if (p->v6)
		return bpf_map_lookup_elem(&an_pod_ips6, p->daddr6);
	return bpf_map_lookup_elem(&an_pod_ips, &p->daddr);
}

/*
 * Traffic to the pod: the leaf of its own limits on this device (skb->priority, HTB's
 * direct queue without one), and, when its namespace's download limits shape it, their
 * leaf for an_ns_classify (skb->tc_index) with the mark that makes an_ns_gate send it there.
 */
static __always_inline void to_pod(struct __sk_buff *skb, const struct an_config *cfg,
				   const struct an_pod_meta *meta, __u32 slot, __u32 class,
				   struct an_pkt *p)
{
	struct an_stage st = {};
	__u32 prio = AN_CLASSID_DIRECT, leaf;
	struct an_entity *e;
	int sparse;

	stage_of(&st, cfg, meta, slot, AN_LEVEL_POD, AN_DIR_INGRESS, class);
	if (st.n) {
		sparse = stage_shape(skb, cfg, &st, p, 0);
		prio = pod_leaf(&st, sparse > 0);
	}
	/* One store each (the verifier refuses a kept pointer into the context). */
	skb->priority = prio;
	e = stage_of(&st, cfg, meta, slot, AN_LEVEL_NS, AN_DIR_INGRESS, class);
	if (!e || !st.n)
		return;
	sparse = stage_shape(skb, cfg, &st, p, 0);
	leaf = agg_leaf(&st, e, AN_DIR_INGRESS, meta->agg_leaves[0][AN_DIR_INGRESS], slot,
			sparse > 0);
	skb->tc_index = leaf;
	skb->cb[0] = AN_CB_NS_STAGE;
}

/*
 * Traffic from the pod, past the checks: its namespace's upload limits shape it on their
 * device, which hands it back to this device's ingress (where tc does not run again). The
 * pod's own limits shaped it on its eth0.
 */
static __always_inline int from_pod_ns(struct __sk_buff *skb, const struct an_config *cfg,
				       const struct an_pod_meta *meta, __u32 slot, __u32 class,
				       struct an_pkt *p)
{
	struct an_stage st = {};
	struct an_entity *e;
	__u32 leaf;
	int sparse;

	e = stage_of(&st, cfg, meta, slot, AN_LEVEL_NS, AN_DIR_EGRESS, class);
	if (!e || !st.n)
		return TC_ACT_UNSPEC;
	sparse = stage_shape(skb, cfg, &st, p, 0);
	leaf = agg_leaf(&st, e, AN_DIR_EGRESS, meta->agg_leaves[0][AN_DIR_EGRESS], slot,
			sparse > 0);
	skb->priority = (AN_HTB_MAJOR << 16) | leaf;
	return bpf_redirect(cfg->ns_out_ifindex, 0);
}

/*
 * Both host veth programs: class, count and enforce a pod's traffic in direction `dir`,
 * learn and clamp its TCP connections, and shape it.
 *
 * The pod is the host veth the packet is on (an_pods by skb->ifindex): its slot keys every
 * counter, queue model and flow state here, never an address the pod chose. Sources are
 * checked before anything is counted or learnt, so an_conns entries (keyed by the pod's
 * address) and the uplink programs (which find pods by address) only ever see a pod's own
 * address.
 */
static __always_inline int host_side(struct __sk_buff *skb, __u32 dir)
{
	struct an_pkt p = {};
	__u32 class = AN_CLASS_OTHER;
	__u32 zero = 0, ifindex = skb->ifindex;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);
	struct an_pod *pod;
	struct an_pod_meta *meta;
	__u32 slot, why;
	int parsed;

	if (dir == AN_DIR_INGRESS) {
		/*
		 * Back from the namespaces' download device: classed, counted and given the
		 * leaf of the pod's own limits on the way there.
		 */
		if (cfg && cfg->ns_in_ifindex && skb->ingress_ifindex == cfg->ns_in_ifindex) {
			skb->cb[0] = 0;
			return TC_ACT_UNSPEC;
		}
		skb->cb[0] = 0;
	}
	parsed = parse(skb, &p);
	if (parsed)
		class = classify_pkt(cfg, &p, dir == AN_DIR_EGRESS);
	pod = bpf_map_lookup_elem(&an_pods, &ifindex);
	if (dir == AN_DIR_EGRESS && pod) {
		if (!from_pod(skb, pod, parsed, &p)) {
			count_spoofed(pod->slot, &p);
			return TC_ACT_SHOT;
		}
		if (parsed && p.v6 && link_dest6(&p)) {
			why = link_gate(skb, &p, pod->slot);
			if (why) {
				count_dropped(pod->slot, why - 1, &p);
				return TC_ACT_SHOT;
			}
		}
	}
	/* Not registered (yet, or any more): classify and enforce, but nothing to count into. */
	if (!pod)
		return class == AN_CLASS_BLOCKED ? TC_ACT_SHOT : TC_ACT_UNSPEC;
	slot = pod->slot;
	count(slot, dir, class, &p);
	if (class == AN_CLASS_BLOCKED)
		return TC_ACT_SHOT;
	meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
	if (!meta)
		return TC_ACT_UNSPEC;
	if (dir == AN_DIR_EGRESS && policed(slot, meta, class, &p)) {
		count_policed(slot, &p);
		return TC_ACT_SHOT;
	}
	/* Ports are read only for unfragmented TCP and UDP, and a TCP port is never 0. */
	if (p.proto == IPPROTO_TCP && p.ports)
		pod_tcp(skb, cfg, slot, dir, &p, meta, class);
	if (dir == AN_DIR_INGRESS) {
		to_pod(skb, cfg, meta, slot, class, &p);
		return TC_ACT_UNSPEC;
	}
	return from_pod_ns(skb, cfg, meta, slot, class, &p);
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
 * On the host veth's egress after an_host_egress, in cls_bpf's classic mode with a mirred
 * action redirecting to the namespaces' download device: matches (-1, the filter's class)
 * the packets an_host_egress marked for it, nothing else (0).
 */
SEC("classifier")
int an_ns_gate(struct __sk_buff *skb)
{
	return skb->cb[0] == AN_CB_NS_STAGE ? -1 : 0;
}

/*
 * A filter of the namespaces' download device's HTB, direct action with the filter's
 * classid major: the leaf an_host_egress chose, or HTB's default without one.
 */
SEC("classifier")
int an_ns_classify(struct __sk_buff *skb)
{
	if (!skb->tc_index)
		return TC_ACT_UNSPEC;
	skb->tc_classid = skb->tc_index;
	return TC_ACT_OK;
}

/*
 * On the pod's eth0 (in the pod netns): choose the leaf of the pod's own upload limits on
 * its egress qdisc, and keep their queues short. Above the marking threshold a bulk packet
 * that is ECN-capable is CE-marked and a local TCP data segment is dropped (a congestion
 * signal, not a loss, for its local sender); anything else is left to the leaf queue.
 * Sparse packets (pings, DNS, ACKs) take the sparse leaf and are neither marked nor dropped.
 * Blocked traffic meets only the total limit here; the host side counts and drops it.
 */
SEC("classifier")
int an_pod_egress(struct __sk_buff *skb)
{
	struct an_pkt p = {};
	/* Set by cls_bpf from our filter's classid (see AN_POD_FILTER_CLASSID_BASE). */
	__u32 classid = skb->tc_classid;
	__u32 zero = 0, slot, *s, class = AN_CLASS_OTHER;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);
	struct an_pod_meta *meta;
	struct an_stage st = {};
	int sparse, parsed;

	/* Unless a limit of the pod's applies: HTB's direct queue, unshaped. */
	skb->priority = AN_CLASSID_DIRECT;
	parsed = parse(skb, &p);
	if (parsed)
		class = classify_pkt(cfg, &p, 1);
	if (class == AN_CLASS_BLOCKED)
		class = AN_CLASS_INTERNAL;
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
		if (!parsed)
			return TC_ACT_UNSPEC;
		s = pod_of_source(&p);
		if (!s)
			return TC_ACT_UNSPEC;
		slot = *s;
	}
	meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
	if (!meta)
		return TC_ACT_UNSPEC;
	stage_of(&st, cfg, meta, slot, AN_LEVEL_POD, AN_DIR_EGRESS, class);
	if (!st.n)
		return TC_ACT_UNSPEC;
	/*
	 * What is neither IPv4 nor IPv6, and link-scoped IPv6 (class other: NDP, MLD), is not
	 * modelled, as ARP is not: it takes the total limit's bulk leaf.
	 */
	sparse = 0;
	if (parsed && class != AN_CLASS_OTHER)
		sparse = stage_shape(skb, cfg, &st, &p, 1);
	if (sparse < 0)
		return TC_ACT_SHOT;
	skb->priority = pod_leaf(&st, sparse);
	return TC_ACT_UNSPEC;
}

/*
 * The node's limits, on the uplink: the pod a packet is from (egress) or to (ingress), by
 * its address (host_side() lets a pod send from its own address only; no SNAT on an alias-IP
 * node); its class by the remote address; the leaf of the node's limits of that class.
 * Returns 0 when the node does not shape the packet. Only the node's models are touched
 * here, never a pod's.
 */
static __always_inline int node_stage(struct __sk_buff *skb, const struct an_config *cfg,
				      __u32 dir, struct an_pkt *p)
{
	struct an_stage st = {};
	struct an_pod_meta *meta;
	struct an_entity *e;
	__u32 slot, *s, class, leaf;
	int sparse;

	if (!parse(skb, p))
		return 0;
	s = dir == AN_DIR_EGRESS ? pod_of_source(p) : pod_of_dest(p);
	if (!s)
		return 0;
	slot = *s;
	class = classify_pkt(cfg, p, dir == AN_DIR_EGRESS);
	if (!is_internet(class))
		return 0;
	meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
	if (!meta)
		return 0;
	e = stage_of(&st, cfg, meta, slot, AN_LEVEL_NODE, dir, class);
	if (!e || !st.n)
		return 0;
	sparse = stage_shape(skb, cfg, &st, p, 0);
	leaf = agg_leaf(&st, e, dir, meta->agg_leaves[1][dir & 1], slot, sparse > 0);
	skb->priority = (AN_HTB_MAJOR << 16) | leaf;
	count_staged(dir, p);
	return 1;
}

/*
 * On the node uplink's egress: the pods' internet traffic takes the leaf of the node's
 * upload limits on the uplink's HTB. Everything else keeps its priority, which names no
 * HTB class, and leaves through HTB's unshaped direct queue.
 */
SEC("classifier")
int an_uplink(struct __sk_buff *skb)
{
	struct an_pkt p = {};
	__u32 zero = 0;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);

	node_stage(skb, cfg, AN_DIR_EGRESS, &p);
	return TC_ACT_UNSPEC;
}

/*
 * On the node uplink's ingress: the pods' internet downloads go to the device of the
 * node's download limits (an IFB), which hands them back to this device's ingress (where tc
 * does not run again) to be routed to the pods.
 */
SEC("classifier")
int an_uplink_in(struct __sk_buff *skb)
{
	struct an_pkt p = {};
	__u32 zero = 0;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);

	if (!cfg || !cfg->node_in_ifindex || !node_stage(skb, cfg, AN_DIR_INGRESS, &p))
		return TC_ACT_UNSPEC;
	return bpf_redirect(cfg->node_in_ifindex, 0);
}

struct an_sweep {
	__u32 now;     /* bpf_ktime_get_ns() >> AN_CONN_TIME_SHIFT */
	__u32 removed;
};

/* One entry of an_conns: removed when its pod is gone or it is idle past its state's TTL. */
static long sweep_conn(void *map __attribute__((unused)), struct an_conn_key *key, struct an_conn *c,
		       struct an_sweep *x)
{
	__u32 slot = c->slot, ttl;
	struct an_pod_meta *m = bpf_map_lookup_elem(&an_pod_meta, &slot);

	if (c->state != AN_CONN_ESTABLISHED)
		ttl = AN_CONN_HANDSHAKE_TTL_S;
	else if ((c->flags & (AN_CONN_F_FIN_POD | AN_CONN_F_FIN_REMOTE)) ==
		 (AN_CONN_F_FIN_POD | AN_CONN_F_FIN_REMOTE))
		ttl = AN_CONN_CLOSED_TTL_S;
	else
		ttl = AN_CONN_IDLE_TTL_S;
	if (!m || !(m->flags & AN_META_IN_USE) || conn_gen(m) != c->gen ||
	    x->now - c->t_last > ttl) {
		conn_forget(key, c);
		x->removed++;
	}
	return 0;
}

/*
 * Not attached anywhere: shaperd runs it (BPF_PROG_TEST_RUN) every few seconds to sweep
 * an_conns (see there). Returns how many entries it removed.
 */
SEC("classifier")
int an_conns_sweep(struct __sk_buff *skb __attribute__((unused)))
{
	struct an_sweep x = { .now = bpf_ktime_get_ns() >> AN_CONN_TIME_SHIFT };

	bpf_for_each_map_elem(&an_conns, sweep_conn, &x, 0);
	return x.removed;
}

/* Dual licence so GPL-only helpers stay available; none is used today. */
char _license[] SEC("license") = "Dual BSD/GPL";
