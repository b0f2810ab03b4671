/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The backstop of a pod's egress limits, on its host veth. The limits are shaped by HTB on
 * the pod's own eth0, in the pod's namespace, where a process holding CAP_NET_ADMIN can
 * delete or replace the qdisc and the filter. The host veth, which the pod cannot change,
 * polices what arrives: per egress limit a queue model draining at AN_POLICE_RATE_PCT % of
 * the limit, and a packet that would wait in it longer than the tolerance (see
 * aliasnet_tuning.h) is dropped. What the pod's HTB released conforms to the limit and its
 * burst, so the backstop drops none of it; a pod without its HTB gets at most the police
 * rate after one tolerance's worth of burst.
 */
#ifndef ALIASNET_LIB_POLICE_H
#define ALIASNET_LIB_POLICE_H

#include "classify.h"
#include "queue.h"

/* The backlog the backstop of a limit at `rate` (> 0) lets through, in ns at that rate. */
static __always_inline __u64 police_tolerance(__u64 burst, __u64 rate, __u64 frame,
					      __u64 gso_max)
{
	__u64 gso = gso_max > frame ? gso_max : frame;

	if (gso > AN_POLICE_GSO_CAP)
		gso = AN_POLICE_GSO_CAP;

	return class_credit(burst, rate, frame) + tx_ns(gso, rate) +
	       at_least(AN_POLICE_SLACK_NS, AN_POLICE_SLACK_FRAMES, frame, rate);
}

/* The rate the backstop of a limit at `rate` drains at (no wrap up to 1 Pbit/s). */
static __always_inline __u64 police_rate(__u64 rate)
{
	return rate / 100 * AN_POLICE_RATE_PCT + rate % 100 * AN_POLICE_RATE_PCT / 100;
}

/* Whether the backstop model `q` of a limit at `rate` is past its tolerance `tol`. */
static __always_inline int police_full(const struct an_vqueue *q, __u64 tol, __u64 now)
{
	return q && vq_wait(q, now) > tol;
}

/* Adds an admitted packet to the backstop model `q`, which drains at `prate`. */
static __always_inline void police_add(struct an_vqueue *q, __u64 prate,
				       const struct an_pkt *p, __u64 now)
{
	__u64 tx, t_empty;

	if (!q)
		return;
	tx = tx_ns(p->bytes, prate);
	t_empty = *(volatile __u64 *)&q->t_empty;
	if (t_empty < now) {
		q->t_empty = now + tx;
		return;
	}
	__sync_fetch_and_add(&q->t_empty, tx);
}

/* Whether the backstop of one egress limit is past its tolerance. */
static __always_inline int police_over(__u32 vq, __u64 rate, __u64 burst, __u64 frame,
				       __u64 gso_max, __u64 now, struct an_vqueue **q)
{
	*q = bpf_map_lookup_elem(&an_vqueue, &vq);
	return police_full(*q, police_tolerance(burst, rate, frame, gso_max), now);
}

/*
 * Whether the host veth drops a packet the pod sent in `class` (internal, internet or a
 * named class, as the pod-side program models it) because it exceeds the pod's egress
 * limits: the total egress limit for every such packet, the internet limit for internet
 * ones (named classes included) and a named class's own limit for its packets. Only
 * admitted packets are added to the models, so a pod above its limits keeps the police
 * rate. The models are the pod's AN_VQ_POLICE entries, one per limit kind.
 */
static __always_inline int policed(__u32 slot, const struct an_pod_meta *meta, __u32 class,
				   const struct an_pkt *p)
{
	const __u64 *r = meta->limits.rate[AN_DIR_EGRESS];
	__u64 frame = frame_of(meta->frame), now, rt = r[AN_KIND_TOTAL], ri = 0, rn = 0;
	struct an_vqueue *qt = NULL, *qi = NULL, *qn = NULL;
	__u32 nk = named_kind(class);

	if (class != AN_CLASS_INTERNAL && !is_internet(class))
		return 0;
	if (is_internet(class))
		ri = r[AN_KIND_INTERNET];
	if (nk) {
		/* Checked apart from the test for 0, on the register the access uses. */
		barrier_var(nk);
		if (nk < AN_NR_KINDS)
			rn = r[nk];
	}
	if (!rt && !ri && !rn)
		return 0;
	now = bpf_ktime_get_ns();
	if (rt && police_over(AN_VQ_POD(slot, AN_VQ_POLICE, AN_KIND_TOTAL), rt,
			      meta->burst[AN_DIR_EGRESS], frame, meta->gso_max, now, &qt))
		return 1;
	if (ri && police_over(AN_VQ_POD(slot, AN_VQ_POLICE, AN_KIND_INTERNET), ri, 0, frame,
			      meta->gso_max, now, &qi))
		return 1;
	if (rn && police_over(AN_VQ_POD(slot, AN_VQ_POLICE, nk), rn, 0, frame, meta->gso_max,
			      now, &qn))
		return 1;
	police_add(qt, police_rate(rt), p, now);
	police_add(qi, police_rate(ri), p, now);
	police_add(qn, police_rate(rn), p, now);
	return 0;
}

#endif /* ALIASNET_LIB_POLICE_H */
