/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What the datapath reads of a packet: the IPv4 header, the ports and the TCP header. */
#ifndef ALIASNET_LIB_PARSE_H
#define ALIASNET_LIB_PARSE_H

#include "common.h"

/* IPv4 frag_off bits (host order): more fragments, and the fragment offset. */
#define AN_IP_MF 0x2000
#define AN_IP_OFFSET 0x1fff

/* The fixed TCP header (linux/tcp.h's bit fields cannot be named by offsetof). */
struct an_tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff;  /* data offset in the high nibble */
	__u8 flags; /* CWR ECE URG ACK PSH RST SYN FIN */
	__be16 window;
	__be16 check;
	__be16 urg_ptr;
};

/* Offsets and lengths within the TCP header, 32-bit like the packet offsets they add to. */
#define AN_TCP_HLEN ((__u32)sizeof(struct an_tcphdr))
#define AN_TCP_DOFF ((__u32)offsetof(struct an_tcphdr, doff))
#define AN_TCP_WINDOW ((__u32)offsetof(struct an_tcphdr, window))
#define AN_TCP_CHECK ((__u32)offsetof(struct an_tcphdr, check))

#define AN_TCP_SYN 0x02
#define AN_TCP_ACK 0x10

/* Length in bytes of the TCP header, options included, from its data-offset byte. */
#define AN_TCP_HDR_LEN(doff) (((doff) >> 4) * 4)

struct an_pkt {
	__u32 saddr;
	__u32 daddr;
	__u32 segs;
	__u8 tos;
	__u8 proto;
	__u8 ihl;
	__u8 pad;
	__u64 bytes;
	__u32 ports; /* TCP/UDP source and destination port, 0 for fragments and other protocols */
	__u32 pad2;
};

/* Offset of the packet's transport header. */
static __always_inline __u32 l4_off(const struct an_pkt *p)
{
	return ETH_HLEN + p->ihl * 4;
}

/*
 * Returns 1 for an IPv4 packet with its addresses in *p. Only the fixed part of
 * the IPv4 header is read: options and fragmentation do not move the addresses,
 * and a non-first fragment is classed by address like any other packet.
 */
static __always_inline int parse(struct __sk_buff *skb, struct an_pkt *p)
{
	struct iphdr iph;

	p->segs = 1;
	p->bytes = skb->len;
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &iph, sizeof(iph)) < 0)
		return 0;
	/* A malformed header is passed as "other": ip_rcv drops it anyway. */
	if (iph.version != 4 || iph.ihl < 5)
		return 0;
	p->saddr = iph.saddr;
	p->daddr = iph.daddr;
	p->tos = iph.tos;
	p->proto = iph.protocol;
	p->ihl = iph.ihl;
	/*
	 * Fragments (first one included) hash without ports, so all of a datagram stays in one
	 * leaf. TCP and UDP headers both start with the two ports.
	 */
	if ((iph.protocol == IPPROTO_TCP || iph.protocol == IPPROTO_UDP) &&
	    !(iph.frag_off & bpf_htons(AN_IP_MF | AN_IP_OFFSET)))
		bpf_skb_load_bytes(skb, ETH_HLEN + iph.ihl * 4, &p->ports, sizeof(p->ports));

	/* A GSO skb is several packets on the wire, each with its own headers. */
	if (skb->gso_segs > 1) {
		__u32 hdr = ETH_HLEN + iph.ihl * 4;

		if (iph.protocol == IPPROTO_TCP) {
			__u8 doff;

			if (bpf_skb_load_bytes(skb, hdr + AN_TCP_DOFF, &doff, sizeof(doff)) == 0)
				hdr += AN_TCP_HDR_LEN(doff);
		} else if (iph.protocol == IPPROTO_UDP) {
			hdr += (__u32)sizeof(struct udphdr);
		}
		p->segs = skb->gso_segs;
		p->bytes = skb->len + (__u64)(p->segs - 1) * hdr;
	}
	return 1;
}

#endif /* ALIASNET_LIB_PARSE_H */
