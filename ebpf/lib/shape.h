/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Forwarded traffic in a shaped class: its leaf, its place in the queue model, its CE mark. */
#ifndef ALIASNET_LIB_SHAPE_H
#define ALIASNET_LIB_SHAPE_H

#include "flow.h"
#include "queue.h"

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

#endif /* ALIASNET_LIB_SHAPE_H */
