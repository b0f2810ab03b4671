/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map of the datapath, with the layouts of aliasnet_abi.h. Userspace creates and
 * pins them (the loader gives each its pin path), so none carries a pinning attribute.
 */
#ifndef ALIASNET_LIB_MAPS_H
#define ALIASNET_LIB_MAPS_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct an_lpm_key);
	__type(value, struct an_lpm_value);
	__uint(max_entries, AN_LPM_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} an_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_config);
	__uint(max_entries, 1);
} an_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* host veth ifindex */
	__type(value, struct an_pod);
	__uint(max_entries, AN_MAX_PODS);
} an_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* pod IPv4, network byte order */
	__type(value, __u32); /* slot */
	__uint(max_entries, AN_MAX_PODS);
} an_pod_ips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct an_pod_counters);
	__uint(max_entries, AN_MAX_PODS);
} an_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct an_node_counters);
	__uint(max_entries, 1);
} an_node_ctrs SEC(".maps");

/* Written by userspace only; the programs read a pod's rates and frame size from it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_pod_meta);
	__uint(max_entries, AN_MAX_PODS);
} an_pod_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_vqueue);
	__uint(max_entries, AN_VQ_ENTRIES);
} an_vqueue SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_flow);
	__uint(max_entries, AN_FLOW_ENTRIES);
} an_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct an_conn_key);
	__type(value, struct an_conn);
	__uint(max_entries, AN_MAX_CONNS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} an_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct an_lpm6_key);
	__type(value, struct an_lpm_value);
	__uint(max_entries, AN_LPM_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} an_prefixes6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32[4]); /* pod IPv6, network byte order */
	__type(value, __u32); /* slot */
	__uint(max_entries, AN_MAX_PODS);
} an_pod_ips6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct an_ns_key);
	__type(value, struct an_ns_policy);
	__uint(max_entries, AN_MAX_NAMESPACES + 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} an_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_entity);
	__uint(max_entries, AN_MAX_ENTITIES);
} an_entities SEC(".maps");

/* Userspace only: namespace name -> its entity (the programs go by an_pod_meta.entity). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct an_ns_key);
	__type(value, __u32);
	__uint(max_entries, AN_MAX_ENTITIES);
} an_entity_ids SEC(".maps");

/* Userspace only: the named classes' names by index. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_class_name);
	__uint(max_entries, AN_MAX_NAMED);
} an_classes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct an_pod_rt);
	__uint(max_entries, AN_MAX_PODS);
} an_pod_rt SEC(".maps");

/*
 * The attachment-key index (an_pod_keys) is created by userspace and never read here, so
 * no map above names its key. This function, which no program calls and the loader never
 * loads, puts struct an_pod_key in the object's BTF, where the ABI test compares its layout
 * with the Rust mirror like every other struct's.
 */
__attribute__((used)) int an_abi_types(struct an_pod_key *pod_key)
{
	return pod_key != NULL;
}

#endif /* ALIASNET_LIB_MAPS_H */
