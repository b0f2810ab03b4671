/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * aliasnet datapath tuning: the sizes and thresholds of the queue model, flow isolation
 * and the window clamp, shared with userspace (ebpf/src/tuning.rs) so that the qdiscs it
 * builds match the model, and the switches benchmarks use to turn parts of the datapath
 * off. None of this is layout: a change alters behaviour, pinned maps stay valid, and
 * AN_ABI_VERSION (aliasnet_abi.h) is not bumped for it.
 */
#ifndef ALIASNET_TUNING_H
#define ALIASNET_TUNING_H

/*
 * Benchmark switches: bits of an_config.flags. Never set by policy; benchmarks set them
 * to compare with and without a part of the datapath in one run. Only the benchmarks'
 * build of the object (compiled with AN_BENCH_SWITCHES: datapath.bench.bpf.o) reads them;
 * the product's ignores them, so its per-packet path has no test of a switch.
 */
/* The queue model: no CE marks, no pod-side drops. */
#define AN_CFG_AQM_OFF 1
/* Flow isolation: every packet of a shaped class goes to its bulk leaf. */
#define AN_CFG_FLOWS_OFF 2
/* Receive-window clamping. */
#define AN_CFG_CLAMP_OFF 4

/*
 * Sizes in "frames" are in units of the device's largest frame (MTU + Ethernet header,
 * an_pod_meta.frame and an_config.uplink_frame), never of a fixed 1500-byte MTU: no
 * bucket, queue, threshold or window may be smaller than a packet the device can hand the
 * qdisc without segmenting it. At a rate where one frame takes longer than a time target
 * (9014 bytes at 1 Mbit/s: 72 ms) the frame floor wins and the delay grows with the frame.
 * AN_MIN_FRAME is used only for a record that carries no frame size.
 */
#define AN_MIN_FRAME 1514

/*
 * A shaped class asks TCP for segments of at most AN_SEG_NS of its rate (never below a
 * 1500-byte network's, AN_MIN_FRAME): the MSS option of the handshake is lowered to that
 * (the pod's MSS for its ingress limit; the remote's for the pod's egress limits and the
 * node cap), and the clamp's floors and the sparse budget are in frames of that size.
 * Above ~72 Mbit/s a 9000-byte MTU's segments pass as they are.
 */
#define AN_SEG_NS 1000000

/*
 * The queue model (an_vqueue). The programs see each packet before the class's qdisc
 * does, so they model its backlog at the class rate (as Cilium's EDT does, with the
 * class's HTB burst as credit and the leaf's drop-tail limit) and CE-mark an ECN-capable
 * packet that would wait longer than the marking threshold: ECN TCP then backs off before
 * the drop-tail queue overflows, also on kernels without an AQM qdisc. On the pod side,
 * where senders are local, a TCP data segment that cannot be marked is dropped instead (a
 * congestion signal, not a loss, for a local sender).
 *
 * Marking threshold (modelled queueing delay): 2 ms up to 10 Mbit/s, growing in proportion
 * to the rate up to 10 ms from 50 Mbit/s, and at least 2 frames. Measured on veth with
 * one cubic + ECN flow: at 10 Mbit/s 2 ms kept the rate at 95 % of the configured
 * (goodput) with ~2 ms of queue, 5-10 ms lost 1-5 %; at 100 Mbit/s and 1 Gbit/s 2 ms lost
 * 3-6 % (the window cut empties a queue that holds only a few of the sender's GSO
 * aggregates) and 10 ms did not.
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
 * Forwarded traffic (tbf bulk leaf): a peak bucket of 1 ms, at least 2 frames (a GSO
 * aggregate larger than it is segmented, a frame always fits); a bucket that takes all HTB
 * releases at once, refilled a little faster than the class, so that HTB alone shapes (see
 * the shaper's Shape); and a drop-tail queue of 25 ms at the rate, at least
 * AN_LEAF_QUEUE_FRAMES frames: room for the window clamp's floor (AN_WND_MIN_FRAMES) plus
 * the peak bucket, so a clamped sender never overflows it. The class's HTB burst is the
 * model's burst credit on both sides.
 */
#define AN_DEFAULT_BURST_NS 10000000
#define AN_DEFAULT_BURST_FRAMES 4
#define AN_LEAF_BURST_NS 1000000
#define AN_LEAF_BURST_FRAMES 2
#define AN_LEAF_QUEUE_NS 25000000
#define AN_LEAF_QUEUE_FRAMES 6

/*
 * Flow isolation (an_flows). A packet goes to its class's sparse leaf when (1) none of its
 * flow's packets is left in the bulk leaf (by the class's modelled queue, plus
 * AN_FLOW_GUARD_FRAMES, so a flow is never reordered) and (2) the flow is within its sparse
 * budget: a token bucket of AN_FLOW_BURST_FRAMES of the class's segments (see AN_SEG_NS)
 * refilled at rate / AN_FLOW_RATE_DIV. A GSO skb of more than the budget, or a flow faster
 * than the refill, goes to the bulk leaf and stays there while it has a backlog. The
 * sparse leaf is guaranteed rate / AN_SPARSE_RATE_DIV of the class (and may borrow up to
 * all of it); the bulk leaf the rest. The flows with a backlog in the bulk leaf are tracked
 * per epoch of AN_FLOW_EPOCH_NS; the window clamp shares its allowance among them.
 */
#define AN_FLOW_BURST_FRAMES 2
#define AN_FLOW_RATE_DIV 16
#define AN_FLOW_GUARD_FRAMES 1
#define AN_SPARSE_RATE_DIV 4
#define AN_FLOW_EPOCH_NS 100000000

/*
 * The backstop of a pod's egress limits on its host veth (lib/police.h). The pod's HTB,
 * which shapes its egress, is in the pod's namespace, where CAP_NET_ADMIN can remove it; the
 * host veth polices what arrives at AN_POLICE_RATE_PCT % of each egress limit, letting
 * through a backlog of the limit's HTB burst, the pod's largest GSO aggregate and
 * AN_POLICE_SLACK_NS of the limit (at least AN_POLICE_SLACK_FRAMES frames): room for HTB's
 * own overshoot and for packets the host's softirq delayed and then delivered at once, so
 * that nothing the pod's HTB released is ever dropped. The GSO aggregate counts up to
 * AN_POLICE_GSO_CAP bytes, above any device's maximum (512 KiB with BIG TCP), which keeps
 * its time exact (see tx_ns()).
 */
#define AN_POLICE_RATE_PCT 110
#define AN_POLICE_SLACK_NS 100000000
#define AN_POLICE_SLACK_FRAMES 8
#define AN_POLICE_GSO_CAP 1048576

/*
 * The window clamp (an_conns). Traffic to a pod with an ingress limit comes from remote
 * senders whose congestion control the shaper cannot signal without losses when it
 * ignores ECN (BBRv1 overshoots any drop-tail queue in its startup), so the pod's
 * advertised receive window is capped at rate x handshake RTT + AN_WND_QUEUE_NS of the
 * rate (at least AN_WND_MIN_FRAMES frames), shared among the flows with a backlog in the
 * class, at least AN_WND_MIN_FLOW_FRAMES per connection: the senders together can then
 * never have more in flight than the path plus a short queue, whatever their congestion
 * control. Only lowered, never raised; not in SYNs; only for connections whose window
 * scale the program saw agreed in the handshake.
 *
 * The node's internet cap (on the uplink) is the same case the other way round: its
 * senders are the pods, and a drop there is a loss for them. So while a cap is set, the
 * remote's windows in the ACKs to a pod's internet connections are capped the same way,
 * at the cap's rate and shared among the flows with a backlog in the cap's class, with the
 * uplink's frame as the unit of the floors.
 */
#define AN_WND_QUEUE_NS 16000000
#define AN_WND_MIN_FRAMES 4
#define AN_WND_MIN_FLOW_FRAMES 2
_Static_assert(AN_LEAF_QUEUE_FRAMES >= AN_WND_MIN_FRAMES + AN_LEAF_BURST_FRAMES,
	       "a clamped sender fits the leaf queue");

#endif /* ALIASNET_TUNING_H */
