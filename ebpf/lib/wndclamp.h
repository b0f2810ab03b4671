/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * TCP of a pod on the host veth: the connections' window scales and RTT learnt from their
 * handshakes (an_conns), the MSS clamp to a shaped class's segment size, and the receive
 * window clamp (see aliasnet_tuning.h).
 */
#ifndef ALIASNET_LIB_WNDCLAMP_H
#define ALIASNET_LIB_WNDCLAMP_H

#include "flow.h"
#include "maps.h"
#include "parse.h"

#define AN_TCPOPT_EOL 0
#define AN_TCPOPT_NOP 1
#define AN_TCPOPT_MSS 2
#define AN_TCPOPT_WSCALE 3
#define AN_TCPOLEN_MSS 4
#define AN_TCPOLEN_WSCALE 3
/* Kind and length bytes before an option's value. */
#define AN_TCPOPT_HDR 2
/* Options fill at most a 60-byte header. */
#define AN_TCP_MAX_OPTLEN (60 - AN_TCP_HLEN)
#define AN_TCP_MAX_WSCALE 14
/* Headers of a frame carrying one full-sized TCP segment without options, per family. */
#define AN_TCP_FRAME_HDRS (ETH_HLEN + sizeof(struct iphdr) + sizeof(struct an_tcphdr))
#define AN_TCP6_FRAME_HDRS (ETH_HLEN + AN_IP6_HLEN + sizeof(struct an_tcphdr))

/*
 * Whether the TCP header `th` at `off` is whole: at least its fixed part and within the
 * packet. A receiver drops any other, so the clamps rewrite nothing in it.
 */
static __always_inline int tcp_header_fits(const struct __sk_buff *skb, __u32 off,
					   const struct an_tcphdr *th)
{
	__u32 hlen = AN_TCP_HDR_LEN(th->doff);

	return hlen >= AN_TCP_HLEN && skb->len >= off + hlen;
}

/*
 * The offset in the packet of TCP option `kind` of length `len` in the header at `off`
 * whose data-offset byte is `doff`, or 0 if it has none. An option the walk does not reach
 * (more than 16 options) counts as absent, which only makes the clamps looser. A global
 * function, checked once by the verifier rather than at every call in every program path.
 */
__attribute__((noinline)) __u32 an_tcp_option(struct __sk_buff *skb, __u32 off, __u32 doff,
					      __u32 kind, __u32 len)
{
	__u32 hlen = AN_TCP_HDR_LEN(doff & 0xff), optlen = hlen > AN_TCP_HLEN ? hlen - AN_TCP_HLEN : 0;
	__u32 i = 0;
	__u8 opt[AN_TCPOPT_HDR];

	if (!skb)
		return 0;

	for (int n = 0; n < 16; n++) {
		if (i >= optlen || i >= AN_TCP_MAX_OPTLEN)
			break;
		if (bpf_skb_load_bytes(skb, off + AN_TCP_HLEN + i, opt, 1) < 0 ||
		    opt[0] == AN_TCPOPT_EOL)
			break;
		if (opt[0] == AN_TCPOPT_NOP) {
			i++;
			continue;
		}
		if (bpf_skb_load_bytes(skb, off + AN_TCP_HLEN + i, opt, AN_TCPOPT_HDR) < 0 ||
		    opt[1] < AN_TCPOPT_HDR)
			break;
		if (opt[0] == kind && opt[1] == len && i + len <= optlen)
			return off + AN_TCP_HLEN + i;
		i += opt[1];
	}
	return 0;
}

static __always_inline __u32 tcp_option(struct __sk_buff *skb, __u32 off,
					const struct an_tcphdr *th, __u8 kind, __u8 len)
{
	return an_tcp_option(skb, off, th->doff, kind, len);
}

/* The window-scale option of a SYN or SYN-ACK, or -1 if it has none. */
static __always_inline int tcp_wscale(struct __sk_buff *skb, __u32 off,
				      const struct an_tcphdr *th)
{
	__u32 at = tcp_option(skb, off, th, AN_TCPOPT_WSCALE, AN_TCPOLEN_WSCALE);
	__u8 shift;

	if (!at || bpf_skb_load_bytes(skb, at + AN_TCPOPT_HDR, &shift, sizeof(shift)) < 0)
		return -1;
	return shift > AN_TCP_MAX_WSCALE ? AN_TCP_MAX_WSCALE : shift;
}

/*
 * Lowers the MSS option of a SYN or SYN-ACK to what frames of `seg` bytes carry (Ethernet,
 * IP and TCP headers without options taken off), as MSS clamping to the path MTU does.
 */
static __always_inline void clamp_mss(struct __sk_buff *skb, __u32 off,
				      const struct an_tcphdr *th, __u64 seg, int v6)
{
	__u64 hdrs = v6 ? AN_TCP6_FRAME_HDRS : AN_TCP_FRAME_HDRS;
	__u32 at;
	__be16 old, new;

	if (!tcp_header_fits(skb, off, th))
		return;
	at = tcp_option(skb, off, th, AN_TCPOPT_MSS, AN_TCPOLEN_MSS);
	if (!at || seg <= hdrs ||
	    bpf_skb_load_bytes(skb, at + AN_TCPOPT_HDR, &old, sizeof(old)) < 0)
		return;
	if (bpf_ntohs(old) <= seg - hdrs)
		return;
	new = bpf_htons((__u16)(seg - hdrs));
	if (bpf_skb_store_bytes(skb, at + AN_TCPOPT_HDR, &new, sizeof(new), 0) < 0)
		return;
	bpf_l4_csum_replace(skb, off + AN_TCP_CHECK, old, new, sizeof(new));
}

/*
 * Caps the receive window advertised in the TCP segment `th` (at `off`, window shift
 * `wscale`) at `rate` x `rtt_ns` + AN_WND_QUEUE_NS of `rate` (see the window clamp in
 * aliasnet_tuning.h), shared among `flows`: the sender at the other end then keeps at most
 * that much in flight, and the shaped class queues at most a short queue's worth of it.
 * The window is only ever lowered.
 */
static __always_inline void clamp_window(struct __sk_buff *skb, __u32 off,
					 const struct an_tcphdr *th, __u32 rtt_ns, __u8 wscale,
					 __u64 rate, __u64 frame, __u32 flows)
{
	__u64 cap, field;
	__be16 win;

	/* Above 100 Gbit/s any window the field can carry is below the cap. */
	if (rate > 100000000000ULL || !tcp_header_fits(skb, off, th))
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
	if (bpf_skb_store_bytes(skb, off + AN_TCP_WINDOW, &win, sizeof(win), 0) < 0)
		return;
	bpf_l4_csum_replace(skb, off + AN_TCP_CHECK, th->window, win, sizeof(win));
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
	__u32 off = l4_off(p);
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
	/* IPv4 as IPv4-mapped IPv6 (see struct an_pkt). */
	for (int i = 0; i < 4; i++) {
		key.pod_addr[i] = dir == AN_DIR_EGRESS ? p->saddr6[i] : p->daddr6[i];
		key.remote_addr[i] = dir == AN_DIR_EGRESS ? p->daddr6[i] : p->saddr6[i];
	}
	if (dir == AN_DIR_EGRESS) {
		key.pod_port = th.source;
		key.remote_port = th.dest;
	} else {
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
				clamp_mss(skb, off, &th, seg_frame(meta->ingress_rate, frame), p->v6);
		} else if (dir == AN_DIR_INGRESS) {
			__u64 r = egress_rate;

			if (capped && cfg && (!r || cfg->node_internet_cap < r))
				r = cfg->node_internet_cap;
			if (r)
				clamp_mss(skb, off, &th, seg_frame(r, frame), p->v6);
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
			if (ingress_limited && skb->len > off + AN_TCP_HDR_LEN(th.doff))
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

#endif /* ALIASNET_LIB_WNDCLAMP_H */
