// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aliasnet datapath: tc programs that class every IPv4 packet of a pod as
 * internal / internet / blocked by longest-prefix match on the remote address,
 * count it per pod x direction x class, drop blocked traffic, and pick the HTB
 * class that shapes it.
 *
 *   an_host_ingress  host veth ingress  (pod egress,  remote = dst): count, drop blocked,
 *                    clamp the TCP windows of a pod with an ingress limit (see clamp_window())
 *   an_host_egress   host veth egress   (pod ingress, remote = src): count, drop blocked,
 *                    leaf of the pod's ingress limit, CE-mark above it (see shape_remote())
 *   an_pod_egress    pod eth0 egress    (remote = dst): skb->priority = leaf of the internet
 *                    or other class, CE-mark above the pod's egress limits
 *   an_uplink        node uplink egress (pod src, remote = dst): skb->priority = leaf of the
 *                    node cap class, CE-mark above the node cap
 *
 * Every shaped class has a sparse and a bulk leaf; pick_sparse() chooses (see an_flows).
 *
 * The per-pod programs run as direct-action cls_bpf filters (clsact), an_uplink
 * with TCX. Paths that do not decide return TC_ACT_UNSPEC: the next filter runs
 * (TCX_NEXT under TCX), and at the end of the chain the packet passes. TC_ACT_OK
 * would end processing on the hook and hide the packet from later programs;
 * TC_ACT_SHOT drops.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <stddef.h>
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

/* Written by userspace only; the programs read the pod's ingress rate from it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_pod_meta);
	__uint(max_entries, AN_MAX_PODS);
} an_pod_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_vqueue);
	__uint(max_entries, AN_VQ_ENTRIES);
} an_vqueue SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_flow);
	__uint(max_entries, AN_FLOW_ENTRIES);
} an_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct an_conn_key);
	__type(value, struct an_conn);
	__uint(max_entries, AN_MAX_CONNS);
} an_conns SEC(".maps");

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
	__u8 tos;
	__u8 proto;
	__u8 ihl;
	__u8 pad;
	__u64 bytes;
	__u32 ports; /* TCP/UDP source and destination port, 0 for fragments and other protocols */
	__u32 pad2;
};

#define NSEC_PER_SEC 1000000000ULL

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
	p->tos = iph.tos;
	p->proto = iph.protocol;
	p->ihl = iph.ihl;
	/* Fragments (first one included) hash without ports, so all of a datagram stays in one leaf. */
	if ((iph.protocol == IPPROTO_TCP || iph.protocol == IPPROTO_UDP) &&
	    !(iph.frag_off & bpf_htons(0x3fff)))
		bpf_skb_load_bytes(skb, ETH_HLEN + iph.ihl * 4, &p->ports, 4);

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
static __always_inline __u32 classify(const struct an_config *cfg, __u32 remote)
{
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

static __always_inline void count(__u32 slot, __u32 dir, __u32 class, const struct an_pkt *p)
{
	struct an_pod_counters *c;
	struct an_counter *ctr;

	c = bpf_map_lookup_elem(&an_counters, &slot);
	if (!c)
		return;
	/* Per-CPU value and softirq context: plain adds are not racy. */
	ctr = &c->dir[dir & 1][class & 3];
	ctr->packets += p->segs;
	ctr->bytes += p->bytes;
}

/* Time to send `bytes` at `rate` bit/s (rate > 0). */
static __always_inline __u64 tx_ns(__u64 bytes, __u64 rate)
{
	return bytes * 8 * NSEC_PER_SEC / rate;
}

/* `ns`, or `frames` frames of `frame` bytes at `rate` if that takes longer. */
static __always_inline __u64 at_least(__u64 ns, __u64 frames, __u64 frame, __u64 rate)
{
	__u64 f = tx_ns(frames * frame, rate);

	return f > ns ? f : ns;
}

/* A device's largest frame as recorded by userspace, or AN_MIN_FRAME if unrecorded. */
static __always_inline __u64 frame_of(__u32 recorded)
{
	return recorded ? recorded : AN_MIN_FRAME;
}

/*
 * The largest frame TCP is asked to send into a class at `rate` on a device whose frame is
 * `frame`: AN_SEG_NS of the rate, never below AN_MIN_FRAME nor above the device's frame. On
 * a jumbo-frame device a slow class then gets segments of a 1500-byte network, so its window
 * clamp, queue and flow isolation work in the same units there (9014 bytes take 7.2 ms at
 * 10 Mbit/s; four flows' window floors of two such frames overflow a 25 ms queue).
 */
static __always_inline __u64 seg_frame(__u64 rate, __u64 frame)
{
	__u64 f = rate / 8 / (NSEC_PER_SEC / AN_SEG_NS);

	if (f < AN_MIN_FRAME)
		f = AN_MIN_FRAME;
	return f < frame ? f : frame;
}

/* Whether the part of the datapath that an_config.flags bit `off` switches off is on. */
static __always_inline int feature_on(const struct an_config *cfg, __u32 off)
{
	return !cfg || !(cfg->flags & off);
}

/* How long a packet arriving now waits in a class's modelled queue (0 = sent at once). */
static __always_inline __u64 vq_wait(const struct an_vqueue *q, __u64 now)
{
	__u64 t_empty = *(volatile const __u64 *)&q->t_empty;

	return t_empty > now ? t_empty - now : 0;
}

/*
 * Adds a packet the class's queue takes to its model, a token bucket draining at `rate`:
 * a packet starts once the backlog ahead of it has drained, with up to `credit` ns (the
 * bucket that binds) after idle; one that would wait longer than the leaf's drop-tail
 * limit is dropped by the real queue, so it is not added. Lengths are what HTB counts:
 * every segment of a GSO skb with its headers. Updates from two CPUs can race; a lost
 * update under-estimates the backlog by a packet.
 */
static __always_inline void vq_add(struct an_vqueue *q, __u64 rate, __u64 credit,
				   __u64 frame, const struct an_pkt *p, __u64 now)
{
	__u64 tx = tx_ns(p->bytes, rate);
	__u64 t_empty = *(volatile __u64 *)&q->t_empty;
	__u64 floor = now > credit ? now - credit : 0;

	if (t_empty < floor) {
		q->t_empty = floor + tx;
		return;
	}
	if (t_empty > now &&
	    t_empty - now > at_least(AN_LEAF_QUEUE_NS, AN_LEAF_QUEUE_FRAMES, frame, rate))
		return;
	__sync_fetch_and_add(&q->t_empty, tx);
}

/*
 * Marking threshold of a class: AN_ECN_MARK_MIN_NS up to AN_ECN_MARK_REF_RATE, growing
 * with the rate to AN_ECN_MARK_MAX_NS (see the ABI header), and at least
 * AN_ECN_MARK_FRAMES frames.
 */
static __always_inline __u64 mark_ns(__u64 rate, __u64 frame)
{
	__u64 t = AN_ECN_MARK_MAX_NS;

	if (rate < AN_ECN_MARK_REF_RATE * (AN_ECN_MARK_MAX_NS / AN_ECN_MARK_MIN_NS))
		t = AN_ECN_MARK_MIN_NS * (rate / 1000) / (AN_ECN_MARK_REF_RATE / 1000);
	if (t < AN_ECN_MARK_MIN_NS)
		t = AN_ECN_MARK_MIN_NS;
	return at_least(t, AN_ECN_MARK_FRAMES, frame, rate);
}

/* The class is congested for a packet that would wait longer than the marking threshold. */
static __always_inline int congested(const struct an_vqueue *q, __u64 rate, __u64 frame,
				     __u64 now)
{
	return q && vq_wait(q, now) > mark_ns(rate, frame);
}

/* CE-marks an ECN-capable packet (ECT(0) or ECT(1)); returns whether it was marked now. */
static __always_inline int ce_mark(struct __sk_buff *skb, struct an_pkt *p,
				   struct an_vqueue *q)
{
	if ((p->tos & 3) == 0 || (p->tos & 3) == 3)
		return 0;
	if (!bpf_skb_ecn_set_ce(skb))
		return 0;
	p->tos |= 3;
	__sync_fetch_and_add(&q->ce_marked, p->segs);
	return 1;
}

static __always_inline struct an_vqueue *vq_of(__u32 idx, __u64 rate)
{
	return rate ? bpf_map_lookup_elem(&an_vqueue, &idx) : NULL;
}

/* The HTB burst of a class at `rate` (> 0), in ns: `burst` bytes if set, else the default. */
static __always_inline __u64 class_credit(__u64 burst, __u64 rate, __u64 frame)
{
	__u64 floor, t;

	if (burst)
		return tx_ns(burst, rate);
	/* AN_DEFAULT_BURST_FRAMES of the class's segments, and at least one frame. */
	floor = AN_DEFAULT_BURST_FRAMES * seg_frame(rate, frame);
	if (floor < frame)
		floor = frame;
	t = tx_ns(floor, rate);
	return t > AN_DEFAULT_BURST_NS ? t : AN_DEFAULT_BURST_NS;
}

/* The an_flows bucket of a packet's flow (5-tuple hash) within its class. */
static __always_inline __u32 flow_bucket(const struct an_pkt *p)
{
	__u32 h = p->saddr ^ (p->daddr * 0x9e3779b1u) ^ (p->ports * 0x85ebca6bu) ^ p->proto;

	h ^= h >> 16;
	h *= 0x7feb352du;
	h ^= h >> 15;
	return h & (AN_FLOW_BUCKETS - 1);
}

/* The flow state of bucket `bucket` in the class of an_vqueue index `idx`. */
static __always_inline struct an_flow *flow_of(__u32 idx, __u32 bucket)
{
	__u32 key = idx * AN_FLOW_BUCKETS + bucket;

	return bpf_map_lookup_elem(&an_flows, &key);
}

/* Records a bulk packet of bucket `bucket` in the class's bulk-flow bitmaps. */
static __always_inline void flow_active(struct an_vqueue *q, __u32 bucket, __u64 now)
{
	__u64 bit = 1ULL << (bucket & 63);

	if (!q)
		return;
	if (now - *(volatile __u64 *)&q->t_epoch > AN_FLOW_EPOCH_NS) {
		q->flows_prev = now - q->t_epoch > 2 * AN_FLOW_EPOCH_NS ? 0 : q->flows_cur;
		q->flows_cur = 0;
		q->t_epoch = now;
	}
	if (!(*(volatile __u64 *)&q->flows_cur & bit))
		__sync_fetch_and_or(&q->flows_cur, bit);
}

static __always_inline __u32 popcount64(__u64 x)
{
	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (x * 0x0101010101010101ULL) >> 56;
}

/* Flows with a backlog in the class's bulk leaf lately (at least 1). */
static __always_inline __u32 bulk_flows(const struct an_vqueue *q, __u64 now)
{
	__u64 age, bits;
	__u32 n;

	if (!q)
		return 1;
	age = now - q->t_epoch;
	bits = age > 2 * AN_FLOW_EPOCH_NS ? 0 : q->flows_cur;
	if (age <= AN_FLOW_EPOCH_NS)
		bits |= q->flows_prev;
	n = popcount64(bits);
	return n ? n : 1;
}

/*
 * Whether a packet of flow `f` in a class of `rate` takes the sparse leaf (see an_flows in
 * the ABI header); charges the flow's sparse budget if so. `credit` is the model's burst
 * credit (see vq_add()). Two CPUs updating one flow can race: a lost update lets one more
 * packet of the budget through.
 */
static __always_inline int pick_sparse(const struct an_config *cfg, struct an_flow *f,
				       __u64 rate, __u64 credit, __u64 frame,
				       const struct an_pkt *p, __u64 now)
{
	__u64 frate = rate / AN_FLOW_RATE_DIV, burst, floor, t;

	if (!f || !feature_on(cfg, AN_CFG_FLOWS_OFF))
		return 0;
	/*
	 * Its packets still in the bulk leaf would be overtaken. The model's departure times
	 * can be early by up to its credit (it assumes HTB's bucket full after an idle moment
	 * that may not have refilled it); measured, overtaking cost cubic 1-1.6 % of its
	 * segments in spurious retransmits at 10 Mbit/s in one run of three.
	 */
	if (*(volatile __u64 *)&f->t_bulk + credit +
		    tx_ns(AN_FLOW_GUARD_FRAMES * frame, rate) > now)
		return 0;
	if (!frate)
		frate = 1;
	/* In the class's segments: a bulk TCP flow's segments are not sparse for long. */
	burst = tx_ns(AN_FLOW_BURST_FRAMES * seg_frame(rate, frame), frate);
	floor = now > burst ? now - burst : 0;
	t = f->t_sparse;
	if (t < floor)
		t = floor;
	t += tx_ns(p->bytes, frate);
	if (t > now)
		return 0;
	f->t_sparse = t;
	return 1;
}

/* Records that the flow's newest packet went to the bulk leaf and leaves it at `t_depart`. */
static __always_inline void flow_bulk(struct an_flow *f, __u64 t_depart)
{
	if (f)
		f->t_bulk = t_depart;
}

static __always_inline __u64 t_empty_of(const struct an_vqueue *q)
{
	return q ? *(volatile const __u64 *)&q->t_empty : 0;
}

/*
 * A TCP segment with payload sent by a socket in this namespace that has other segments
 * in flight. Dropping it before the qdisc is not a loss for its sender: the stack gets
 * NET_XMIT_DROP, keeps the data queued and reduces its window (CWR), exactly as on a full
 * local qdisc, and sends it again on the next ACK. With nothing in flight no ACK would
 * come and the sender would stall until its probe timer (200 ms and more).
 */
static __always_inline int local_tcp_data(struct __sk_buff *skb, const struct an_pkt *p)
{
	__u32 hdr = ETH_HLEN + p->ihl * 4;
	struct bpf_sock *sk = skb->sk;
	struct bpf_tcp_sock *tp;
	__u8 doff;

	if (!sk || p->proto != IPPROTO_TCP)
		return 0;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 0;
	tp = bpf_tcp_sock(sk);
	/* Two in flight: a receiver acknowledges every second segment at once. */
	if (!tp || tp->packets_out < 2)
		return 0;
	if (p->segs > 1)
		return 1;
	if (bpf_skb_load_bytes(skb, hdr + 12, &doff, 1) < 0)
		return 0;
	return skb->len > hdr + (doff >> 4) * 4;
}

/*
 * Forwarded traffic in shaped class `classid` with an_vqueue index `idx` (rate 0 = not
 * shaped): picks the class's sparse or bulk leaf, models the packet in the class's queue
 * and CE-marks a bulk packet that is ECN-capable while the class is congested.
 */
static __always_inline void shape_remote(struct __sk_buff *skb, const struct an_config *cfg,
					 __u32 classid, __u32 idx, __u64 rate, __u64 credit,
					 __u64 frame, struct an_pkt *p)
{
	struct an_vqueue *q = vq_of(idx, rate);
	struct an_flow *f;
	__u32 bucket;
	__u64 now;

	if (!q)
		return;
	now = bpf_ktime_get_ns();
	bucket = flow_bucket(p);
	f = flow_of(idx, bucket);
	if (pick_sparse(cfg, f, rate, credit, frame, p, now)) {
		skb->priority = classid + AN_LEAF_SPARSE;
		vq_add(q, rate, credit, frame, p, now);
		return;
	}
	flow_active(q, bucket, now);
	skb->priority = classid + AN_LEAF_BULK;
	if (feature_on(cfg, AN_CFG_AQM_OFF) && congested(q, rate, frame, now))
		ce_mark(skb, p, q);
	/*
	 * The class's HTB burst is the credit: HTB shapes (the tbf leaf only segments, a little
	 * faster than the class), and lets that much through at once after idle. Without it
	 * the model saw a queue the class did not have: at 100 Mbit/s cubic + ECN got 75,000
	 * marks with an empty queue (flow RTT 0.2 ms) and 94.6-95.7 % of the rate.
	 */
	vq_add(q, rate, credit, frame, p, now);
	flow_bulk(f, t_empty_of(q));
}

/* The fixed TCP header (linux/tcp.h's bit fields are awkward here). */
struct an_tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff;  /* data offset in the high nibble */
	__u8 flags; /* CWR ECE URG ACK PSH RST SYN FIN */
	__be16 window;
	__be16 check;
	__be16 urg_ptr;
};

#define AN_TCP_SYN 0x02
#define AN_TCP_ACK 0x10
#define AN_TCPOPT_MSS 2
#define AN_TCPOPT_WSCALE 3
#define AN_TCP_MAX_WSCALE 14

/*
 * The offset in the packet of TCP option `kind` of length `len` in the header `th` at `off`,
 * or 0 if it has none. An option the walk does not reach (more than 16 options) counts as
 * absent, which only makes the clamps looser.
 */
static __always_inline __u32 tcp_option(struct __sk_buff *skb, __u32 off,
					const struct an_tcphdr *th, __u8 kind, __u8 len)
{
	__u32 hlen = (th->doff >> 4) * 4, optlen = hlen > 20 ? hlen - 20 : 0, i = 0;
	__u8 opt[2];

	for (int n = 0; n < 16; n++) {
		if (i >= optlen || i >= 40)
			break;
		if (bpf_skb_load_bytes(skb, off + 20 + i, opt, 1) < 0 || opt[0] == 0)
			break;
		if (opt[0] == 1) { /* NOP */
			i++;
			continue;
		}
		if (bpf_skb_load_bytes(skb, off + 20 + i, opt, 2) < 0 || opt[1] < 2)
			break;
		if (opt[0] == kind && opt[1] == len && i + len <= optlen)
			return off + 20 + i;
		i += opt[1];
	}
	return 0;
}

/* The window-scale option of a SYN or SYN-ACK, or -1 if it has none. */
static __always_inline int tcp_wscale(struct __sk_buff *skb, __u32 off,
				      const struct an_tcphdr *th)
{
	__u32 at = tcp_option(skb, off, th, AN_TCPOPT_WSCALE, 3);
	__u8 shift;

	if (!at || bpf_skb_load_bytes(skb, at + 2, &shift, 1) < 0)
		return -1;
	return shift > AN_TCP_MAX_WSCALE ? AN_TCP_MAX_WSCALE : shift;
}

/*
 * Lowers the MSS option of a SYN or SYN-ACK to what frames of `seg` bytes carry (Ethernet,
 * IPv4 and TCP headers without options taken off), as MSS clamping to the path MTU does.
 */
static __always_inline void clamp_mss(struct __sk_buff *skb, __u32 off,
				      const struct an_tcphdr *th, __u64 seg)
{
	__u32 at = tcp_option(skb, off, th, AN_TCPOPT_MSS, 4);
	__be16 old, new;

	if (!at || seg <= ETH_HLEN + 40 || bpf_skb_load_bytes(skb, at + 2, &old, 2) < 0)
		return;
	if (bpf_ntohs(old) <= seg - ETH_HLEN - 40)
		return;
	new = bpf_htons((__u16)(seg - ETH_HLEN - 40));
	if (bpf_skb_store_bytes(skb, at + 2, &new, sizeof(new), 0) < 0)
		return;
	bpf_l4_csum_replace(skb, off + offsetof(struct an_tcphdr, check), old, new, sizeof(new));
}

/*
 * Caps the receive window advertised in the TCP segment `th` (at `off`, window shift
 * `wscale`) at `rate` x `rtt_ns` + AN_WND_QUEUE_NS of `rate` (see an_conns in the ABI
 * header), shared among `flows`: the sender at the other end then keeps at most that much in
 * flight, and the shaped class queues at most a short queue's worth of it. The window is
 * only ever lowered.
 */
static __always_inline void clamp_window(struct __sk_buff *skb, __u32 off,
					 const struct an_tcphdr *th, __u32 rtt_ns, __u8 wscale,
					 __u64 rate, __u64 frame, __u32 flows)
{
	__u64 cap, field;
	__be16 win;

	/* Above 100 Gbit/s any window the field can carry is below the cap. */
	if (rate > 100000000000ULL)
		return;
	cap = rate / 8 * (rtt_ns / 1000) / 1000000 + rate / 8 * AN_WND_QUEUE_NS / NSEC_PER_SEC;
	if (cap < AN_WND_MIN_FRAMES * frame)
		cap = AN_WND_MIN_FRAMES * frame;
	/* The flows with a backlog share it. */
	cap /= flows ? flows : 1;
	if (cap < AN_WND_MIN_FLOW_FRAMES * frame)
		cap = AN_WND_MIN_FLOW_FRAMES * frame;
	/* Rounded up: never a zero window. */
	field = (cap + (1ULL << (wscale & 15)) - 1) >> (wscale & 15);
	if (field >= bpf_ntohs(th->window))
		return;
	win = bpf_htons((__u16)field);
	if (bpf_skb_store_bytes(skb, off + offsetof(struct an_tcphdr, window), &win, sizeof(win),
				0) < 0)
		return;
	bpf_l4_csum_replace(skb, off + offsetof(struct an_tcphdr, check), th->window, win,
			    sizeof(win));
}

/*
 * TCP of a pod on the host veth, both directions: learns each connection's window scales
 * and RTT from its handshake; clamps the pod's windows when the pod has an ingress limit
 * (`ingress_limited`), and the remote's windows to the pod when the connection's traffic
 * from the pod passes the node's internet cap (`capped`).
 */
static __always_inline void pod_tcp(struct __sk_buff *skb, const struct an_config *cfg,
				    __u32 slot, __u32 dir, const struct an_pkt *p,
				    int ingress_limited, int capped, __u64 egress_rate, __u64 frame)
{
	__u32 off = ETH_HLEN + p->ihl * 4;
	struct an_conn_key key = {};
	struct an_tcphdr th;
	struct an_conn *c;
	struct an_pod_meta *meta;
	struct an_vqueue *q;
	__u32 qidx;
	__u64 now;
	int ws;

	if (bpf_skb_load_bytes(skb, off, &th, sizeof(th)) < 0)
		return;
	if (dir == AN_DIR_EGRESS) {
		key.pod_addr = p->saddr;
		key.remote_addr = p->daddr;
		key.pod_port = th.source;
		key.remote_port = th.dest;
	} else {
		key.pod_addr = p->daddr;
		key.remote_addr = p->saddr;
		key.pod_port = th.dest;
		key.remote_port = th.source;
	}
	if (th.flags & AN_TCP_SYN) {
		struct an_conn n = {
			.t_handshake = bpf_ktime_get_ns(),
		};

		ws = tcp_wscale(skb, off, &th);
		/*
		 * What each side may send into the slowest shaped class it meets: the remote into
		 * the pod's ingress limit (the pod's MSS), the pod into its egress limit or the
		 * node cap (the remote's MSS).
		 */
		if (dir == AN_DIR_EGRESS && ingress_limited) {
			meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
			if (meta && meta->ingress_rate)
				clamp_mss(skb, off, &th, seg_frame(meta->ingress_rate, frame));
		} else if (dir == AN_DIR_INGRESS) {
			__u64 r = egress_rate;

			if (capped && cfg && (!r || cfg->node_internet_cap < r))
				r = cfg->node_internet_cap;
			if (r)
				clamp_mss(skb, off, &th, seg_frame(r, frame));
		}
		if (!ingress_limited && !capped)
			return;
		if (dir == AN_DIR_INGRESS && !(th.flags & AN_TCP_ACK)) {
			/* The remote's SYN: its scale holds if the pod's SYN-ACK agrees. */
			n.state = AN_CONN_SYN_RCVD;
			n.remote_wscale = ws < 0 ? 0 : ws;
			bpf_map_update_elem(&an_conns, &key, &n, BPF_ANY);
			return;
		}
		if (dir == AN_DIR_EGRESS) {
			/* The pod's SYN offers its scale; its SYN-ACK carries one only if agreed. */
			n.wscale = ws < 0 ? 0 : ws;
			if (th.flags & AN_TCP_ACK) {
				c = bpf_map_lookup_elem(&an_conns, &key);
				if (c && c->state == AN_CONN_SYN_RCVD && ws >= 0)
					n.remote_wscale = c->remote_wscale;
				n.state = AN_CONN_SYNACK_SENT;
			} else {
				n.state = AN_CONN_SYN_SENT;
			}
			bpf_map_update_elem(&an_conns, &key, &n, BPF_ANY);
			return;
		}
	}
	if (!(th.flags & AN_TCP_ACK) || (!ingress_limited && !capped))
		return;
	c = bpf_map_lookup_elem(&an_conns, &key);
	if (!c)
		return;
	qidx = slot * AN_VQ_PER_POD + AN_VQ_INGRESS;
	q = bpf_map_lookup_elem(&an_vqueue, &qidx);
	if (dir == AN_DIR_INGRESS) {
		now = bpf_ktime_get_ns();
		if (c->state == AN_CONN_ESTABLISHED) {
			/*
			 * Data for the pod: the connection shares the clamp's allowance from its
			 * first segment on, before its packets are bulk (same bucket either way).
			 */
			if (ingress_limited && skb->len > off + (th.doff >> 4) * 4)
				flow_active(q, flow_bucket(p), now);
			if (capped && cfg && feature_on(cfg, AN_CFG_CLAMP_OFF)) {
				__u32 cap_idx = AN_VQ_NODE_CAP;
				struct an_vqueue *cq = bpf_map_lookup_elem(&an_vqueue, &cap_idx);

				clamp_window(skb, off, &th, c->rtt_ns, c->remote_wscale,
					     cfg->node_internet_cap,
					     seg_frame(cfg->node_internet_cap,
						       frame_of(cfg->uplink_frame)),
					     bulk_flows(cq, now));
			}
			return;
		}
		if (c->state == AN_CONN_SYN_SENT && (th.flags & AN_TCP_SYN)) {
			/* Without the option in the SYN-ACK neither side's windows are scaled. */
			ws = tcp_wscale(skb, off, &th);
			if (ws < 0)
				c->wscale = 0;
			c->remote_wscale = ws < 0 ? 0 : ws;
		} else if (c->state != AN_CONN_SYNACK_SENT || (th.flags & AN_TCP_SYN)) {
			return;
		}
		c->rtt_ns = now - c->t_handshake > 0xffffffffULL ? 0xffffffff :
								     now - c->t_handshake;
		c->state = AN_CONN_ESTABLISHED;
		return;
	}
	if (!ingress_limited || c->state != AN_CONN_ESTABLISHED || (th.flags & AN_TCP_SYN) ||
	    !feature_on(cfg, AN_CFG_CLAMP_OFF))
		return;
	meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
	if (!meta || !meta->ingress_rate)
		return;
	clamp_window(skb, off, &th, c->rtt_ns, c->wscale, meta->ingress_rate,
		     seg_frame(meta->ingress_rate, frame), bulk_flows(q, bpf_ktime_get_ns()));
}

static __always_inline int host_side(struct __sk_buff *skb, __u32 dir)
{
	struct an_pkt p = {};
	__u32 class = AN_CLASS_OTHER;
	__u32 zero = 0, ifindex = skb->ifindex;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);
	struct an_pod *pod;
	struct an_pod_meta *meta;
	__u32 slot;

	if (parse(skb, &p))
		class = classify(cfg, dir == AN_DIR_EGRESS ? p.daddr : p.saddr);
	pod = bpf_map_lookup_elem(&an_pods, &ifindex);
	/* Not registered (yet, or any more): classify and enforce, but nothing to count into. */
	if (!pod)
		return class == AN_CLASS_BLOCKED ? TC_ACT_SHOT : TC_ACT_UNSPEC;
	slot = pod->slot;
	count(slot, dir, class, &p);
	if (class == AN_CLASS_BLOCKED)
		return TC_ACT_SHOT;
	/*
	 * Ports are read only for unfragmented TCP and UDP, and a TCP port is never 0. The
	 * node cap shapes what the pods send to the internet: those connections are clamped
	 * too while a cap is set.
	 */
	meta = bpf_map_lookup_elem(&an_pod_meta, &slot);
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
	__u32 zero = 0, slot, *s, base;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);
	struct an_pod_meta *meta;
	struct an_vqueue *qi, *qe, *hot = NULL;
	struct an_flow *f;
	__u64 now, irate, erate, rate, ti, te, frame;
	int internet, sparse;

	if (!parse(skb, &p)) {
		skb->priority = AN_CLASSID_POD_OTHER + AN_LEAF_BULK;
		return TC_ACT_UNSPEC;
	}
	internet = classify(cfg, p.daddr) == AN_CLASS_INTERNET;
	base = internet ? AN_CLASSID_POD_INTERNET : AN_CLASSID_POD_OTHER;
	skb->priority = base + AN_LEAF_BULK;
	/* The pod is known by its address here: this device is in the pod's namespace. */
	s = bpf_map_lookup_elem(&an_pod_ips, &p.saddr);
	if (!s)
		return TC_ACT_UNSPEC;
	slot = *s;
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
 * source address assumes no SNAT on the node, as in the alias-IP design.
 */
SEC("classifier")
int an_uplink(struct __sk_buff *skb)
{
	struct an_pkt p = {};
	struct an_node_counters *c;
	__u32 zero = 0;
	struct an_config *cfg = bpf_map_lookup_elem(&an_config, &zero);

	if (!parse(skb, &p))
		return TC_ACT_UNSPEC;
	if (!bpf_map_lookup_elem(&an_pod_ips, &p.saddr))
		return TC_ACT_UNSPEC;
	if (classify(cfg, p.daddr) != AN_CLASS_INTERNET)
		return TC_ACT_UNSPEC;
	skb->priority = AN_CLASSID_NODE_CAP + AN_LEAF_BULK;
	c = bpf_map_lookup_elem(&an_node_ctrs, &zero);
	if (c) {
		c->capped.packets += p.segs;
		c->capped.bytes += p.bytes;
	}
	if (cfg && cfg->node_internet_cap)
		shape_remote(skb, cfg, AN_CLASSID_NODE_CAP, AN_VQ_NODE_CAP, cfg->node_internet_cap,
			     class_credit(0, cfg->node_internet_cap, frame_of(cfg->uplink_frame)),
			     frame_of(cfg->uplink_frame), &p);
	return TC_ACT_UNSPEC;
}

/* Dual licence so GPL-only helpers stay available; none is used today. */
char _license[] SEC("license") = "Dual BSD/GPL";
