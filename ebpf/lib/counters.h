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
	/* Per-CPU value and softirq context: plain adds are not racy. */
	ctr = &c->dir[dir & 1][class & 3];
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

/* Counts a packet the uplink program put into the node cap class. */
static __always_inline void count_capped(const struct an_pkt *p)
{
	struct an_node_counters *c;
	__u32 zero = 0;

	c = bpf_map_lookup_elem(&an_node_ctrs, &zero);
	if (c) {
		c->capped.packets += p->segs;
		c->capped.bytes += p->bytes;
	}
}

#endif /* ALIASNET_LIB_COUNTERS_H */
