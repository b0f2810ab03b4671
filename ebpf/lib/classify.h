/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The traffic class of a packet, by longest-prefix match on its remote address. */
#ifndef ALIASNET_LIB_CLASSIFY_H
#define ALIASNET_LIB_CLASSIFY_H

#include "maps.h"
#include "parse.h"

/*
 * Longest prefix wins; userspace resolves equal prefixes in both lists to blocked. Only
 * the active generation's entries match (see struct an_lpm_key).
 */
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

/* A link-local (fe80::/10), multicast (ff00::/8) or the unspecified IPv6 address. */
static __always_inline int link_scope6(const __u32 *a)
{
	__u32 first = bpf_ntohl(a[0]);

	return (first >> 22) == (0xfe80 >> 6) || (first >> 24) == 0xff ||
	       !(a[0] | a[1] | a[2] | a[3]);
}

/* IPv6 by its own trie (an_prefixes6). */
static __always_inline __u32 classify6(const struct an_config *cfg, const __u32 *remote)
{
	struct an_lpm6_key key = {
		.prefixlen = 32 + 128,
		.gen = cfg ? cfg->active_gen : 0,
	};
	struct an_lpm_value *v;

	key.addr[0] = remote[0];
	key.addr[1] = remote[1];
	key.addr[2] = remote[2];
	key.addr[3] = remote[3];
	v = bpf_map_lookup_elem(&an_prefixes6, &key);
	if (!v)
		return AN_CLASS_INTERNET;
	return v->class == AN_CLASS_BLOCKED ? AN_CLASS_BLOCKED : AN_CLASS_INTERNAL;
}

/*
 * The class of the packet's remote address, `dst` or its source, in its family. An IPv6
 * packet with a link-local, multicast or unspecified address at either end is class
 * "other", as ARP is for IPv4: neighbour discovery, DAD and MLD between the pod and its
 * gateway are neither internal nor internet traffic, and are never blocked or shaped as
 * either.
 */
static __always_inline __u32 classify_pkt(const struct an_config *cfg, const struct an_pkt *p,
					  int dst)
{
	if (p->v6) {
		if (link_scope6(p->saddr6) || link_scope6(p->daddr6))
			return AN_CLASS_OTHER;
		return classify6(cfg, dst ? p->daddr6 : p->saddr6);
	}
	return classify(cfg, dst ? p->daddr : p->saddr);
}

#endif /* ALIASNET_LIB_CLASSIFY_H */
