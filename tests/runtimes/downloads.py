#!/usr/bin/env python3
"""The bounds of the downloads that lib.sh's `downloads` ran, as a table; exit status 1 when one
is out of bounds.

    downloads.py DIR CHECK...

DIR holds NAME.json (each receiver's iperf3 -R -J report) and `senders` (lines "TARGET OutSegs0
RetransSegs0 OutSegs1 RetransSegs1"). A CHECK is one of ('|'-separated; RATE in bit/s with an
optional k, M or G; NAMES is NAME or NAME+NAME+...):

    limit|LABEL|RATE|NAMES   the downloads' goodput together is 90-105 % of RATE, over the whole
                             run (its first second included)
    fair|LABEL|NAMES         Jain's fairness index over the downloads is at least 0.95
    paced|LABEL|RATE|NAME    the download, its sender paced at RATE, reached at least 90 % of it
                             (traffic that no limit applies to: what it gets unshaped)

Every download must also have no second without bytes, and every sender must have
retransmitted less than 1 % of the segments it sent.
"""
import json
import pathlib
import sys

UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


def rate(s):
    unit = s[-1] if s[-1] in UNITS and not s[-1].isdigit() else ""
    return float(s[: len(s) - len(unit)]) * UNITS[unit]


def load(d, name):
    p = d / f"{name}.json"
    try:
        j = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        err = (d / f"{name}.err").read_text()[:300] if (d / f"{name}.err").exists() else ""
        return None, f"no iperf3 report ({e}) {err}"
    if "error" in j:
        return None, f"iperf3: {j['error']}"
    ivals = [iv["sum"] for iv in j.get("intervals", [])]
    # The last interval may be a sliver after the sender stopped.
    full = [iv for iv in ivals if iv["seconds"] >= 0.5]
    return {
        "goodput": j["end"]["sum_received"]["bits_per_second"],
        "zero": sum(1 for iv in full if iv["bytes"] == 0),
        "per_s": [iv["bytes"] * 8 / iv["seconds"] for iv in full],
    }, None


def jain(xs):
    s, q = sum(xs), sum(x * x for x in xs)
    return s * s / (len(xs) * q) if q else 1.0


def mbit(x):
    return f"{x / 1e6:.2f}"


def main():
    d = pathlib.Path(sys.argv[1])
    rows, ok_all = [], True
    cells = {}

    def cell(name):
        if name not in cells:
            cells[name] = load(d, name)
        return cells[name]

    for check in sys.argv[2:]:
        kind, label, *rest = check.split("|")
        names = rest[-1].split("+")
        got = [cell(n) for n in names]
        errors = [f"{n}: {e}" for n, (c, e) in zip(names, got) if e]
        if errors:
            rows.append(f"{label:<46} FAIL  {'; '.join(errors)}")
            ok_all = False
            continue
        g = [c["goodput"] for c, _ in got]
        each = " + ".join(mbit(x) for x in g)
        if kind == "limit":
            lim = rate(rest[0])
            pct = 100 * sum(g) / lim
            ok = 90 <= pct <= 105
            what = f"limit {rest[0]:<6} goodput {mbit(sum(g)):>8} Mbit/s {pct:6.1f} %"
            if len(g) > 1:
                what += f" ({each})"
        elif kind == "fair":
            j = jain(g)
            ok = j >= 0.95
            what = f"Jain {j:.3f} (>= 0.95) over {each} Mbit/s"
        elif kind == "paced":
            pace = rate(rest[0])
            pct = 100 * g[0] / pace
            ok = pct >= 90
            what = f"paced {rest[0]:<6} goodput {mbit(g[0]):>8} Mbit/s {pct:6.1f} % (>= 90 %)"
        else:
            sys.exit(f"downloads.py: unknown check {kind!r}")
        ok_all &= ok
        rows.append(f"{label:<46} {what}  {'ok' if ok else 'FAIL'}")
    for name, (c, _) in sorted(cells.items()):
        if c is None:
            continue
        ok = c["zero"] == 0
        ok_all &= ok
        per_s = " ".join(f"{x / 1e6:.1f}" for x in c["per_s"])
        rows.append(f"  {name:<20} zero-byte seconds {c['zero']}  {'ok' if ok else 'FAIL'}  [{per_s}] Mbit/s")
    for line in (d / "senders").read_text().splitlines():
        target, o0, r0, o1, r1 = line.split()
        sent, retr = int(o1) - int(o0), int(r1) - int(r0)
        pct = 100 * retr / sent if sent else 0.0
        ok = pct < 1
        ok_all &= ok
        rows.append(f"  sender {pathlib.Path(target).name:<40} retransmits {retr}/{sent} {pct:.2f} % (< 1 %)"
                    f"  {'ok' if ok else 'FAIL'}")
    print("\n".join(rows))
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
