/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What the datapath reads of a packet: the IPv4 or IPv6 header, the ports and the TCP header. */
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

#define AN_TCP_FIN 0x01
#define AN_TCP_SYN 0x02
#define AN_TCP_RST 0x04
#define AN_TCP_ACK 0x10

/* Length in bytes of the TCP header, options included, from its data-offset byte. */
#define AN_TCP_HDR_LEN(doff) (((doff) >> 4) * 4)

/*
 * What the programs know of a packet. IPv4 and IPv6 fill the same fields: the addresses in
 * full as IPv6 (IPv4 as IPv4-mapped, ::ffff:a.b.c.d), which an_conns keys on, and as 32 bits
 * (the IPv4 address, or for IPv6 the four words XORed together) for the flow hash.
 */
struct an_pkt {
	__u32 saddr; /* IPv4, network byte order; IPv6: the four words XORed (flow hash only) */
	__u32 daddr;
	__u32 segs;
	__u8 tos;    /* IPv4 TOS or IPv6 traffic class: ECN in the low two bits */
	__u8 proto;  /* transport protocol (IPv6: the header the walk stopped at) */
	__u8 v6;     /* 1 for IPv6 */
	__u8 frag;   /* 1 for a fragment (IPv4 MF or offset, an IPv6 fragment header) */
	__u64 bytes;
	__u32 ports; /* TCP/UDP source and destination port, 0 for fragments and other protocols */
	__u16 l3len; /* bytes from the IP header to the transport header (options, extensions) */
	__u16 pad2;
	__u32 saddr6[4]; /* network byte order */
	__u32 daddr6[4];
};

/* The fixed IPv6 header, without linux/ipv6.h's bit fields. */
struct an_ip6hdr {
	__u8 vtc_flow[4]; /* version, traffic class, flow label */
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u32 saddr[4];
	__u32 daddr[4];
};

#define AN_IP6_HLEN ((__u32)sizeof(struct an_ip6hdr))
/* IPv6 extension headers the walk steps over (RFC 8200 section 4) and where it stops. */
#define AN_NEXTHDR_HOP 0
#define AN_NEXTHDR_ROUTING 43
#define AN_NEXTHDR_FRAGMENT 44
#define AN_NEXTHDR_AUTH 51
#define AN_NEXTHDR_DEST 60
/*
 * Extension headers walked before giving up. A packet with more is classified by its
 * addresses and otherwise not parsed further: its `proto` is the extension header the walk
 * stopped at, so it has no ports, is never clamped and hashes as a fragment does. Real
 * traffic carries one or two (hop-by-hop for MLD, a fragment header).
 */
#define AN_IPV6_MAX_EXT 6

/* Offset of the packet's transport header. */
static __always_inline __u32 l4_off(const struct an_pkt *p)
{
	return ETH_HLEN + p->l3len;
}

/*
 * IPv6: fills *p from the fixed header and walks up to AN_IPV6_MAX_EXT extension headers
 * to the transport header. Returns 1 when the fixed header is whole and says version 6,
 * `*noports` set when the transport header is not known to follow (a fragment, or the walk
 * stopped early).
 */
static __always_inline int parse6(struct __sk_buff *skb, struct an_pkt *p, int *noports)
{
	struct an_ip6hdr h;
	__u32 off = ETH_HLEN + AN_IP6_HLEN;
	__u8 nh, ext[2];

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &h, sizeof(h)) < 0 || (h.vtc_flow[0] >> 4) != 6)
		return 0;
	p->v6 = 1;
	p->tos = (h.vtc_flow[0] << 4) | (h.vtc_flow[1] >> 4);
	for (int i = 0; i < 4; i++) {
		p->saddr6[i] = h.saddr[i];
		p->daddr6[i] = h.daddr[i];
	}
	p->saddr = h.saddr[0] ^ h.saddr[1] ^ h.saddr[2] ^ h.saddr[3];
	p->daddr = h.daddr[0] ^ h.daddr[1] ^ h.daddr[2] ^ h.daddr[3];
	nh = h.nexthdr;
	*noports = 1;
	for (int i = 0; i < AN_IPV6_MAX_EXT; i++) {
		if (nh != AN_NEXTHDR_HOP && nh != AN_NEXTHDR_ROUTING && nh != AN_NEXTHDR_DEST &&
		    nh != AN_NEXTHDR_AUTH && nh != AN_NEXTHDR_FRAGMENT) {
			*noports = 0;
			break;
		}
		/* Next header and length are the first two bytes of each of them. */
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
			break;
		if (nh == AN_NEXTHDR_FRAGMENT) {
			/* Fragments hash without ports, as IPv4's do; what follows is not parsed. */
			p->frag = 1;
			nh = ext[0];
			off += 8;
			break;
		}
		off += nh == AN_NEXTHDR_AUTH ? ((__u32)ext[1] + 2) * 4 : ((__u32)ext[1] + 1) * 8;
		nh = ext[0];
	}
	p->proto = nh;
	p->l3len = off - ETH_HLEN;
	return 1;
}

/*
 * Returns 1 for an IPv4 or IPv6 packet with its addresses in *p (zeroed by the caller), 0
 * for anything else. Only the fixed part of the IPv4 header is read: options and
 * fragmentation do not move the addresses, and a non-first fragment is classed by address
 * like any other packet. IPv6 extension headers are walked (see parse6()).
 */
static __always_inline int parse(struct __sk_buff *skb, struct an_pkt *p)
{
	struct iphdr iph;
	int noports = 0;

	p->segs = 1;
	p->bytes = skb->len;
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (!parse6(skb, p, &noports))
			return 0;
	} else if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &iph, sizeof(iph)) < 0)
			return 0;
		/* A malformed header is passed as "other": ip_rcv drops it anyway. */
		if (iph.version != 4 || iph.ihl < 5)
			return 0;
		p->saddr = iph.saddr;
		p->daddr = iph.daddr;
		p->saddr6[2] = bpf_htonl(0xffff);
		p->saddr6[3] = iph.saddr;
		p->daddr6[2] = bpf_htonl(0xffff);
		p->daddr6[3] = iph.daddr;
		p->tos = iph.tos;
		p->proto = iph.protocol;
		p->l3len = iph.ihl * 4;
		/* Fragments (first one included) hash without ports: a datagram stays in one leaf. */
		noports = !!(iph.frag_off & bpf_htons(AN_IP_MF | AN_IP_OFFSET));
		p->frag = noports;
	} else {
		return 0;
	}
	/* TCP and UDP headers both start with the two ports. */
	if ((p->proto == IPPROTO_TCP || p->proto == IPPROTO_UDP) && !noports)
		bpf_skb_load_bytes(skb, l4_off(p), &p->ports, sizeof(p->ports));

	/* A GSO skb is several packets on the wire, each with its own headers. */
	if (skb->gso_segs > 1) {
		__u32 hdr = l4_off(p);

		if (p->proto == IPPROTO_TCP) {
			__u8 doff;

			if (bpf_skb_load_bytes(skb, hdr + AN_TCP_DOFF, &doff, sizeof(doff)) == 0)
				hdr += AN_TCP_HDR_LEN(doff);
		} else if (p->proto == IPPROTO_UDP) {
			hdr += (__u32)sizeof(struct udphdr);
		}
		p->segs = skb->gso_segs;
		p->bytes = skb->len + (__u64)(p->segs - 1) * hdr;
	}
	return 1;
}

#endif /* ALIASNET_LIB_PARSE_H */
