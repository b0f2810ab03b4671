/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * aliasnet kernel <-> userspace ABI: map keys, values and constants shared by
 * the tc programs in ebpf/ (the .bpf.c files) and their Rust mirrors (ebpf/src/abi.rs).
 *
 * Rules: fixed-width types only, explicit padding, every struct size asserted
 * here and in abi.rs with the same number. Changing a layout means bumping
 * AN_ABI_VERSION: the shaper refuses to reuse pinned maps of another version.
 */
#ifndef ALIASNET_ABI_H
#define ALIASNET_ABI_H

#include <linux/types.h>

#define AN_ABI_VERSION 3

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
/* Not IPv4 (ARP, IPv6, malformed IPv4 the stack drops anyway): passed, counted here. */
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
 * fq_codel or sfq, this is the flow isolation there is). The programs write the leaf's class id to skb->priority, which HTB
 * uses directly when no tc filter is installed; a value naming no class falls through to
 * HTB's default class.
 */
#define AN_HTB_MAJOR 1
#define AN_CLASSID_POD_INGRESS 0x00010001  /* host veth: 1:1 the pod's ingress limit */
#define AN_CLASSID_POD_INTERNET 0x00010010 /* pod eth0: 1:10 internet-egress limit */
#define AN_CLASSID_POD_OTHER 0x00010020    /* pod eth0: 1:20 rest (only with a total egress limit) */
#define AN_CLASSID_NODE_CAP 0x00010010     /* uplink: 1:10 node-wide internet-egress cap */
#define AN_LEAF_SPARSE 1                   /* minor offset of a class's sparse leaf */
#define AN_LEAF_BULK 2                     /* minor offset of a class's bulk leaf */

/*
 * LPM trie key. The data part is {gen, addr}: every entry has prefixlen >= 32,
 * so a lookup only matches entries of the generation it asks for. Userspace
 * writes the new policy under the inactive generation, flips an_config.active_gen
 * (one aligned 32-bit store), then deletes the old generation: each packet sees
 * either the whole old or the whole new policy.
 */
struct an_lpm_key {
	__u32 prefixlen; /* 32 + IPv4 prefix length */
	__u32 gen;       /* 0 or 1 */
	__u32 addr;      /* IPv4, network byte order */
};
_Static_assert(sizeof(struct an_lpm_key) == 12, "an_lpm_key size");

struct an_lpm_value {
	__u32 class; /* AN_CLASS_INTERNAL or AN_CLASS_BLOCKED; a miss means internet */
	__u32 reserved;
};
_Static_assert(sizeof(struct an_lpm_value) == 8, "an_lpm_value size");

/* an_config.flags */
/* Switch the queue model off: no CE marks, no pod-side drops (see an_vqueue). Not set by
 * policy; benchmarks use it to compare with and without in one run. */
#define AN_CFG_AQM_OFF 1
/* Switch flow isolation off: every packet of a shaped class goes to its bulk leaf. Not set
 * by policy; benchmarks use it to compare with and without in one run. */
#define AN_CFG_FLOWS_OFF 2
/* Switch receive-window clamping off (see an_conns). Benchmarks only, like the two above. */
#define AN_CFG_CLAMP_OFF 4

/*
 * an_config[0]. The programs read active_gen, flags and node_internet_cap; the rest is the
 * applied policy for userspace.
 */
struct an_config {
	__u32 abi_version;
	__u32 active_gen;
	__u64 policy_epoch;             /* bumped on every applied policy */
	__u64 default_internet_rate;    /* bit/s per pod, 0 = unlimited */
	__u64 node_internet_cap;        /* bit/s for all pods together, 0 = none */
	__u32 uplink_ifindex;           /* where the node cap is applied, 0 = none */
	__u32 flags;
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
	__u32 ipv4;   /* network byte order */
	__u32 reserved;
};
_Static_assert(sizeof(struct an_pod) == 16, "an_pod size");

/* an_pod_ips: pod IPv4 (network byte order) -> slot, for the uplink program. */

struct an_counter {
	__u64 packets; /* wire packets: a GSO skb counts as its segments */
	__u64 bytes;   /* L2 frame bytes without FCS, per segment */
};
_Static_assert(sizeof(struct an_counter) == 16, "an_counter size");

/*
 * an_counters: per-CPU array indexed by slot. class[AN_CLASS_BLOCKED] doubles
 * as the blocked-drop counter: every blocked packet is dropped.
 */
struct an_pod_counters {
	struct an_counter dir[AN_NR_DIRS][AN_NR_CLASSES];
};
_Static_assert(sizeof(struct an_pod_counters) == 128, "an_pod_counters size");

/* an_node_ctrs[0]: per-CPU, traffic the uplink program put into the node cap class. */
struct an_node_counters {
	struct an_counter capped;
	__u64 reserved[2];
};
_Static_assert(sizeof(struct an_node_counters) == 32, "an_node_counters size");

/*
 * an_pod_meta: array indexed by slot, userspace only. The pinned maps are the
 * single record of attached pods, so that a restarted shaperd, the metrics
 * exporter and the CNI plugin all see the same state.
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
};
_Static_assert(sizeof(struct an_pod_meta) == 808, "an_pod_meta size");

/*
 * an_vqueue: array, the modelled queue of every shaped class. The programs see each
 * packet before the class's qdisc does, so they model its backlog at the class rate (as
 * Cilium's EDT does, with the class's HTB burst as credit and the leaf's drop-tail
 * limit) and CE-mark an ECN-capable packet that would wait longer than the marking
 * threshold: ECN TCP then backs off before the drop-tail queue overflows, also on
 * kernels without an AQM qdisc. On the pod side, where senders are local, a TCP data segment that cannot
 * be marked is dropped instead (a congestion signal, not a loss, for a local sender).
 * Index: slot * AN_VQ_PER_POD + AN_VQ_{INGRESS,EGRESS,INTERNET}, or AN_VQ_NODE_CAP.
 */
#define AN_VQ_PER_POD 3
#define AN_VQ_INGRESS 0  /* host veth egress: the pod's ingress limit (HTB 1:1) */
#define AN_VQ_EGRESS 1   /* pod eth0: the pod's total egress limit (HTB 1:1) */
#define AN_VQ_INTERNET 2 /* pod eth0: the pod's internet-egress limit (HTB 1:10) */
#define AN_VQ_NODE_CAP 3072
#define AN_VQ_ENTRIES 3073
_Static_assert(AN_VQ_NODE_CAP == AN_MAX_PODS * AN_VQ_PER_POD && AN_VQ_ENTRIES == AN_VQ_NODE_CAP + 1,
	       "an_vqueue index");

/*
 * Sizes in "frames" are in units of the device's largest frame (MTU + Ethernet header,
 * an_pod_meta.frame and an_config.uplink_frame), never of a fixed 1500-byte MTU: no bucket,
 * queue, threshold or window may be smaller than a packet the device can hand the qdisc
 * without segmenting it. At a rate where one frame takes longer than a time target (9014
 * bytes at 1 Mbit/s: 72 ms) the frame floor wins and the delay grows with the frame.
 * AN_MIN_FRAME is used only for a record that carries no frame size.
 */
#define AN_MIN_FRAME 1514

/*
 * Marking threshold (modelled queueing delay): 2 ms up to 10 Mbit/s, growing in proportion
 * to the rate up to 10 ms from 50 Mbit/s, and at least 2 frames. Measured on veth
 * with one cubic + ECN flow: at 10 Mbit/s 2 ms kept the rate at 95 % of the configured
 * (goodput) with ~2 ms of queue, 5-10 ms lost 1-5 %; at 100 Mbit/s and 1 Gbit/s 2 ms
 * lost 3-6 % (the window cut empties a queue that holds only a few of the sender's GSO
 * aggregates) and 10 ms did not. See notes/shaping-bench.md.
 */
#define AN_ECN_MARK_MIN_NS 2000000
#define AN_ECN_MARK_MAX_NS 10000000
#define AN_ECN_MARK_REF_RATE 10000000
#define AN_ECN_MARK_FRAMES 2
/*
 * Shaper sizes, shared with the shaper's Shape so that the model matches the qdiscs.
 * HTB class burst when the pod sets none: 10 ms at the rate, at least 4 of the class's
 * segments (see AN_SEG_NS) and at least one frame; a burst the pod sets has the same floor.
 * (A larger floor lets a slow class send for hundreds of ms at line rate after idle: 4
 * jumbo frames are 288 ms at 1 Mbit/s, which misleads TCP's RTT estimate.)
 * Forwarded traffic (tbf bulk leaf): bucket of 1 ms, at least 2 frames (a GSO aggregate
 * larger than the bucket is segmented, a frame always fits), refilled a little faster than
 * the class (HTB shapes, see the shaper's Shape), and a drop-tail queue of 25 ms at the
 * rate, at least AN_LEAF_QUEUE_FRAMES frames: room for the window clamp's floor
 * (AN_WND_MIN_FRAMES) plus the bucket, so a clamped sender never overflows it. The class's
 * HTB burst is the model's burst credit on both sides.
 */
#define AN_DEFAULT_BURST_NS 10000000
#define AN_DEFAULT_BURST_FRAMES 4
#define AN_LEAF_BURST_NS 1000000
#define AN_LEAF_BURST_FRAMES 2
#define AN_LEAF_QUEUE_NS 25000000
#define AN_LEAF_QUEUE_FRAMES 6

/*
 * Flows with a backlog in a class's bulk leaf, as bitmaps of their an_flows buckets: those
 * that sent a bulk packet in the current epoch of AN_FLOW_EPOCH_NS, and in the one before.
 * The window clamp shares its allowance among them (see an_conns).
 */
#define AN_FLOW_EPOCH_NS 100000000

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
 * an_flows: array, per shaped class (an_vqueue index) AN_FLOW_BUCKETS buckets of flow state,
 * indexed by a hash of the 5-tuple (addresses and protocol only for fragments). A packet goes
 * to its class's sparse leaf when (1) none of its flow's packets is left in the bulk leaf
 * (by the class's modelled queue, plus AN_FLOW_GUARD_FRAMES, so a flow is never reordered)
 * and (2) the flow is within its sparse budget: a token bucket of AN_FLOW_BURST_FRAMES of
 * the class's segments (see AN_SEG_NS) refilled at rate / AN_FLOW_RATE_DIV. A GSO skb of more than the budget, or a flow
 * faster than the refill, goes to the bulk leaf and stays there while it has a backlog.
 * The sparse leaf is guaranteed rate / AN_SPARSE_RATE_DIV of the class (and may borrow up
 * to all of it); the bulk leaf the rest. Buckets are shared by colliding flows, as in fq_codel.
 */
#define AN_FLOW_BUCKETS 64
#define AN_FLOW_ENTRIES (AN_VQ_ENTRIES * AN_FLOW_BUCKETS)
#define AN_FLOW_BURST_FRAMES 2
#define AN_FLOW_RATE_DIV 16
#define AN_FLOW_GUARD_FRAMES 1
#define AN_SPARSE_RATE_DIV 4

struct an_flow {
	__u64 t_bulk;   /* modelled departure of the flow's last packet sent to the bulk leaf */
	__u64 t_sparse; /* the flow's sparse budget: a virtual clock at rate / AN_FLOW_RATE_DIV */
};
_Static_assert(sizeof(struct an_flow) == 16, "an_flow size");

/*
 * an_conns: LRU hash, TCP connections of pods with an ingress limit, learnt from their
 * handshakes on the host veth. Traffic to such a pod comes from remote senders whose
 * congestion control the shaper cannot signal without losses when it ignores ECN (BBRv1
 * overshoots any drop-tail queue in its startup), so the pod's advertised receive window is
 * capped at rate x handshake RTT + AN_WND_QUEUE_NS of the rate (at least AN_WND_MIN_FRAMES
 * frames), shared among the flows with a backlog in the class (an_vqueue.flows_*),
 * at least AN_WND_MIN_FLOW_FRAMES per connection: the senders together can then never have
 * more in flight than the path plus a short queue, whatever their congestion control. Only
 * lowered, never raised; not in SYNs; only for connections whose window scale the program
 * saw agreed in the handshake.
 *
 * The node's internet cap (on the uplink) is the same case the other way round: its senders
 * are the pods, and a drop there is a loss for them. So while a cap is set, the remote's
 * windows in the ACKs to a pod's internet connections are capped the same way, at the cap's
 * rate and shared among the flows with a backlog in the cap's class, with the uplink's frame
 * as the unit of the floors.
 */
/*
 * A shaped class asks TCP for segments of at most AN_SEG_NS of its rate (never below a
 * 1500-byte network's, AN_MIN_FRAME): the MSS option of the handshake is lowered to that
 * (the pod's MSS for its ingress limit; the remote's for the pod's egress limits and the
 * node cap), and the clamp's floors and the sparse budget are in frames of that size. Above
 * ~72 Mbit/s a 9000-byte MTU's segments pass as they are.
 */
#define AN_SEG_NS 1000000
#define AN_MAX_CONNS 65536
#define AN_WND_QUEUE_NS 16000000
#define AN_WND_MIN_FRAMES 4
#define AN_WND_MIN_FLOW_FRAMES 2
_Static_assert(AN_LEAF_QUEUE_FRAMES >= AN_WND_MIN_FRAMES + AN_LEAF_BURST_FRAMES,
	       "a clamped sender fits the leaf queue");
#define AN_CONN_SYN_SENT 1    /* the pod sent a SYN; its window scale holds if the SYN-ACK agrees */
#define AN_CONN_SYNACK_SENT 2 /* the pod answered a SYN; RTT from its SYN-ACK to the next ACK */
#define AN_CONN_ESTABLISHED 3
#define AN_CONN_SYN_RCVD 4    /* the remote sent a SYN (its window scale is kept for the pod's SYN-ACK) */

struct an_conn_key {
	__u32 pod_addr;    /* network byte order */
	__u32 remote_addr;
	__u16 pod_port;    /* network byte order */
	__u16 remote_port;
};
_Static_assert(sizeof(struct an_conn_key) == 12, "an_conn_key size");

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
