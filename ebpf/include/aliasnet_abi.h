/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * aliasnet kernel <-> userspace ABI: the layout of every pinned map (type, key, value,
 * capacity) and the values stored in them, shared by the tc programs (the .bpf.c files in ebpf/) and
 * their Rust mirrors (ebpf/src/abi.rs).
 *
 * Rules: fixed-width types only, explicit padding, every struct size asserted here and in
 * abi.rs with the same number; a test compares every field offset in the object's BTF
 * with the Rust side, and every map definition with abi.rs's map table.
 *
 * AN_ABI_VERSION covers everything in this file: the structs, the map definitions built
 * from them (including the attachment-key index userspace pins next to the programs'
 * maps), the values stored in them (classes, flags, connection states, the an_vqueue and
 * an_flows indexing), the HTB class ids the programs write, which name classes that
 * outlive a program upgrade on the pods' devices, and the classid of the pod-side filter
 * (AN_POD_FILTER_CLASSID_BASE + slot), which the program reads. Changing any of it means
 * bumping the version: the loader refuses to reuse pinned maps of another version.
 * Tuning constants and benchmark switches (aliasnet_tuning.h) change behaviour, not
 * layout, and are not covered.
 */
#ifndef ALIASNET_ABI_H
#define ALIASNET_ABI_H

#include <linux/types.h>

#define AN_ABI_VERSION 6

/* Capacity. AN_MAX_PODS bounds slots on one node (kubelet's max-pods is far lower). */
#define AN_MAX_PODS 1024
#define AN_MAX_PREFIXES 65536
/* The trie holds two generations during a policy swap (see struct an_lpm_key). */
#define AN_LPM_MAX_ENTRIES 131072
#define AN_MAX_NAMESPACES 4096

/* Traffic classes, decided per packet on the remote address. */
#define AN_CLASS_INTERNAL 0
#define AN_CLASS_INTERNET 1
#define AN_CLASS_BLOCKED 2
/* Not IP (ARP, malformed IPv4 or IPv6 the stack drops anyway): passed, counted here. */
#define AN_CLASS_OTHER 3
#define AN_NR_CLASSES 4

/* Directions, seen from the pod. */
#define AN_DIR_EGRESS 0  /* pod -> anywhere: host veth ingress, remote = dst */
#define AN_DIR_INGRESS 1 /* anywhere -> pod: host veth egress, remote = src */
#define AN_NR_DIRS 2

/*
 * HTB classes. Every shaped class is an inner class with two leaves (see an_flows): a
 * "sparse" leaf (classid + 1, HTB prio 0) for packets of flows that have nothing queued
 * and stay within a small per-flow budget (pings, DNS, ACKs, a new connection's first
 * packets), and a "bulk" leaf (classid + 2, prio 1) for the rest. Both leaves share the
 * class's rate; the sparse one is served first, so a bulk flow's queue does not delay
 * other flows of the pod, as fq_codel's sparse flows are not (on kernels without sch_fq,
 * fq_codel or sfq, this is the flow isolation there is). The programs write the leaf's
 * class id to skb->priority, which HTB uses directly when no tc filter is installed; a
 * value naming no class falls through to HTB's default class.
 */
#define AN_HTB_MAJOR 1
#define AN_CLASSID_POD_INGRESS 0x00010001  /* host veth: 1:1 the pod's ingress limit */
#define AN_CLASSID_POD_INTERNET 0x00010010 /* pod eth0: 1:10 internet-egress limit */
#define AN_CLASSID_POD_OTHER 0x00010020    /* pod eth0: 1:20 rest (only with a total egress limit) */
#define AN_CLASSID_NODE_CAP 0x00010010     /* uplink: 1:10 node-wide internet-egress cap */
#define AN_LEAF_SPARSE 1                   /* minor offset of a class's sparse leaf */
#define AN_LEAF_BULK 2                     /* minor offset of a class's bulk leaf */

/*
 * The pod-side filter (an_pod_egress, in the pod's netns, where no ifindex names a pod) is
 * attached with classid (TCA_BPF_CLASSID) AN_POD_FILTER_CLASSID_BASE + slot. In
 * direct-action mode cls_bpf stores a filter's classid in the skb (qdisc_skb_cb, 16 bits)
 * before running its program, which reads it as skb->tc_classid: the pod is the device the
 * filter is on, not the source address it wrote. 0 is "no classid" (a filter attached
 * without one, or BPF_PROG_TEST_RUN, which cannot set it): the program then falls back to
 * the source address (see an_pod_egress).
 */
#define AN_POD_FILTER_CLASSID_BASE 1
_Static_assert(AN_POD_FILTER_CLASSID_BASE + AN_MAX_PODS - 1 <= 0xffff,
	       "a slot's filter classid fits qdisc_skb_cb's 16-bit tc_classid");

/*
 * an_prefixes (IPv4) and an_prefixes6 (IPv6): LPM tries, one per family, so an IPv4 lookup
 * costs what it did before IPv6. The key's data part is {gen, addr}: every entry has
 * prefixlen >= 32, so a lookup only matches entries of the generation it asks for.
 * Userspace writes the new policy of both families under the inactive generation, flips
 * an_config.active_gen (one aligned 32-bit store), then deletes the old generation: each
 * packet sees either the whole old or the whole new policy.
 */
struct an_lpm_key {
	__u32 prefixlen; /* 32 + IPv4 prefix length */
	__u32 gen;       /* 0 or 1 */
	__u32 addr;      /* IPv4, network byte order */
};
_Static_assert(sizeof(struct an_lpm_key) == 12, "an_lpm_key size");

struct an_lpm6_key {
	__u32 prefixlen; /* 32 + IPv6 prefix length */
	__u32 gen;       /* 0 or 1 */
	__u32 addr[4];   /* IPv6, network byte order */
};
_Static_assert(sizeof(struct an_lpm6_key) == 24, "an_lpm6_key size");

struct an_lpm_value {
	__u32 class; /* AN_CLASS_INTERNAL or AN_CLASS_BLOCKED; a miss means internet */
	__u32 reserved;
};
_Static_assert(sizeof(struct an_lpm_value) == 8, "an_lpm_value size");

/*
 * an_config[0]. The programs read active_gen, flags (the switches in aliasnet_tuning.h)
 * and node_internet_cap; the rest is the applied policy for userspace.
 */
struct an_config {
	__u32 abi_version;
	__u32 active_gen;
	__u64 policy_epoch;             /* bumped on every applied policy */
	__u64 default_internet_rate;    /* bit/s per pod, 0 = unlimited */
	__u64 node_internet_cap;        /* bit/s for all pods together, 0 = none */
	__u32 uplink_ifindex;           /* where the node cap is applied, 0 = none */
	__u32 flags;                    /* AN_CFG_* */
	__u32 uplink_frame;             /* the uplink's largest frame, bytes (see AN_MIN_FRAME) */
	__u32 uplink_gso_max;           /* the uplink's largest GSO/GRO aggregate, bytes */
	__u64 reserved[2];
};
_Static_assert(sizeof(struct an_config) == 64, "an_config size");

/* an_pods: host veth ifindex -> pod. Written on attach, read per packet. */
/* an_pod.flags: the pod has an ingress limit, so its TCP windows are clamped (an_conns). */
#define AN_POD_INGRESS_LIMIT 1

struct an_pod {
	__u32 slot;   /* index into an_counters and an_pod_meta */
	__u32 flags;  /* AN_POD_* */
	__u32 ipv4;   /* network byte order, 0 = the pod has no IPv4 address */
	__u32 reserved;
	__u32 ipv6[4]; /* network byte order, all zero = the pod has no IPv6 address */
};
_Static_assert(sizeof(struct an_pod) == 32, "an_pod size");

/*
 * an_pod_ips: pod IPv4 (network byte order) -> slot, an_pod_ips6: pod IPv6 -> slot, for the
 * uplink program and the pod-side program's fallback.
 */

struct an_counter {
	__u64 packets; /* wire packets: a GSO skb counts as its segments */
	__u64 bytes;   /* L2 frame bytes without FCS, per segment */
};
_Static_assert(sizeof(struct an_counter) == 16, "an_counter size");

/*
 * an_counters: per-CPU array indexed by slot. class[AN_CLASS_BLOCKED] doubles
 * as the blocked-drop counter: every blocked packet is dropped. `spoofed` counts what the
 * pod sent that the host veth dropped because it is not from the pod's own address: IPv4
 * or IPv6 with another source (IPv6 link-scoped traffic aside, see from_pod()), or a frame
 * still VLAN-tagged after the kernel took off the outer tag (see host_side()). Those are in
 * no class. `policed` counts what the host veth dropped above the pod's egress limits (see
 * lib/police.h); those are also in their class, as blocked packets are. IPv4 and IPv6 count
 * into the same cells.
 */
struct an_pod_counters {
	struct an_counter dir[AN_NR_DIRS][AN_NR_CLASSES];
	struct an_counter spoofed;
	struct an_counter policed;
};
_Static_assert(sizeof(struct an_pod_counters) == 160, "an_pod_counters size");

/* an_node_ctrs[0]: per-CPU, traffic the uplink program put into the node cap class. */
struct an_node_counters {
	struct an_counter capped;
	__u64 reserved[2];
};
_Static_assert(sizeof(struct an_node_counters) == 32, "an_node_counters size");

/*
 * an_pod_meta: array indexed by slot, written by userspace only; the programs read a
 * pod's rates and frame size from it. The pinned maps are the single record of attached
 * pods, so that a restarted shaperd, the metrics exporter and the CNI plugin all see the
 * same state.
 */
#define AN_META_IN_USE 1
#define AN_META_INTERNET_FROM_POLICY 2 /* internet rate came from node policy, follows reloads */

struct an_pod_meta {
	__u32 flags;
	__u32 host_ifindex;
	__u32 ipv4; /* network byte order */
	__u32 pod_ifindex;
	__u64 ingress_rate;          /* bit/s, 0 = unlimited */
	__u64 ingress_burst;         /* bytes, effective */
	__u64 egress_rate;
	__u64 egress_burst;
	__u64 internet_egress_rate;  /* effective: min(annotation or policy, egress_rate) */
	__u64 attached_unix_ns;
	char k8s_namespace[64];
	char k8s_name[256];
	char container_id[128];
	char ifname[16];       /* CNI_IFNAME inside the pod */
	char host_ifname[16];
	char netns[256];       /* CNI_NETNS as given on ADD */
	__u32 frame;           /* the pod's largest frame: veth MTU + Ethernet header, bytes */
	__u32 gso_max;         /* the pod's largest GSO/GRO aggregate, bytes */
	__u32 ipv6[4];         /* network byte order, all zero = none */
};
_Static_assert(sizeof(struct an_pod_meta) == 824, "an_pod_meta size");

/*
 * an_pod_keys: hash, the attachment-key index, userspace only: (container ID, ifname),
 * NUL padded as in an_pod_meta -> slot, AN_MAX_PODS entries, so that ADD, DEL and CHECK
 * find a pod with one lookup. Userspace creates and pins it next to the programs' maps;
 * an_pod_meta stays the truth.
 */
struct an_pod_key {
	char container_id[128]; /* as an_pod_meta.container_id */
	char ifname[16];        /* as an_pod_meta.ifname */
};
_Static_assert(sizeof(struct an_pod_key) == 144, "an_pod_key size");

/*
 * an_vqueue: array, the modelled queue of every shaped class (see the queue model in
 * aliasnet_tuning.h), with its CE-mark and drop counters and the bitmaps of the flows with
 * a backlog in its bulk leaf (an_flows buckets): those that sent a bulk packet in the
 * current epoch of AN_FLOW_EPOCH_NS, and in the one before.
 * Index: slot * AN_VQ_PER_POD + AN_VQ_{INGRESS,EGRESS,INTERNET,POLICE_*}, or AN_VQ_NODE_CAP.
 * The two police entries are the host veth's backstop of the egress limits (lib/police.h):
 * only their t_empty is used.
 */
#define AN_VQ_PER_POD 5
#define AN_VQ_INGRESS 0  /* host veth egress: the pod's ingress limit (HTB 1:1) */
#define AN_VQ_EGRESS 1   /* pod eth0: the pod's total egress limit (HTB 1:1) */
#define AN_VQ_INTERNET 2 /* pod eth0: the pod's internet-egress limit (HTB 1:10) */
#define AN_VQ_POLICE_EGRESS 3   /* host veth ingress: backstop of the total egress limit */
#define AN_VQ_POLICE_INTERNET 4 /* host veth ingress: backstop of the internet-egress limit */
#define AN_VQ_NODE_CAP 5120
#define AN_VQ_ENTRIES 5121
_Static_assert(AN_VQ_NODE_CAP == AN_MAX_PODS * AN_VQ_PER_POD && AN_VQ_ENTRIES == AN_VQ_NODE_CAP + 1,
	       "an_vqueue index");

struct an_vqueue {
	__u64 t_empty;    /* bpf_ktime_get_ns() at which the modelled backlog drains */
	__u64 ce_marked;  /* wire packets CE-marked */
	__u64 dropped;    /* wire packets of local TCP dropped as a congestion signal (pod side) */
	__u64 flows_cur;  /* bulk flows' buckets in the current epoch */
	__u64 flows_prev; /* ... and in the previous one */
	__u64 t_epoch;    /* start of the current epoch */
};
_Static_assert(sizeof(struct an_vqueue) == 48, "an_vqueue size");

/*
 * an_flows: array, per shaped class (an_vqueue index) AN_FLOW_BUCKETS buckets of flow
 * state, indexed by a hash of the 5-tuple (addresses and protocol only for fragments).
 * Buckets are shared by colliding flows, as in fq_codel; a bucket is one bit of the
 * an_vqueue bitmaps. How a packet picks its class's sparse or bulk leaf is in
 * aliasnet_tuning.h.
 */
#define AN_FLOW_BUCKETS 64
#define AN_FLOW_ENTRIES (AN_VQ_ENTRIES * AN_FLOW_BUCKETS)
_Static_assert(AN_FLOW_BUCKETS <= 64, "a bucket is a bit of an_vqueue.flows_cur");

struct an_flow {
	__u64 t_bulk;   /* modelled departure of the flow's last packet sent to the bulk leaf */
	__u64 t_sparse; /* the flow's sparse budget: a virtual clock at rate / AN_FLOW_RATE_DIV */
};
_Static_assert(sizeof(struct an_flow) == 16, "an_flow size");

/*
 * an_conns: LRU hash, TCP connections of pods whose windows are clamped (see the window
 * clamp in aliasnet_tuning.h), learnt from their handshakes on the host veth: the window
 * scales both sides agreed and the handshake's round trip.
 */
#define AN_MAX_CONNS 65536
#define AN_CONN_SYN_SENT 1    /* the pod sent a SYN; its window scale holds if the SYN-ACK agrees */
#define AN_CONN_SYNACK_SENT 2 /* the pod answered a SYN; RTT from its SYN-ACK to the next ACK */
#define AN_CONN_ESTABLISHED 3
#define AN_CONN_SYN_RCVD 4    /* the remote sent a SYN (its window scale is kept for the pod's SYN-ACK) */

/* Addresses are IPv6, or IPv4-mapped IPv6 (::ffff:a.b.c.d) for IPv4 connections. */
struct an_conn_key {
	__u32 pod_addr[4];    /* network byte order */
	__u32 remote_addr[4];
	__u16 pod_port;       /* network byte order */
	__u16 remote_port;
};
_Static_assert(sizeof(struct an_conn_key) == 36, "an_conn_key size");

struct an_conn {
	__u64 t_handshake; /* bpf_ktime_get_ns() of the pod's SYN or SYN-ACK */
	__u32 rtt_ns;      /* the handshake's round trip beyond the host veth */
	__u8 wscale;        /* shift of the pod's advertised windows */
	__u8 state;         /* AN_CONN_* */
	__u8 remote_wscale; /* shift of the remote's advertised windows */
	__u8 reserved;
};
_Static_assert(sizeof(struct an_conn) == 16, "an_conn size");

/* an_ns_rates: namespace name (NUL padded) -> internet-egress rate override. */
struct an_ns_key {
	char name[64];
};
_Static_assert(sizeof(struct an_ns_key) == 64, "an_ns_key size");

struct an_ns_rate {
	__u64 internet_rate; /* bit/s, 0 = unlimited */
};
_Static_assert(sizeof(struct an_ns_rate) == 8, "an_ns_rate size");

#endif /* ALIASNET_ABI_H */
