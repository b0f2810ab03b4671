/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The traffic class of a packet, by longest-prefix match on its remote address. */
#ifndef ALIASNET_LIB_CLASSIFY_H
#define ALIASNET_LIB_CLASSIFY_H

#include "maps.h"

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

#endif /* ALIASNET_LIB_CLASSIFY_H */
