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
#include "stage.h"

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
 * The cap one limit at `rate` puts on a connection's receive window: `rate` x `rtt_ns` +
 * AN_WND_QUEUE_NS of `rate` (see the window clamp in aliasnet_tuning.h), shared among
 * `flows`, in bytes; the sender at the other end then keeps at most that much in flight,
 * and the shaped limit queues at most a short queue's worth of it. `frame` is the limit's
 * segment frame. Above 100 Gbit/s any window the field can carry is below it: no cap.
 */
static __always_inline __u64 wnd_cap(__u64 rate, __u32 rtt_ns, __u64 frame, __u32 flows)
{
	__u64 cap;

	if (rate > 100000000000ULL)
		return ~0ULL;
	cap = rate / 8 * (rtt_ns / 1000) / 1000000 + rate / 8 * AN_WND_QUEUE_NS / NSEC_PER_SEC;
	if (cap < AN_WND_MIN_FRAMES * frame)
		cap = AN_WND_MIN_FRAMES * frame;
	/* The flows with a backlog share it. */
	cap /= flows ? flows : 1;
	if (cap < AN_WND_MIN_FLOW_FRAMES * frame)
		cap = AN_WND_MIN_FLOW_FRAMES * frame;
	return cap;
}

/* The tightest cap the limits of stage `st` put on a connection's window (~0 for none). */
static __always_inline __u64 stage_cap(const struct an_stage *st, __u32 rtt_ns, __u64 now)
{
	__u64 cap = ~0ULL, c;
	struct an_vqueue *q;
	__u32 k;

#pragma unroll
	for (__u32 i = 0; i < AN_STAGE_MAX; i++) {
		if (i >= st->n)
			break;
		k = st->vq[i];
		q = bpf_map_lookup_elem(&an_vqueue, &k);
		c = wnd_cap(st->rate[i], rtt_ns, seg_frame(st->rate[i], st->frame),
			    bulk_flows(q, now));
		if (c < cap)
			cap = c;
	}
	return cap;
}

/* Marks the packet's flow as one with a backlog in every limit of stage `st`. */
static __always_inline void stage_active(const struct an_stage *st, __u32 bucket, __u64 now)
{
	__u32 k;

#pragma unroll
	for (__u32 i = 0; i < AN_STAGE_MAX; i++) {
		if (i >= st->n)
			break;
		k = st->vq[i];
		flow_active(bpf_map_lookup_elem(&an_vqueue, &k), bucket, now);
	}
}

/*
 * Lowers the receive window advertised in the TCP segment `th` (at `off`, window shift
 * `wscale`) to `cap` bytes, rounded up so never to zero. The window is only ever lowered.
 */
static __always_inline void set_window(struct __sk_buff *skb, __u32 off,
				       const struct an_tcphdr *th, __u64 cap, __u8 wscale)
{
	__u64 field;
	__be16 win;

	if (cap == ~0ULL || !tcp_header_fits(skb, off, th))
		return;
	field = (cap + (1ULL << (wscale & 15)) - 1) >> (wscale & 15);
	if (field >= bpf_ntohs(th->window))
		return;
	win = bpf_htons((__u16)field);
	if (bpf_skb_store_bytes(skb, off + AN_TCP_WINDOW, &win, sizeof(win), 0) < 0)
		return;
	bpf_l4_csum_replace(skb, off + AN_TCP_CHECK, th->window, win, sizeof(win));
}

/*
 * The tightest limit a packet of `class` meets in `dir` on the levels from `level` out
 * (AN_LEVEL_POD: all of them; AN_LEVEL_NS: the aggregates), 0 = none.
 */
static __always_inline __u64 tightest(const struct an_config *cfg,
				      const struct an_pod_meta *meta, __u32 slot, __u32 dir,
				      __u32 class, __u32 level)
{
	struct an_stage st = {};
	__u64 r = 0, x;

#pragma unroll
	for (__u32 l = AN_LEVEL_POD; l <= AN_LEVEL_NODE; l++) {
		if (l < level)
			continue;
		stage_of(&st, cfg, meta, slot, l, dir, class);
		x = stage_rate(&st);
		if (x && (!r || x < r))
			r = x;
	}
	return r;
}

/* The tightest window cap the limits of `dir` put on a connection, levels from `level` out. */
static __always_inline __u64 window_cap(const struct an_config *cfg,
					const struct an_pod_meta *meta, __u32 slot, __u32 dir,
					__u32 class, __u32 level, __u32 rtt_ns, __u64 now)
{
	struct an_stage st = {};
	__u64 cap = ~0ULL, x;

#pragma unroll
	for (__u32 l = AN_LEVEL_POD; l <= AN_LEVEL_NODE; l++) {
		if (l < level)
			continue;
		stage_of(&st, cfg, meta, slot, l, dir, class);
		x = stage_cap(&st, rtt_ns, now);
		if (x < cap)
			cap = x;
	}
	return cap;
}

/* Marks a flow to the pod as one with a backlog in every limit it meets to the pod. */
static __always_inline void flow_to_pod(const struct an_config *cfg,
					const struct an_pod_meta *meta, __u32 slot, __u32 class,
					__u32 bucket, __u64 now)
{
	struct an_stage st = {};

#pragma unroll
	for (__u32 l = AN_LEVEL_POD; l <= AN_LEVEL_NODE; l++) {
		stage_of(&st, cfg, meta, slot, l, AN_DIR_INGRESS, class);
		stage_active(&st, bucket, now);
	}
}

/* The an_conns entries one pod may hold (see an_conns in aliasnet_abi.h). */
static __always_inline __s64 conn_share(const struct an_config *cfg)
{
	return cfg && cfg->conn_share ? (__s64)cfg->conn_share : AN_CONN_SHARE_DEFAULT;
}

/* A pod's attachment, as an_conn.gen records it. */
static __always_inline __u32 conn_gen(const struct an_pod_meta *meta)
{
	return (__u32)meta->attached_unix_ns;
}

/*
 * Removes connection `key` (entry `c`) and gives its place back to the share of the pod that
 * holds it, if that pod is still the attachment that learnt it (a new attachment of the slot
 * starts from an empty share).
 */
static __always_inline void conn_forget(const struct an_conn_key *key, const struct an_conn *c)
{
	__u32 slot = c->slot, gen = c->gen;
	struct an_pod_meta *m;
	struct an_pod_rt *rt;

	/* Whoever deletes the entry gives its place back, once. */
	if (bpf_map_delete_elem(&an_conns, key))
		return;
	m = bpf_map_lookup_elem(&an_pod_meta, &slot);
	rt = bpf_map_lookup_elem(&an_pod_rt, &slot);
	if (m && rt && conn_gen(m) == gen)
		__sync_fetch_and_add(&rt->conns, -1);
}

/*
 * Learns connection `key` as `n` (its pod's slot and attachment set): in place of the
 * entry the pod has for it (a handshake again on the same ports), else in a place of the
 * pod's share; a pod whose share (or the table) is full learns nothing, counted as refused.
 * Returns 1 if the connection is learnt.
 */
static __always_inline int conn_learn(const struct an_config *cfg, struct an_pod_rt *rt,
				      const struct an_conn_key *key, const struct an_conn *n)
{
	struct an_conn *old = bpf_map_lookup_elem(&an_conns, key);

	if (!rt)
		return 0;
	if (old) {
		if (old->slot == n->slot && old->gen == n->gen)
			return bpf_map_update_elem(&an_conns, key, n, BPF_EXIST) == 0;
		/* Another attachment's: its pod's address is this pod's now. */
		conn_forget(key, old);
	}
	if (rt->conns >= conn_share(cfg) ||
	    bpf_map_update_elem(&an_conns, key, n, BPF_NOEXIST) != 0) {
		__sync_fetch_and_add(&rt->conns_refused, 1);
		return 0;
	}
	__sync_fetch_and_add(&rt->conns, 1);
	return 1;
}

/*
 * A pod's usual handshake, for connections learnt again mid-way: the window scale of its
 * last SYN or SYN-ACK that offered one, and its recent largest handshake round trip (decaying
 * by 1/8 per handshake: a round trip too short would clamp below the limit, one too long
 * only clamps less).
 */
static __always_inline void pod_handshake(struct an_pod_rt *rt, int wscale, __u32 rtt_ns)
{
	if (!rt)
		return;
	if (wscale >= 0)
		rt->tcp_wscale = wscale;
	if (rtt_ns) {
		__u32 decayed = rt->tcp_rtt_ns - rt->tcp_rtt_ns / 8;

		rt->tcp_rtt_ns = rtt_ns > decayed ? rtt_ns : decayed;
		rt->tcp_known = 1;
	}
}

/*
 * TCP of a pod on the host veth, both directions, for a packet of `class`: learns each
 * connection's window scales and RTT from its handshake; clamps the pod's windows to the
 * limits on traffic to the pod (its own, its namespace's, the node's), and the remote's
 * windows to the pod to the aggregate limits on traffic from the pod (its namespace's and
 * the node's, shaped on host devices where a drop is a loss for the pod's TCP; the pod's own
 * egress limits shape its local TCP with back-pressure). A handshake's MSS is lowered to
 * the segment size of the tightest limit each side sends into.
 */
static __always_inline void pod_tcp(struct __sk_buff *skb, const struct an_config *cfg,
				    __u32 slot, __u32 dir, const struct an_pkt *p,
				    const struct an_pod_meta *meta, __u32 class)
{
	__u32 off = l4_off(p);
	struct an_conn_key key = {};
	struct an_tcphdr th;
	struct an_conn *c;
	struct an_pod_rt *rt;
	__u64 now, in_rate, agg_rate, out_rate;
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
	if (th.flags & AN_TCP_RST) {
		c = bpf_map_lookup_elem(&an_conns, &key);
		if (c)
			conn_forget(&key, c);
		return;
	}
	in_rate = tightest(cfg, meta, slot, AN_DIR_INGRESS, class, AN_LEVEL_POD);
	agg_rate = tightest(cfg, meta, slot, AN_DIR_EGRESS, class, AN_LEVEL_NS);
	now = bpf_ktime_get_ns();
	rt = bpf_map_lookup_elem(&an_pod_rt, &slot);
	if (th.flags & AN_TCP_SYN) {
		struct an_conn n = {
			.t_handshake = now,
			.slot = slot,
			.gen = conn_gen(meta),
			.t_last = now >> AN_CONN_TIME_SHIFT,
		};

		ws = tcp_wscale(skb, off, &th);
		/*
		 * What each side may send into the tightest limit it meets: the remote into the
		 * limits to the pod (the pod's MSS), the pod into its egress limits and its
		 * aggregates' (the remote's MSS).
		 */
		if (dir == AN_DIR_EGRESS && in_rate) {
			clamp_mss(skb, off, &th, seg_frame(in_rate, frame_of(meta->frame)), p->v6);
		} else if (dir == AN_DIR_INGRESS) {
			out_rate = tightest(cfg, meta, slot, AN_DIR_EGRESS, class, AN_LEVEL_POD);
			if (out_rate)
				clamp_mss(skb, off, &th, seg_frame(out_rate, frame_of(meta->frame)),
					  p->v6);
		}
		if (!in_rate && !agg_rate)
			return;
		if (dir == AN_DIR_INGRESS && !(th.flags & AN_TCP_ACK)) {
			/* The remote's SYN: its scale holds if the pod's SYN-ACK agrees. */
			n.state = AN_CONN_SYN_RCVD;
			n.remote_wscale = ws < 0 ? 0 : ws;
			conn_learn(cfg, rt, &key, &n);
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
			pod_handshake(rt, ws, 0);
			conn_learn(cfg, rt, &key, &n);
			return;
		}
	}
	if (!(th.flags & AN_TCP_ACK) || (!in_rate && !agg_rate))
		return;
	c = bpf_map_lookup_elem(&an_conns, &key);
	if (!c) {
		/*
		 * Learnt before and gone (swept while idle, or never learnt for a full share):
		 * learnt again with the pod's usual handshake; the remote's scale is unknown, so
		 * only the pod's windows are clamped. The clamp applies from the next packet on.
		 * A pod at its share tries again with its next packet, uncounted (refusals count
		 * connections, not packets).
		 */
		if (rt && rt->tcp_known && !(th.flags & (AN_TCP_SYN | AN_TCP_FIN)) &&
		    rt->conns < conn_share(cfg)) {
			struct an_conn n = {
				.t_handshake = now,
				.rtt_ns = rt->tcp_rtt_ns,
				.wscale = rt->tcp_wscale,
				.state = AN_CONN_ESTABLISHED,
				.flags = AN_CONN_F_RELEARNT,
				.slot = slot,
				.gen = conn_gen(meta),
				.t_last = now >> AN_CONN_TIME_SHIFT,
			};

			if (conn_learn(cfg, rt, &key, &n))
				__sync_fetch_and_add(&rt->conns_relearnt, 1);
		}
		return;
	}
	/* One write a second at most: the sweep goes by it. */
	if (c->t_last != (__u32)(now >> AN_CONN_TIME_SHIFT))
		c->t_last = now >> AN_CONN_TIME_SHIFT;
	if (th.flags & AN_TCP_FIN)
		c->flags |= dir == AN_DIR_EGRESS ? AN_CONN_F_FIN_POD : AN_CONN_F_FIN_REMOTE;
	if (dir == AN_DIR_INGRESS) {
		if (c->state == AN_CONN_ESTABLISHED) {
			/*
			 * Data for the pod: the connection shares the clamp's allowance from its
			 * first segment on, before its packets are bulk (same bucket either way).
			 */
			if (in_rate && skb->len > off + AN_TCP_HDR_LEN(th.doff))
				flow_to_pod(cfg, meta, slot, class, flow_bucket(p), now);
			if (agg_rate && !(c->flags & AN_CONN_F_RELEARNT) &&
			    feature_on(cfg, AN_CFG_CLAMP_OFF))
				set_window(skb, off, &th,
					   window_cap(cfg, meta, slot, AN_DIR_EGRESS, class,
						      AN_LEVEL_NS, c->rtt_ns, now),
					   c->remote_wscale);
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
		pod_handshake(rt, -1, c->rtt_ns);
		return;
	}
	if (!in_rate || c->state != AN_CONN_ESTABLISHED || (th.flags & AN_TCP_SYN) ||
	    !feature_on(cfg, AN_CFG_CLAMP_OFF))
		return;
	set_window(skb, off, &th,
		   window_cap(cfg, meta, slot, AN_DIR_INGRESS, class, AN_LEVEL_POD, c->rtt_ns, now),
		   c->wscale);
}

#endif /* ALIASNET_LIB_WNDCLAMP_H */
