/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Headers every part of the datapath uses, and the arithmetic of rates, frames and time. */
#ifndef ALIASNET_LIB_COMMON_H
#define ALIASNET_LIB_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "aliasnet_abi.h"
#include "aliasnet_tuning.h"

#define NSEC_PER_SEC 1000000000ULL

/*
 * Time to send `bytes` at `rate` bit/s (rate > 0). bytes * 8e9 fits 64 bits below
 * AN_TX_EXACT_BYTES: callers pass packets and frames (at most a 512 KiB GSO aggregate's
 * segments, or AN_LEAF_QUEUE_FRAMES frames of at most 65,549 bytes); a class's burst, which
 * can be larger, goes through burst_ns(). Mirrored, with its bounds tested, in tuning.rs.
 */
#define AN_TX_EXACT_BYTES (1ULL << 31)
static __always_inline __u64 tx_ns(__u64 bytes, __u64 rate)
{
	return bytes * 8 * NSEC_PER_SEC / rate;
}

/*
 * Time to send a class's burst of `burst` bytes at `rate` bit/s (rate > 0). Userspace keeps
 * a burst within 1 s of the rate (at least a few frames), so one of AN_TX_EXACT_BYTES or
 * more belongs to a rate above 17 Gbit/s: both are scaled down by 2^16 (off by at most
 * 2^-15), and a burst above AN_BURST_MAX_BYTES (1 s of 1 Pbit/s, the highest rate accepted,
 * is 2^46.8 bytes) is cut to it, so that nothing wraps.
 */
#define AN_BURST_MAX_BYTES ((1ULL << 47) - 1)
static __always_inline __u64 burst_ns(__u64 burst, __u64 rate)
{
	if (burst < AN_TX_EXACT_BYTES)
		return tx_ns(burst, rate);
	if (burst > AN_BURST_MAX_BYTES)
		burst = AN_BURST_MAX_BYTES;
	return (burst >> 16) * 8 * NSEC_PER_SEC / (rate >> 16);
}

/* `ns`, or `frames` frames of `frame` bytes at `rate` if that takes longer. */
static __always_inline __u64 at_least(__u64 ns, __u64 frames, __u64 frame, __u64 rate)
{
	__u64 f = tx_ns(frames * frame, rate);

	return f > ns ? f : ns;
}

/* A device's largest frame as recorded by userspace, or AN_MIN_FRAME if unrecorded. */
static __always_inline __u64 frame_of(__u32 recorded)
{
	return recorded ? recorded : AN_MIN_FRAME;
}

/*
 * The largest frame TCP is asked to send into a class at `rate` on a device whose frame is
 * `frame`: AN_SEG_NS of the rate, never below AN_MIN_FRAME nor above the device's frame. On
 * a jumbo-frame device a slow class then gets segments of a 1500-byte network, so its window
 * clamp, queue and flow isolation work in the same units there (9014 bytes take 7.2 ms at
 * 10 Mbit/s; four flows' window floors of two such frames overflow a 25 ms queue).
 */
static __always_inline __u64 seg_frame(__u64 rate, __u64 frame)
{
	__u64 f = rate / 8 / (NSEC_PER_SEC / AN_SEG_NS);

	if (f < AN_MIN_FRAME)
		f = AN_MIN_FRAME;
	return f < frame ? f : frame;
}

/*
 * Whether the part of the datapath that an_config.flags bit `off` switches off is on. The
 * switches exist in the benchmarks' build of the object only (AN_BENCH_SWITCHES); in the
 * product's every part is always on and no packet reads the flags.
 */
#ifdef AN_BENCH_SWITCHES
static __always_inline int feature_on(const struct an_config *cfg, __u32 off)
{
	return !cfg || !(cfg->flags & off);
}
#else
static __always_inline int feature_on(const struct an_config *cfg, __u32 off)
{
	(void)cfg;
	(void)off;
	return 1;
}
#endif

#endif /* ALIASNET_LIB_COMMON_H */
