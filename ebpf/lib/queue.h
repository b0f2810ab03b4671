/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The queue model (an_vqueue): each shaped class's backlog, modelled at the class rate with
 * the class's HTB burst as credit and its leaf's drop-tail limit, as Cilium's EDT does; and
 * the congestion signals taken from it, CE marks and, for local senders, drops.
 */
#ifndef ALIASNET_LIB_QUEUE_H
#define ALIASNET_LIB_QUEUE_H

#include "maps.h"
#include "parse.h"

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
 * with the rate to AN_ECN_MARK_MAX_NS (see aliasnet_tuning.h), and at least
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

/* The modelled queue of an_vqueue index `idx`, if its class is shaped (`rate` > 0). */
static __always_inline struct an_vqueue *vq_of(__u32 idx, __u64 rate)
{
	return rate ? bpf_map_lookup_elem(&an_vqueue, &idx) : NULL;
}

/* The HTB burst of a class at `rate` (> 0), in ns: `burst` bytes if set, else the default. */
static __always_inline __u64 class_credit(__u64 burst, __u64 rate, __u64 frame)
{
	__u64 floor, t;

	if (burst)
		return burst_ns(burst, rate);
	/* AN_DEFAULT_BURST_FRAMES of the class's segments, and at least one frame. */
	floor = AN_DEFAULT_BURST_FRAMES * seg_frame(rate, frame);
	if (floor < frame)
		floor = frame;
	t = tx_ns(floor, rate);
	return t > AN_DEFAULT_BURST_NS ? t : AN_DEFAULT_BURST_NS;
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
	__u32 hdr = l4_off(p);
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
	if (bpf_skb_load_bytes(skb, hdr + AN_TCP_DOFF, &doff, sizeof(doff)) < 0)
		return 0;
	return skb->len > hdr + AN_TCP_HDR_LEN(doff);
}

#endif /* ALIASNET_LIB_QUEUE_H */
