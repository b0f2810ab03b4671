/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The traffic class of a packet, by longest-prefix match on its remote address. */
#ifndef ALIASNET_LIB_CLASSIFY_H
#define ALIASNET_LIB_CLASSIFY_H

#include "maps.h"
#include "parse.h"

/*
 * The class an LPM entry names: internal, blocked or a named class; anything else (a miss
 * included) is plain internet.
 */
static __always_inline __u32 class_of(const struct an_lpm_value *v)
{
	if (!v)
		return AN_CLASS_INTERNET;
	if (v->class == AN_CLASS_INTERNAL || v->class == AN_CLASS_BLOCKED ||
	    (v->class >= AN_CLASS_NAMED && v->class < AN_NR_CLASSES))
		return v->class;
	return AN_CLASS_INTERNET;
}

/*
 * Longest prefix wins across internal, blocked and the named classes; userspace resolves a
 * prefix listed more than once (blocked wins). Only the active generation's entries match
 * (see struct an_lpm_key).
 */
static __always_inline __u32 classify(const struct an_config *cfg, __u32 remote)
{
	struct an_lpm_key key = {
		.prefixlen = 64,
		.gen = cfg ? cfg->active_gen : 0,
		.addr = remote,
	};

	return class_of(bpf_map_lookup_elem(&an_prefixes, &key));
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
	key.addr[0] = remote[0];
	key.addr[1] = remote[1];
	key.addr[2] = remote[2];
	key.addr[3] = remote[3];
	return class_of(bpf_map_lookup_elem(&an_prefixes6, &key));
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

/* Internet traffic: plain, or of a named class (a part of the internet). */
static __always_inline int is_internet(__u32 class)
{
	return class == AN_CLASS_INTERNET || (class >= AN_CLASS_NAMED && class < AN_NR_CLASSES);
}

/* The limit kind of a named class, or 0 (AN_KIND_TOTAL: none) for any other class. */
static __always_inline __u32 named_kind(__u32 class)
{
	if (class >= AN_CLASS_NAMED && class < AN_NR_CLASSES)
		return AN_KIND_NAMED + (class - AN_CLASS_NAMED);
	return 0;
}

#endif /* ALIASNET_LIB_CLASSIFY_H */
