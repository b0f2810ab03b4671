// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aliasnet datapath: tc (TCX) programs that class every IPv4 packet of a pod as
 * internal / internet / blocked by longest-prefix match on the remote address,
 * count it per pod x direction x class, drop blocked traffic, and pick the HTB
 * class that shapes it.
 *
 *   an_host_ingress  host veth ingress  (pod egress,  remote = dst): count, drop blocked
 *   an_host_egress   host veth egress   (pod ingress, remote = src): count, drop blocked
 *   an_pod_egress    pod eth0 egress    (remote = dst): skb->priority = internet or other class
 *   an_uplink        node uplink egress (pod src, remote = dst): skb->priority = node cap class
 *
 * Paths that do not decide return TC_ACT_UNSPEC (TCX_NEXT): under TCX, TC_ACT_OK
 * would end processing on the hook and hide the packet from later programs.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "aliasnet_abi.h"

/* Maps are created and pinned by userspace (aliasnet-shaper), so no pinning attribute here. */

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct an_lpm_key);
	__type(value, struct an_lpm_value);
	__uint(max_entries, AN_LPM_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} an_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_config);
	__uint(max_entries, 1);
} an_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* host veth ifindex */
	__type(value, struct an_pod);
	__uint(max_entries, AN_MAX_PODS);
} an_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* pod IPv4, network byte order */
	__type(value, __u32); /* slot */
	__uint(max_entries, AN_MAX_PODS);
} an_pod_ips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct an_pod_counters);
	__uint(max_entries, AN_MAX_PODS);
} an_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct an_node_counters);
	__uint(max_entries, 1);
} an_node_ctrs SEC(".maps");

/* Userspace-only records; defined here so one object describes every pinned map. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_pod_meta);
	__uint(max_entries, AN_MAX_PODS);
} an_pod_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct an_ns_key);
	__type(value, struct an_ns_rate);
	__uint(max_entries, AN_MAX_NAMESPACES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} an_ns_rates SEC(".maps");

struct an_pkt {
	__u32 saddr;
	__u32 daddr;
	__u32 segs;
	__u64 bytes;
};

/*
 * Returns 1 for an IPv4 packet with its addresses in *p. Only the fixed part of
 * the IPv4 header is read: options and fragmentation do not move the addresses,
 * and a non-first fragment is classed by address like any other packet.
 */
static __always_inline int parse(struct __sk_buff *skb, struct an_pkt *p)
{
	struct iphdr iph;

	p->segs = 1;
	p->bytes = skb->len;
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &iph, sizeof(iph)) < 0)
		return 0;
	/* A malformed header is passed as "other": ip_rcv drops it anyway. */
	if (iph.version != 4 || iph.ihl < 5)
		return 0;
	p->saddr = iph.saddr;
	p->daddr = iph.daddr;

	/* A GSO skb is several packets on the wire, each with its own headers. */
	if (skb->gso_segs > 1) {
		__u32 hdr = ETH_HLEN + iph.ihl * 4;

		if (iph.protocol == IPPROTO_TCP) {
			__u8 doff;

			if (bpf_skb_load_bytes(skb, hdr + 12, &doff, 1) == 0)
				hdr += (doff >> 4) * 4;
		} else if (iph.protocol == IPPROTO_UDP) {
			hdr += 8;
		}
		p->segs = skb->gso_segs;
		p->bytes = skb->len + (__u64)(p->segs - 1) * hdr;
	}
	return 1;
}

/* Longest prefix wins; userspace resolves equal prefixes in both lists to blocked. */
static __always_inline __u32 classify(__u32 remote)
{
	__u32 zero = 0;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);
	struct an_lpm_key key = {
		.prefixlen = 64,
		.gen = cfg ? cfg->active_gen : 0,
		.addr = remote,
	};
	struct an_lpm_value *v = bpf_map_lookup_elem(&an_prefixes, &key);

	if (!v)
		return AN_CLASS_INTERNET;
	return v->class == AN_CLASS_BLOCKED ? AN_CLASS_BLOCKED : AN_CLASS_INTERNAL;
}

static __always_inline void count(struct __sk_buff *skb, __u32 dir, __u32 class,
				  const struct an_pkt *p)
{
	__u32 ifindex = skb->ifindex;
	struct an_pod *pod = bpf_map_lookup_elem(&an_pods, &ifindex);
	struct an_pod_counters *c;
	struct an_counter *ctr;
	__u32 slot;

	/* Not registered (yet, or any more): classify and enforce, but nothing to count into. */
	if (!pod)
		return;
	slot = pod->slot;
	c = bpf_map_lookup_elem(&an_counters, &slot);
	if (!c)
		return;
	/* Per-CPU value and softirq context: plain adds are not racy. */
	ctr = &c->dir[dir & 1][class & 3];
	ctr->packets += p->segs;
	ctr->bytes += p->bytes;
}

static __always_inline int host_side(struct __sk_buff *skb, __u32 dir)
{
	struct an_pkt p = {};
	__u32 class = AN_CLASS_OTHER;

	if (parse(skb, &p))
		class = classify(dir == AN_DIR_EGRESS ? p.daddr : p.saddr);
	count(skb, dir, class, &p);
	return class == AN_CLASS_BLOCKED ? TC_ACT_SHOT : TC_ACT_UNSPEC;
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
 * On the pod's eth0 (in the pod netns): choose the HTB class of the pod's egress
 * qdisc. Blocked traffic goes to "other" and is counted and dropped on the host side.
 */
SEC("classifier")
int an_pod_egress(struct __sk_buff *skb)
{
	struct an_pkt p = {};

	if (parse(skb, &p) && classify(p.daddr) == AN_CLASS_INTERNET)
		skb->priority = AN_CLASSID_POD_INTERNET;
	else
		skb->priority = AN_CLASSID_POD_OTHER;
	return TC_ACT_UNSPEC;
}

/*
 * On the node uplink: internet-bound packets from registered pods go to the
 * node-wide cap class. Everything else keeps its priority, which names no HTB
 * class, and leaves through HTB's unshaped direct queue. Identifying pods by
 * source address assumes no SNAT on the node, as in the alias-IP design.
 */
SEC("classifier")
int an_uplink(struct __sk_buff *skb)
{
	struct an_pkt p = {};
	struct an_node_counters *c;
	__u32 zero = 0;

	if (!parse(skb, &p))
		return TC_ACT_UNSPEC;
	if (!bpf_map_lookup_elem(&an_pod_ips, &p.saddr))
		return TC_ACT_UNSPEC;
	if (classify(p.daddr) != AN_CLASS_INTERNET)
		return TC_ACT_UNSPEC;
	skb->priority = AN_CLASSID_NODE_CAP;
	c = bpf_map_lookup_elem(&an_node_ctrs, &zero);
	if (c) {
		c->capped.packets += p.segs;
		c->capped.bytes += p.bytes;
	}
	return TC_ACT_UNSPEC;
}

/* Dual licence so GPL-only helpers stay available; none is used today. */
char _license[] SEC("license") = "Dual BSD/GPL";
