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

#define AN_ABI_VERSION 8

/*
 * Capacity. AN_MAX_PODS bounds slots on one node (kubelet's max-pods is far lower).
 * AN_MAX_NAMESPACES bounds the policy's per-namespace entries (an_policy), AN_MAX_ENTITIES
 * the aggregates shaped at once: the node (entity 0) and the namespaces with pods here.
 */
#define AN_MAX_PODS 1024
#define AN_MAX_PREFIXES 65536
/* The trie holds two generations during a policy swap (see struct an_lpm_key). */
#define AN_LPM_MAX_ENTRIES 131072
#define AN_MAX_NAMESPACES 4096
#define AN_MAX_ENTITIES 1024
#define AN_NODE_ENTITY 0
/* Named destination classes (shaper.toml [classes.<name>]): parts of the internet. */
#define AN_MAX_NAMED 32

/*
 * Traffic classes, decided per packet on the remote address, as counted: internal,
 * internet that is in no named class, blocked, other, then the named classes.
 */
#define AN_CLASS_INTERNAL 0
#define AN_CLASS_INTERNET 1
#define AN_CLASS_BLOCKED 2
/* Not IP (ARP, malformed IPv4 or IPv6 the stack drops anyway): passed, counted here. */
#define AN_CLASS_OTHER 3
/* Named class k (0 <= k < AN_MAX_NAMED) is AN_CLASS_NAMED + k. */
#define AN_CLASS_NAMED 4
#define AN_NR_CLASSES (AN_CLASS_NAMED + AN_MAX_NAMED)
_Static_assert(AN_NR_CLASSES == 36, "classes");

/*
 * Limit kinds: what a limit covers. Each level (pod, namespace, node) has one rate per
 * direction and kind. A packet of named class k meets the limits of kind NAMED + k, of
 * kind INTERNET (a named class is part of the internet) and, for a pod, of kind TOTAL
 * (everything but blocked traffic: the kubelet's bandwidth limits).
 */
#define AN_KIND_TOTAL 0
#define AN_KIND_INTERNET 1
#define AN_KIND_NAMED 2
#define AN_NR_KINDS (AN_KIND_NAMED + AN_MAX_NAMED)
_Static_assert(AN_NR_KINDS == 34, "kinds");

/* Directions, seen from the pod. */
#define AN_DIR_EGRESS 0  /* pod -> anywhere: host veth ingress, remote = dst */
#define AN_DIR_INGRESS 1 /* anywhere -> pod: host veth egress, remote = src */
#define AN_NR_DIRS 2

/*
 * HTB classes. Every shaped limit is an inner class with two leaves: a "sparse" leaf
 * (HTB prio 0) for packets of flows that have nothing queued and stay within a small
 * per-flow budget (pings, DNS, ACKs, a new connection's first packets), and a "bulk" leaf
 * (prio 1) for the rest; the sparse one is served first, so a bulk flow's queue does not
 * delay other flows, as fq_codel's sparse flows are not. The programs write the leaf's
 * class id to skb->priority, which HTB uses directly when no tc filter is installed; the
 * qdisc's own handle (AN_CLASSID_DIRECT) sends a packet unshaped through HTB's direct queue.
 *
 * Pod devices (the host veth for traffic to the pod, the pod's eth0 for traffic from it):
 * the limit of kind K is class 1:AN_POD_CLASS(K), its sparse and bulk leaves +1 and +2.
 * The limit of a more specific kind hangs under the next less specific one that is set
 * (total > internet > named class), and a packet takes the leaves of the most specific
 * limit it meets.
 */
#define AN_HTB_MAJOR 1
#define AN_CLASSID_DIRECT 0x00010000
#define AN_LEAF_SPARSE 1 /* minor offset of a limit's sparse leaf */
#define AN_LEAF_BULK 2   /* minor offset of a limit's bulk leaf */
#define AN_POD_CLASS(kind)                                                                   \
	((kind) == AN_KIND_TOTAL ? 0x1 :                                                     \
	 (kind) == AN_KIND_INTERNET ? 0x10 : 0x100 + 0x10 * ((kind) - AN_KIND_NAMED))

/*
 * Aggregate devices (one per level and direction: an IFB for the namespaces' limits of
 * each direction, an IFB for the node's download limits, the uplink for its upload
 * limits): every limit of an aggregate (a namespace on this node, or the node) is a
 * "group" of three classes, 1:g (inner), 1:g+1 (its sparse leaf) and 1:g+2 (a bulk leaf
 * shared by pods without one of their own), and every pod that can send into it has its
 * own bulk leaf 1:AN_AGG_LEAF(K, slot) under the group of kind K of its namespace (or of
 * the node), so that HTB shares the group among its pods. Group minors are at least
 * AN_AGG_GROUP_MIN; the node's are fixed (AN_NODE_GROUP), the namespaces' allocated by
 * userspace and recorded in an_entities.
 */
#define AN_AGG_LEAF(kind, slot) (1 + ((kind) - AN_KIND_INTERNET) * AN_MAX_PODS + (slot))
#define AN_AGG_GROUP_MIN 0x8410
#define AN_AGG_GROUP_MAX 0xfff0
#define AN_NODE_GROUP(kind) (AN_AGG_GROUP_MIN + 3 * (kind))
#define AN_GROUP_SPARSE 1
#define AN_GROUP_SHARED 2
_Static_assert(AN_AGG_LEAF(AN_NR_KINDS - 1, AN_MAX_PODS - 1) < AN_AGG_GROUP_MIN,
	       "pod leaves below the groups");

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
 * Traffic to a pod reaches its namespace's aggregate device through a second filter on the
 * host veth's egress (an_ns_gate, with a mirred redirect action): an_host_egress leaves
 * AN_CB_NS_STAGE in skb->cb[0] for the packets that go there, and the pod's leaf on that
 * device in skb->tc_index, which an_ns_classify (a filter of that device's HTB) turns into
 * the class. The packet comes back to the host veth's egress with skb->ingress_ifindex the
 * aggregate device's, where the programs pass it on to the pod's own qdisc unchanged.
 */
#define AN_CB_NS_STAGE 0x616e7332 /* "ans2" */
/*
 * That device's HTB has handle AN_NS_IN_MAJOR: (its classes fff8:<minor>), so that the
 * pod's own leaf, which such a packet carries in skb->priority on to the host veth's HTB
 * (1:), never names one of them; its leaf qdiscs are (minor + 1):, all below it.
 */
#define AN_NS_IN_MAJOR 0xfff8
_Static_assert(AN_AGG_GROUP_MAX + AN_GROUP_SHARED + 1 < AN_NS_IN_MAJOR, "leaf handles");

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
	__u32 class; /* AN_CLASS_INTERNAL, AN_CLASS_BLOCKED or AN_CLASS_NAMED + k; a miss is internet */
	__u32 reserved;
};
_Static_assert(sizeof(struct an_lpm_value) == 8, "an_lpm_value size");

/*
 * an_config[0]. The programs read active_gen, flags (the switches in aliasnet_tuning.h),
 * the uplink's sizes and the aggregate devices; the rest is for userspace.
 */
struct an_config {
	__u32 abi_version;
	__u32 active_gen;
	__u64 policy_epoch;   /* bumped on every applied policy */
	__u64 pods_epoch;     /* bumped on every attach and detach (shaperd reconciles on change) */
	__u32 uplink_ifindex; /* where the node's limits are applied, 0 = none */
	__u32 flags;          /* AN_CFG_* */
	__u32 uplink_frame;   /* the uplink's largest frame, bytes (see AN_MIN_FRAME) */
	__u32 uplink_gso_max; /* the uplink's largest GSO/GRO aggregate, bytes */
	__u32 ns_in_ifindex;  /* namespaces' download limits (IFB), 0 = not in use */
	__u32 ns_out_ifindex; /* namespaces' upload limits (IFB), 0 = not in use */
	__u32 node_in_ifindex; /* the node's download limits (IFB), 0 = not in use */
	__u32 node_out;       /* 1 = the node's upload limits are on the uplink */
	__u64 prefix_hash;    /* the classifier's prefixes, as last applied (userspace only) */
	__u32 conn_share;     /* an_conns entries one pod may hold, 0 = AN_CONN_SHARE_DEFAULT */
	__u32 reserved32;
	__u64 reserved;
};
_Static_assert(sizeof(struct an_config) == 80, "an_config size");

/* an_pods: host veth ifindex -> pod. Written on attach, read per packet. */
struct an_pod {
	__u32 slot;   /* index into an_counters and an_pod_meta */
	__u32 flags;  /* reserved */
	__u32 ipv4;   /* network byte order, 0 = the pod has no IPv4 address */
	__u32 reserved;
	__u32 ipv6[4]; /* network byte order, all zero = the pod has no IPv6 address */
	/*
	 * The pod interface's link-local address (EUI-64 of its MAC), all zero = unknown: the
	 * only link-local source the pod may use (see the link-scoped IPv6 rules in
	 * datapath.bpf.c).
	 */
	__u32 ipv6_ll[4];
};
_Static_assert(sizeof(struct an_pod) == 48, "an_pod size");

/*
 * an_pod_ips: pod IPv4 (network byte order) -> slot, an_pod_ips6: pod IPv6 -> slot, for the
 * uplink programs and the pod-side program's fallback.
 */

struct an_counter {
	__u64 packets; /* wire packets: a GSO skb counts as its segments */
	__u64 bytes;   /* L2 frame bytes without FCS, per segment */
};
_Static_assert(sizeof(struct an_counter) == 16, "an_counter size");

/*
 * an_counters: per-CPU array indexed by slot. class[AN_CLASS_BLOCKED] doubles as the
 * blocked-drop counter: every blocked packet is dropped. Internet traffic of a named class
 * counts in that class only (the pod's internet total is the sum). `spoofed` counts what
 * the pod sent that the host veth dropped because it is not from the pod's own address:
 * IPv4 or IPv6 with another source (IPv6 link-scoped traffic aside, see from_pod()), or a
 * frame still VLAN-tagged after the kernel took off the outer tag (see host_side()). Those
 * are in no class. `policed` counts what the host veth dropped above the pod's egress
 * limits (see lib/police.h); those are also in their class, as blocked packets are.
 * `dropped` counts other drops by reason (AN_DROP_*), in no class. IPv4 and IPv6 count
 * into the same cells.
 */
#define AN_DROP_ND 0      /* link-scoped IPv6 (neighbour discovery, MLD) above its rate */
#define AN_DROP_GATEWAY 1 /* other IPv6 to a link-scoped destination: the node's services */
#define AN_NR_DROPS 4

struct an_pod_counters {
	struct an_counter dir[AN_NR_DIRS][AN_NR_CLASSES];
	struct an_counter spoofed;
	struct an_counter policed;
	struct an_counter dropped[AN_NR_DROPS];
};
_Static_assert(sizeof(struct an_pod_counters) == 1248, "an_pod_counters size");

/* an_node_ctrs[0]: per-CPU, traffic the uplink programs put into the node's limits. */
struct an_node_counters {
	struct an_counter staged[AN_NR_DIRS];
	__u64 reserved[4];
};
_Static_assert(sizeof(struct an_node_counters) == 64, "an_node_counters size");

/*
 * A level's limits: bit/s by direction and kind, 0 = none. In an_pod_meta (the pod's own,
 * effective), an_entities (a namespace's or the node's aggregates) and an_policy.
 */
struct an_rates {
	__u64 rate[AN_NR_DIRS][AN_NR_KINDS];
};
_Static_assert(sizeof(struct an_rates) == 544, "an_rates size");

/*
 * an_pod_meta: array indexed by slot, written by userspace only; the programs read a
 * pod's limits, frame size and namespace from it. The pinned maps are the single record
 * of attached pods, so that a restarted shaperd, the metrics exporter and the CNI plugin
 * all see the same state.
 */
#define AN_META_IN_USE 1
#define AN_META_NS_GATE 2 /* the host veth carries an_ns_gate (userspace only) */

struct an_pod_meta {
	__u32 flags;
	__u32 host_ifindex;
	__u32 ipv4; /* network byte order */
	__u32 pod_ifindex;
	__u32 entity;  /* the pod's namespace in an_entities, 0 = none (no namespace limits) */
	__u32 frame;   /* the pod's largest frame: veth MTU + Ethernet header, bytes */
	__u32 gso_max; /* the pod's largest GSO/GRO aggregate, bytes */
	__u32 reserved0;
	struct an_rates limits;    /* effective: the pod's own and policy's, policy a ceiling */
	__u64 burst[AN_NR_DIRS];   /* bytes, effective, of the total limits */
	__u64 own_total[AN_NR_DIRS];    /* the pod's own total limits (runtimeConfig), 0 = none */
	__u64 own_internet[AN_NR_DIRS]; /* its internet annotations, 0 = none */
	__u64 own_burst[AN_NR_DIRS];    /* bits as the runtime gave them, 0 = unset */
	/*
	 * Bit K: the pod has its own bulk leaf under the group of kind K on the namespace
	 * ([0]) and node ([1]) aggregate devices of each direction (shaperd sets them).
	 */
	__u64 agg_leaves[2][AN_NR_DIRS];
	__u64 attached_unix_ns;
	__u64 netns_dev; /* the pod's netns as opened on attach (st_dev, st_ino) */
	__u64 netns_ino;
	char k8s_namespace[64];
	char k8s_name[256];
	char container_id[128];
	char ifname[16];       /* CNI_IFNAME inside the pod */
	char host_ifname[16];
	char netns[256];       /* CNI_NETNS as given on ADD */
	__u32 ipv6[4];         /* network byte order, all zero = none */
	__u32 ipv6_ll[4];      /* the pod interface's link-local address, all zero = unknown */
};
_Static_assert(sizeof(struct an_pod_meta) == 1464, "an_pod_meta size");

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
 * an_entities: array, the aggregates shaped on this node: entry 0 is the node, the others
 * namespaces with pods here (an_pod_meta.entity), allocated by userspace. `groups` are the
 * HTB group minors of each limited kind on the level's aggregate device of each direction
 * (0 = no group); the programs read the rates and the groups.
 * an_entity_ids: hash, namespace name (an_ns_key) -> entity, userspace only.
 */
#define AN_ENTITY_IN_USE 1

struct an_entity {
	__u32 flags;
	__u32 pods; /* attached pods of the namespace (informational) */
	struct an_rates limits;
	__u16 groups[AN_NR_DIRS][AN_NR_KINDS];
	char name[64];
};
_Static_assert(sizeof(struct an_entity) == 752, "an_entity size");

/*
 * an_vqueue: array, the modelled queue of every shaped limit (see the queue model in
 * aliasnet_tuning.h), with its CE-mark and drop counters and the bitmaps of the flows with
 * a backlog in its bulk leaves (an_flows buckets): those that sent a bulk packet in the
 * current epoch of AN_FLOW_EPOCH_NS, and in the one before.
 * A pod's limits: AN_VQ_POD(slot, d, kind), d = a direction or AN_VQ_POLICE (the host
 * veth's backstop of the egress limits, lib/police.h: only its t_empty is used); an
 * aggregate's: AN_VQ_AGG(entity, dir, kind).
 */
#define AN_VQ_POLICE 2
#define AN_VQ_POD(slot, d, kind) (((slot) * 3 + (d)) * AN_NR_KINDS + (kind))
#define AN_VQ_AGG_BASE (AN_MAX_PODS * 3 * AN_NR_KINDS)
#define AN_VQ_AGG(entity, dir, kind)                                                         \
	(AN_VQ_AGG_BASE + ((entity) * AN_NR_DIRS + (dir)) * AN_NR_KINDS + (kind))
#define AN_VQ_ENTRIES (AN_VQ_AGG_BASE + AN_MAX_ENTITIES * AN_NR_DIRS * AN_NR_KINDS)
_Static_assert(AN_VQ_AGG_BASE == 104448 && AN_VQ_ENTRIES == 174080, "an_vqueue index");

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
 * an_flows: array of flow tables, one per pod and direction (AN_FLOWS_POD) and per
 * aggregate and direction (AN_FLOWS_AGG), each of AN_FLOW_BUCKETS buckets of flow state
 * indexed by a hash of the 5-tuple (addresses and protocol only for fragments). Buckets are
 * shared by colliding flows, as in fq_codel; a bucket is one bit of the an_vqueue bitmaps.
 * How a packet picks its limit's sparse or bulk leaf is in aliasnet_tuning.h.
 */
#define AN_FLOW_BUCKETS 64
#define AN_FLOWS_POD(slot, dir) ((slot) * AN_NR_DIRS + (dir))
#define AN_FLOWS_AGG(entity, dir) (AN_MAX_PODS * AN_NR_DIRS + (entity) * AN_NR_DIRS + (dir))
#define AN_FLOW_TABLES (AN_MAX_PODS * AN_NR_DIRS + AN_MAX_ENTITIES * AN_NR_DIRS)
#define AN_FLOW_ENTRIES (AN_FLOW_TABLES * AN_FLOW_BUCKETS)
_Static_assert(AN_FLOW_TABLES == 4096 && AN_FLOW_ENTRIES == 262144, "an_flows index");
_Static_assert(AN_FLOW_BUCKETS <= 64, "a bucket is a bit of an_vqueue.flows_cur");

struct an_flow {
	__u64 t_bulk;   /* modelled departure of the flow's last packet sent to a bulk leaf */
	__u64 t_sparse; /* the flow's sparse budget: a virtual clock at rate / AN_FLOW_RATE_DIV */
};
_Static_assert(sizeof(struct an_flow) == 16, "an_flow size");

/*
 * an_conns: hash (allocated as used), TCP connections of pods whose windows are clamped (see
 * the window clamp in aliasnet_tuning.h), learnt from their handshakes on the host veth: the
 * window scales both sides agreed and the handshake's round trip.
 *
 * Each pod holds at most its share of the table (an_config.conn_share, which shaperd sets to
 * the table's size over the number of pods, at least AN_CONN_SHARE_MIN pods): a pod at its
 * share learns no new connection (counted as refused), so no pod can take another's entries.
 * An entry goes on a reset, AN_CONN_CLOSED_TTL_S after both sides' FIN, or when the sweep
 * (an_conns_sweep, run by shaperd) finds it idle past its state's TTL or its pod gone. A
 * connection whose entry is gone is learnt again from its next packet with its pod's usual
 * window scale and round trip (an_pod_rt): the pod's clamp holds again.
 */
#define AN_MAX_CONNS 262144
#define AN_CONN_SHARE_MIN 64
#define AN_CONN_SHARE_DEFAULT (AN_MAX_CONNS / AN_CONN_SHARE_MIN)
#define AN_CONN_SYN_SENT 1    /* the pod sent a SYN; its window scale holds if the SYN-ACK agrees */
#define AN_CONN_SYNACK_SENT 2 /* the pod answered a SYN; RTT from its SYN-ACK to the next ACK */
#define AN_CONN_ESTABLISHED 3
#define AN_CONN_SYN_RCVD 4    /* the remote sent a SYN (its window scale is kept for the pod's SYN-ACK) */
/* an_conn.flags */
#define AN_CONN_F_FIN_POD 1    /* the pod sent a FIN */
#define AN_CONN_F_FIN_REMOTE 2 /* the remote sent a FIN */
#define AN_CONN_F_RELEARNT 4   /* learnt again mid-connection: the remote's scale is unknown */
/* Idle times after which the sweep removes an entry, in units of 2^30 ns (about 1.07 s). */
#define AN_CONN_HANDSHAKE_TTL_S 10 /* a handshake that did not complete */
#define AN_CONN_CLOSED_TTL_S 4     /* both sides sent a FIN */
#define AN_CONN_IDLE_TTL_S 120     /* an established connection without packets */
#define AN_CONN_TIME_SHIFT 30

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
	__u8 flags;         /* AN_CONN_F_* */
	__u32 slot;         /* the pod whose share holds the entry */
	__u32 gen;          /* that pod's attachment (an_pod_meta.attached_unix_ns, low bits) */
	__u32 t_last;       /* bpf_ktime_get_ns() >> AN_CONN_TIME_SHIFT of its last packet */
	__u32 reserved;
};
_Static_assert(sizeof(struct an_conn) == 32, "an_conn size");

/*
 * an_pod_rt: array, slot -> what the programs keep of a pod between packets besides its
 * counters. Written by the programs (atomically where CPUs share a field); userspace zeroes
 * a slot's entry when it attaches a pod there.
 */
struct an_pod_rt {
	__u64 nd_tat;          /* the link-scoped IPv6 budget's theoretical arrival time, ns */
	__s64 conns;           /* an_conns entries this attachment holds */
	__u64 conns_refused;   /* connections not learnt: the pod's share was full */
	__u64 conns_relearnt;  /* connections learnt again from a packet after their entry went */
	__u32 tcp_rtt_ns;      /* the pod's last handshake's round trip */
	__u8 tcp_wscale;       /* the window scale of the pod's last SYN or SYN-ACK */
	__u8 tcp_known;        /* 1 once a handshake set the two above */
	__u16 reserved;
	__u64 reserved2;
};
_Static_assert(sizeof(struct an_pod_rt) == 48, "an_pod_rt size");

/*
 * Link-scoped IPv6 from a pod (neighbour discovery, MLD, ICMPv6 errors to the gateway or to
 * link-scope multicast): at most AN_ND_PPS packets a second after a burst of AN_ND_BURST.
 */
#define AN_ND_PPS 20
#define AN_ND_BURST 40

/*
 * an_policy: hash, namespace name (NUL padded; "" for every namespace without an entry of
 * its own) -> the policy's pod-level and namespace-level limits for it, overrides merged;
 * read by userspace only (the CNI plugin on ADD, shaperd), written by shaperd.
 */
struct an_ns_key {
	char name[64];
};
_Static_assert(sizeof(struct an_ns_key) == 64, "an_ns_key size");

struct an_ns_policy {
	struct an_rates pod;
	struct an_rates ns;
};
_Static_assert(sizeof(struct an_ns_policy) == 1088, "an_ns_policy size");

/*
 * an_classes: array, the names of the named classes by index (userspace only), so that
 * tools and the metrics exporter label counters without the policy file. Indices stay with
 * a name across policy reloads, so a class's counters continue.
 */
struct an_class_name {
	char name[64];
};
_Static_assert(sizeof(struct an_class_name) == 64, "an_class_name size");

#endif /* ALIASNET_ABI_H */
