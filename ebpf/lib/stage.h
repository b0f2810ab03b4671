/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A shaping stage: the limits one level (the pod, its namespace, the node) sets on a
 * packet, most general first; the leaf the packet takes on that level's device; its place
 * in the queue model of every one of those limits; its CE mark.
 */
#ifndef ALIASNET_LIB_STAGE_H
#define ALIASNET_LIB_STAGE_H

#include "classify.h"
#include "flow.h"
#include "queue.h"

/* Levels, from the pod's own limits out. */
#define AN_LEVEL_POD 0
#define AN_LEVEL_NS 1
#define AN_LEVEL_NODE 2

/* At most total > internet > named class on one level. */
#define AN_STAGE_MAX 3

struct an_stage {
	__u64 rate[AN_STAGE_MAX];   /* bit/s */
	__u64 credit[AN_STAGE_MAX]; /* the limit's HTB burst, ns */
	__u32 vq[AN_STAGE_MAX];     /* an_vqueue index */
	__u32 kind[AN_STAGE_MAX];   /* AN_KIND_* */
	__u32 n;
	__u32 flows;  /* the level's flow table (an_flows) */
	__u64 frame;  /* the shaped device's largest frame */
};

/* Adds a limit of `kind` at `rate` (0 = none) to the stage. */
static __always_inline void stage_add(struct an_stage *st, __u32 kind, __u64 rate, __u64 burst,
				      __u32 vq)
{
	__u64 credit;

	if (!rate)
		return;
	credit = class_credit(burst, rate, st->frame);
	switch (st->n) {
	case 0:
		st->rate[0] = rate;
		st->credit[0] = credit;
		st->vq[0] = vq;
		st->kind[0] = kind;
		break;
	case 1:
		st->rate[1] = rate;
		st->credit[1] = credit;
		st->vq[1] = vq;
		st->kind[1] = kind;
		break;
	case 2:
		st->rate[2] = rate;
		st->credit[2] = credit;
		st->vq[2] = vq;
		st->kind[2] = kind;
		break;
	default:
		return;
	}
	st->n++;
}

/* The most specific limit of the stage (its deepest HTB class); the stage is not empty. */
static __always_inline __u32 stage_kind(const struct an_stage *st)
{
	if (st->n >= 3)
		return st->kind[2];
	if (st->n == 2)
		return st->kind[1];
	return st->kind[0];
}

/* The tightest rate of the stage, 0 if it has no limit. */
static __always_inline __u64 stage_rate(const struct an_stage *st)
{
	__u64 r = 0;

#pragma unroll
	for (__u32 i = 0; i < AN_STAGE_MAX; i++) {
		if (i >= st->n)
			break;
		if (!r || st->rate[i] < r)
			r = st->rate[i];
	}
	return r;
}

/*
 * The limits of level rates `r` that a packet of `class` meets in `dir`: the level's total
 * (a pod's only, and only with `total`), its internet limit for internet traffic, and its
 * named class's limit. An aggregate's limit counts only once its HTB group exists on the
 * level's device (`groups`, NULL for a pod): until then the device cannot shape it.
 * `vq0` is the level's an_vqueue index of kind 0.
 */
static __always_inline void stage_limits(struct an_stage *st, const struct an_rates *r,
					 const __u16 *groups, __u32 dir, __u32 class, int total,
					 __u64 burst, __u32 vq0)
{
	__u32 nk = named_kind(class), d = dir & 1;

	if (total)
		stage_add(st, AN_KIND_TOTAL, r->rate[d][AN_KIND_TOTAL], burst, vq0 + AN_KIND_TOTAL);
	if (!is_internet(class))
		return;
	if (!groups || groups[AN_KIND_INTERNET])
		stage_add(st, AN_KIND_INTERNET, r->rate[d][AN_KIND_INTERNET], 0,
			  vq0 + AN_KIND_INTERNET);
	if (!nk)
		return;
	/* Checked apart from the test for 0, on the register the access uses. */
	barrier_var(nk);
	if (nk < AN_NR_KINDS && (!groups || groups[nk]))
		stage_add(st, nk, r->rate[d][nk], 0, vq0 + nk);
}

/*
 * The aggregate of `level` (AN_LEVEL_NS: the pod's namespace; AN_LEVEL_NODE) whose limits
 * are in force in `dir` (their device is set up), with its entity number in *id.
 */
static __always_inline struct an_entity *level_entity(const struct an_config *cfg,
						       const struct an_pod_meta *meta,
						       __u32 level, __u32 dir, __u32 *id)
{
	__u32 e = AN_NODE_ENTITY;

	if (!cfg)
		return NULL;
	if (level == AN_LEVEL_NS) {
		if (!meta || !meta->entity || meta->entity >= AN_MAX_ENTITIES)
			return NULL;
		if (!(dir == AN_DIR_INGRESS ? cfg->ns_in_ifindex : cfg->ns_out_ifindex))
			return NULL;
		e = meta->entity;
	} else if (!(dir == AN_DIR_INGRESS ? cfg->node_in_ifindex : cfg->node_out)) {
		return NULL;
	}
	*id = e;
	return bpf_map_lookup_elem(&an_entities, &e);
}

/*
 * Fills `st` with the limits of `level` that a packet of `class` of the pod at `slot`
 * (record `meta`) meets in `dir`; returns the aggregate's record for the aggregate levels
 * (NULL when none is in force). A pod's total limit applies to all its traffic but blocked,
 * so `class` other (ARP, link-scoped IPv6) meets it too.
 */
static __always_inline struct an_entity *stage_of(struct an_stage *st,
						  const struct an_config *cfg,
						  const struct an_pod_meta *meta, __u32 slot,
						  __u32 level, __u32 dir, __u32 class)
{
	struct an_entity *e;
	__u32 id = 0, d = dir & 1;

	st->n = 0;
	st->frame = frame_of(meta->frame);
	if (level == AN_LEVEL_POD) {
		st->flows = AN_FLOWS_POD(slot, d);
		stage_limits(st, &meta->limits, NULL, d, class, 1, meta->burst[d],
			     AN_VQ_POD(slot, d, 0));
		return NULL;
	}
	e = level_entity(cfg, meta, level, d, &id);
	if (!e)
		return NULL;
	if (level == AN_LEVEL_NODE && cfg->uplink_frame)
		st->frame = cfg->uplink_frame;
	st->flows = AN_FLOWS_AGG(id, d);
	stage_limits(st, &e->limits, e->groups[d], d, class, 0, 0, AN_VQ_AGG(id, d, 0));
	return e;
}

/*
 * Picks the packet's leaf in stage `st` (not empty), sparse or bulk (see flow isolation in
 * aliasnet_tuning.h), and models the packet in the queue of every limit of the stage. A
 * bulk packet that is ECN-capable is CE-marked while one of them is congested; a local TCP
 * data segment that cannot be marked (`local`: the pod's own eth0, where the sender is in
 * this namespace) is dropped instead, a congestion signal and not a loss for its sender.
 * Returns 1 for the sparse leaf, 0 for the bulk one, -1 for a drop. Bulk packets of remote
 * senders mark their flow as one with a backlog (the window clamp shares its allowance
 * among those).
 */
static __always_inline int stage_shape(struct __sk_buff *skb, const struct an_config *cfg,
				       const struct an_stage *st, struct an_pkt *p, int local)
{
	struct an_vqueue *q0, *q1 = NULL, *q2 = NULL, *hot = NULL;
	__u64 now = bpf_ktime_get_ns(), rate = stage_rate(st), credit = st->credit[0], t;
	__u32 bucket = flow_bucket(p), k;
	struct an_flow *f = flow_of(st->flows, bucket);
	int sparse;

	k = st->vq[0];
	q0 = bpf_map_lookup_elem(&an_vqueue, &k);
	if (st->n > 1) {
		k = st->vq[1];
		q1 = bpf_map_lookup_elem(&an_vqueue, &k);
		if (st->credit[1] > credit)
			credit = st->credit[1];
	}
	if (st->n > 2) {
		k = st->vq[2];
		q2 = bpf_map_lookup_elem(&an_vqueue, &k);
		if (st->credit[2] > credit)
			credit = st->credit[2];
	}
	sparse = pick_sparse(cfg, f, rate, credit, st->frame, p, now);
	if (!sparse) {
		if (!local) {
			flow_active(q0, bucket, now);
			flow_active(q1, bucket, now);
			flow_active(q2, bucket, now);
		}
		if (congested(q0, st->rate[0], st->frame, now))
			hot = q0;
		else if (q1 && congested(q1, st->rate[1], st->frame, now))
			hot = q1;
		else if (q2 && congested(q2, st->rate[2], st->frame, now))
			hot = q2;
		if (hot && feature_on(cfg, AN_CFG_AQM_OFF) && !ce_mark(skb, p, hot) && local &&
		    (p->tos & 3) != 3 && local_tcp_data(skb, p)) {
			__sync_fetch_and_add(&hot->dropped, p->segs);
			return -1;
		}
	}
	/*
	 * Each limit's HTB burst is its model's credit: HTB shapes (the tbf leaf only segments,
	 * a little faster than the class), and lets that much through at once after idle.
	 * Without it the model saw a queue the class did not have: at 100 Mbit/s cubic + ECN
	 * got 75,000 marks with an empty queue (flow RTT 0.2 ms) and 94.6-95.7 % of the rate.
	 */
	if (q0)
		vq_add(q0, st->rate[0], st->credit[0], st->frame, p, now);
	if (q1)
		vq_add(q1, st->rate[1], st->credit[1], st->frame, p, now);
	if (q2)
		vq_add(q2, st->rate[2], st->credit[2], st->frame, p, now);
	if (!sparse) {
		t = t_empty_of(q0);
		if (t_empty_of(q1) > t)
			t = t_empty_of(q1);
		if (t_empty_of(q2) > t)
			t = t_empty_of(q2);
		/*
		 * An aggregate's pods have bulk leaves of their own, which HTB serves round by
		 * round, not in arrival order: the packet leaves once its pod's part of the backlog
		 * ahead of it has, at no less than the rate over the pods with a backlog, so at most
		 * that many times later than the arrival-order model says. With the model's time
		 * the sparse leaf overtook the flow's queued packets: 4 pods sharing 10 Mbit/s
		 * retransmitted 1-3 % of their segments for nothing in one run of five.
		 */
		if (st->flows >= AN_FLOWS_AGG(0, 0) && t > now)
			t = now + (t - now) * bulk_flows(q0, now);
		flow_bulk(f, t);
	}
	return sparse;
}

/* The HTB class of a pod-level stage's leaf on the pod's device. */
static __always_inline __u32 pod_leaf(const struct an_stage *st, int sparse)
{
	return (AN_HTB_MAJOR << 16) | (AN_POD_CLASS(stage_kind(st)) +
				       (sparse ? AN_LEAF_SPARSE : AN_LEAF_BULK));
}

/*
 * The minor of an aggregate stage's leaf on its device: the group's sparse leaf, the pod's
 * own bulk leaf under the group when it has one (`own`: an_pod_meta.agg_leaves of the level
 * and direction), or else the group's shared bulk leaf.
 */
static __always_inline __u32 agg_leaf(const struct an_stage *st, const struct an_entity *e,
				      __u32 dir, __u64 own, __u32 slot, int sparse)
{
	__u32 kind = stage_kind(st), g;

	barrier_var(kind);
	if (kind >= AN_NR_KINDS)
		return 0;
	g = e->groups[dir & 1][kind];
	if (sparse)
		return g + AN_GROUP_SPARSE;
	if ((own >> kind) & 1)
		return AN_AGG_LEAF(kind, slot);
	return g + AN_GROUP_SHARED;
}

#endif /* ALIASNET_LIB_STAGE_H */
