#!/usr/bin/python3
"""A minimal CRI client: the pod-sandbox calls the kubelet makes, for the runtime tests.

Debian 12 has no crictl. This speaks runtime.v1.RuntimeService over gRPC (python3-grpcio) with a
small hand-written protobuf encoder/decoder for just the messages used here; no generated code.

    cri_client.py --socket SOCK version
    cri_client.py --socket SOCK runp --name N --namespace NS --uid U [--annotation K=V]... -> id
    cri_client.py --socket SOCK inspectp ID     -> JSON {id, name, namespace, state, ip, info}
    cri_client.py --socket SOCK pods            -> JSON [{id, name, namespace, state}]
    cri_client.py --socket SOCK imagestatus REF -> JSON {present, id, repo_tags}
    cri_client.py --socket SOCK stopp ID | rmp ID

Errors go to stderr as "cri_client: METHOD: CODE: details" with exit status 1 (2 for usage).
Every call has a deadline (--timeout), and so does connecting.
"""

import argparse
import json
import sys

RUNTIME = "/runtime.v1.RuntimeService/"
IMAGES = "/runtime.v1.ImageService/"

# ---- protobuf wire format (proto3) ----
VARINT, LEN = 0, 2


def _varint(n):
    if n < 0:  # int64 negatives are ten-byte two's complement
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire):
    return _varint(field << 3 | wire)


def f_str(field, s):
    """A string field; proto3 omits the empty default."""
    if not s:
        return b""
    b = s.encode()
    return _key(field, LEN) + _varint(len(b)) + b


def f_msg(field, body, always=False):
    """A message field. `always` sends an empty message (presence matters, e.g. `linux {}`)."""
    if not body and not always:
        return b""
    return _key(field, LEN) + _varint(len(body)) + body


def f_uint(field, n):
    return _key(field, VARINT) + _varint(n) if n else b""


def f_bool(field, v):
    return _key(field, VARINT) + b"\x01" if v else b""


def f_map(field, d):
    """map<string,string>: repeated entry messages {1: key, 2: value}."""
    return b"".join(f_msg(field, f_str(1, k) + f_str(2, v), always=True) for k, v in sorted(d.items()))


def parse(buf):
    """Decode one message into {field: [values]}: ints for varints, bytes for length-delimited."""
    out, i, n = {}, 0, len(buf)

    def varint():
        nonlocal i
        shift = result = 0
        while True:
            if i >= n:
                raise ValueError("truncated varint")
            b = buf[i]
            i += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    while i < n:
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            val = varint()
        elif wire == LEN:
            ln = varint()
            if i + ln > n:
                raise ValueError(f"field {field}: length {ln} past the end")
            val = bytes(buf[i:i + ln])
            i += ln
        elif wire == 1:  # fixed64
            val, i = bytes(buf[i:i + 8]), i + 8
        elif wire == 5:  # fixed32
            val, i = bytes(buf[i:i + 4]), i + 4
        else:
            raise ValueError(f"field {field}: unsupported wire type {wire}")
        out.setdefault(field, []).append(val)
    if i != n:
        raise ValueError("truncated message")
    return out


def one(msg, field, default=None):
    vals = msg.get(field)
    return vals[-1] if vals else default  # proto3: the last occurrence wins


def text(msg, field):
    return one(msg, field, b"").decode()


def as_map(msg, field):
    d = {}
    for entry in msg.get(field, []):
        e = parse(entry)
        d[text(e, 1)] = text(e, 2)
    return d


# ---- the CRI messages used (field numbers from k8s.io/cri-api runtime/v1 api.proto) ----
def pod_sandbox_metadata(name, uid, namespace, attempt):
    # PodSandboxMetadata: name 1, uid 2, namespace 3, attempt 4
    return f_str(1, name) + f_str(2, uid) + f_str(3, namespace) + f_uint(4, attempt)


def pod_sandbox_config(a):
    # LinuxPodSandboxConfig: cgroup_parent 1
    linux = f_str(1, a.cgroup_parent)
    # PodSandboxConfig: metadata 1, hostname 2, log_directory 3, labels 6, annotations 7, linux 8
    return (f_msg(1, pod_sandbox_metadata(a.name, a.uid, a.namespace, a.attempt), always=True)
            + f_str(2, a.hostname or a.name) + f_str(3, a.log_directory)
            + f_map(6, kv(a.label)) + f_map(7, kv(a.annotation)) + f_msg(8, linux, always=True))


def decode_metadata(buf):
    m = parse(buf)
    return {"name": text(m, 1), "uid": text(m, 2), "namespace": text(m, 3), "attempt": one(m, 4, 0)}


STATES = {0: "SANDBOX_READY", 1: "SANDBOX_NOTREADY"}


def kv(pairs):
    d = {}
    for p in pairs or []:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise SystemExit(f"cri_client: expected KEY=VALUE, got {p!r}")
        d[k] = v
    return d


# ---- gRPC ----
class Client:
    def __init__(self, socket, timeout):
        import grpc  # imported here so that --help works without python3-grpcio

        self.grpc = grpc
        self.timeout = timeout
        self.channel = grpc.insecure_channel("unix://" + socket)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            die(f"connect: no CRI service on {socket} after {timeout:g} s")

    def call(self, method, request, service=RUNTIME):
        rpc = self.channel.unary_unary(service + method, request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
        try:
            return parse(rpc(request, timeout=self.timeout))
        except self.grpc.RpcError as e:
            die(f"{method}: {e.code().name}: {e.details()}")
        except ValueError as e:
            die(f"{method}: undecodable reply: {e}")


def die(msg):
    print(f"cri_client: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description="minimal CRI RuntimeService client")
    ap.add_argument("--socket", required=True, help="containerd's gRPC socket")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per call [30]")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version")
    r = sub.add_parser("runp", help="RunPodSandbox; prints the sandbox id")
    r.add_argument("--name", required=True)
    r.add_argument("--namespace", required=True)
    r.add_argument("--uid", required=True)
    r.add_argument("--attempt", type=int, default=0)
    r.add_argument("--hostname")
    r.add_argument("--log-directory", default="")
    r.add_argument("--cgroup-parent", default="")
    r.add_argument("--label", action="append", metavar="K=V")
    r.add_argument("--annotation", action="append", metavar="K=V")
    r.add_argument("--runtime-handler", default="")
    for name in ("stopp", "rmp"):
        sub.add_parser(name).add_argument("id")
    sub.add_parser("inspectp", help="PodSandboxStatus (verbose)").add_argument("id")
    sub.add_parser("pods", help="ListPodSandbox")
    sub.add_parser("imagestatus", help="ImageStatus: is the image known to the CRI plugin").add_argument("ref")
    a = ap.parse_args()

    c = Client(a.socket, a.timeout)
    if a.cmd == "version":
        m = c.call("Version", f_str(1, "v1"))
        print(json.dumps({"version": text(m, 1), "runtime_name": text(m, 2),
                          "runtime_version": text(m, 3), "runtime_api_version": text(m, 4)}))
    elif a.cmd == "runp":
        # RunPodSandboxRequest: config 1, runtime_handler 2 -> RunPodSandboxResponse: pod_sandbox_id 1
        m = c.call("RunPodSandbox", f_msg(1, pod_sandbox_config(a), always=True) + f_str(2, a.runtime_handler))
        sid = text(m, 1)
        if not sid:
            die("RunPodSandbox: the reply has no sandbox id")
        print(sid)
    elif a.cmd == "stopp":
        c.call("StopPodSandbox", f_str(1, a.id))  # StopPodSandboxRequest: pod_sandbox_id 1
    elif a.cmd == "rmp":
        c.call("RemovePodSandbox", f_str(1, a.id))  # RemovePodSandboxRequest: pod_sandbox_id 1
    elif a.cmd == "inspectp":
        # PodSandboxStatusRequest: pod_sandbox_id 1, verbose 2
        # -> PodSandboxStatusResponse: status 1, info 2 (map; containerd puts JSON under "info")
        m = c.call("PodSandboxStatus", f_str(1, a.id) + f_bool(2, True))
        st = parse(one(m, 1, b""))
        # PodSandboxStatus: id 1, metadata 2, state 3, network 5 (PodSandboxNetworkStatus: ip 1,
        # additional_ips 2 = repeated PodIP: ip 1; a dual-stack pod's second family is there)
        net = parse(one(st, 5, b""))
        info = as_map(m, 2)
        for k, v in info.items():
            try:
                info[k] = json.loads(v)
            except ValueError:
                pass
        out = {"id": text(st, 1), **decode_metadata(one(st, 2, b"")),
               "state": STATES.get(one(st, 3, 0), str(one(st, 3, 0))),
               "ip": text(net, 1), "additional_ips": [text(parse(x), 1) for x in net.get(2, [])],
               "info": info}
        print(json.dumps(out))
    elif a.cmd == "pods":
        # ListPodSandboxRequest {} -> ListPodSandboxResponse: items 1
        # (PodSandbox: id 1, metadata 2, state 3)
        m = c.call("ListPodSandbox", b"")
        items = []
        for raw in m.get(1, []):
            p = parse(raw)
            md = decode_metadata(one(p, 2, b""))
            items.append({"id": text(p, 1), "name": md["name"], "namespace": md["namespace"],
                          "state": STATES.get(one(p, 3, 0), str(one(p, 3, 0)))})
        print(json.dumps(items))
    elif a.cmd == "imagestatus":
        # ImageStatusRequest: image 1 (ImageSpec: image 1) -> ImageStatusResponse: image 1
        # (Image: id 1, repo_tags 2); no image field when the runtime does not have it.
        m = c.call("ImageStatus", f_msg(1, f_str(1, a.ref), always=True), service=IMAGES)
        img = one(m, 1)
        im = parse(img) if img is not None else {}
        print(json.dumps({"present": img is not None, "id": text(im, 1),
                          "repo_tags": [t.decode() for t in im.get(2, [])]}))


if __name__ == "__main__":
    main()
