/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Flow isolation (an_flows): whether a packet takes its class's sparse or bulk leaf, and
 * which flows have a backlog in the bulk leaf (see aliasnet_tuning.h).
 */
#ifndef ALIASNET_LIB_FLOW_H
#define ALIASNET_LIB_FLOW_H

#include "maps.h"
#include "parse.h"

/* The an_flows bucket of a packet's flow (5-tuple hash) within its flow table. */
static __always_inline __u32 flow_bucket(const struct an_pkt *p)
{
	__u32 h = p->saddr ^ (p->daddr * 0x9e3779b1u) ^ (p->ports * 0x85ebca6bu) ^ p->proto;

	h ^= h >> 16;
	h *= 0x7feb352du;
	h ^= h >> 15;
	return h & (AN_FLOW_BUCKETS - 1);
}

/* The flow state of bucket `bucket` in flow table `table` (AN_FLOWS_POD, AN_FLOWS_AGG). */
static __always_inline struct an_flow *flow_of(__u32 table, __u32 bucket)
{
	__u32 key = table * AN_FLOW_BUCKETS + bucket;

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
 * Whether a packet of flow `f` in a class of `rate` takes the sparse leaf (see flow
 * isolation in aliasnet_tuning.h); charges the flow's sparse budget if so. `credit` is the
 * model's burst credit (see vq_add()). Two CPUs updating one flow can race: a lost update
 * lets one more packet of the budget through.
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

#endif /* ALIASNET_LIB_FLOW_H */
