/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-pod and node counters, in wire packets and frame bytes. */
#ifndef ALIASNET_LIB_COUNTERS_H
#define ALIASNET_LIB_COUNTERS_H

#include "maps.h"
#include "parse.h"

static __always_inline void count(__u32 slot, __u32 dir, __u32 class, const struct an_pkt *p)
{
	struct an_pod_counters *c;
	struct an_counter *ctr;

	c = bpf_map_lookup_elem(&an_counters, &slot);
	if (!c)
		return;
	/* The bound is checked on the register the access uses (bpf_helpers.h). */
	barrier_var(class);
	if (class >= AN_NR_CLASSES)
		return;
	/* Per-CPU value and softirq context: plain adds are not racy. */
	ctr = &c->dir[dir & 1][class];
	ctr->packets += p->segs;
	ctr->bytes += p->bytes;
}

/* Counts a packet of the pod's that the host veth dropped as not from its own address. */
static __always_inline void count_spoofed(__u32 slot, const struct an_pkt *p)
{
	struct an_pod_counters *c = bpf_map_lookup_elem(&an_counters, &slot);

	if (c) {
		c->spoofed.packets += p->segs;
		c->spoofed.bytes += p->bytes;
	}
}

/* Counts a packet of the pod's that the host veth dropped above its egress limits. */
static __always_inline void count_policed(__u32 slot, const struct an_pkt *p)
{
	struct an_pod_counters *c = bpf_map_lookup_elem(&an_counters, &slot);

	if (c) {
		c->policed.packets += p->segs;
		c->policed.bytes += p->bytes;
	}
}

/* Counts a packet of the pod's that the host veth dropped for reason `why` (AN_DROP_*). */
static __always_inline void count_dropped(__u32 slot, __u32 why, const struct an_pkt *p)
{
	struct an_pod_counters *c = bpf_map_lookup_elem(&an_counters, &slot);

	if (c && why < AN_NR_DROPS) {
		c->dropped[why].packets += p->segs;
		c->dropped[why].bytes += p->bytes;
	}
}

/* Counts a packet an uplink program put into the node's limits of direction `dir`. */
static __always_inline void count_staged(__u32 dir, const struct an_pkt *p)
{
	struct an_node_counters *c;
	__u32 zero = 0;

	c = bpf_map_lookup_elem(&an_node_ctrs, &zero);
	if (c) {
		c->staged[dir & 1].packets += p->segs;
		c->staged[dir & 1].bytes += p->bytes;
	}
}

#endif /* ALIASNET_LIB_COUNTERS_H */
