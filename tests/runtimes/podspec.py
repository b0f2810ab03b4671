#!/usr/bin/env python3
"""Turns the containers of a DaemonSet in install/*.yaml into podman invocations, so that
tests/runtimes/image.sh runs what the manifest says (command, args, env, security context,
volumes, probes) instead of a copy of it. A field this script does not know makes it fail:
a manifest change is then either handled here or noticed.

Host paths are mapped under HOST_ROOT (environment), except those listed in HOST_IDENTITY
(colon-separated), which the caller provides at their real path in its private mount
namespace. ConfigMap volumes are written under CM_ROOT.

  podspec.py prepare FILE DAEMONSET             create the mapped host dirs, write the ConfigMaps
  podspec.py containers FILE DAEMONSET          "init NAME" / "main NAME", in start order
  podspec.py run FILE DAEMONSET CONTAINER NAME NETNS CGROUP_PARENT
                                                `podman run` arguments, NUL-separated
  podspec.py probe FILE DAEMONSET CONTAINER KIND  KIND readinessProbe|livenessProbe: timeout, then
                                                the exec command, NUL-separated (nothing if none)
  podspec.py grace FILE DAEMONSET               terminationGracePeriodSeconds
  podspec.py images FILE...                     every container image, one a line
  podspec.py paths FILE DAEMONSET               "CONTAINER PATH e|x": absolute paths that commands
                                                and probes name and no volume provides, so the
                                                image must have them (x: run as a program)
"""
import json
import os
import pathlib
import re
import sys

import yaml

# Container fields that only the API server, the scheduler or the kubelet's bookkeeping use.
IGNORED_CONTAINER = {"name", "image", "imagePullPolicy", "resources", "readinessProbe", "livenessProbe"}
IGNORED_POD = {
    "serviceAccountName", "automountServiceAccountToken", "enableServiceLinks", "dnsPolicy",
    "priorityClassName", "nodeSelector", "tolerations", "terminationGracePeriodSeconds",
}
K8S_DEFAULT_GRACE = 30


def die(msg):
    sys.exit(f"podspec.py: {msg}")


def docs(path):
    return [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]


def daemonset(path, name):
    for d in docs(path):
        if d["kind"] == "DaemonSet" and d["metadata"]["name"] == name:
            return d
    die(f"no DaemonSet {name} in {path}")


def pod_spec(path, name):
    spec = daemonset(path, name)["spec"]["template"]["spec"]
    unknown = set(spec) - IGNORED_POD - {"hostNetwork", "securityContext", "initContainers", "containers", "volumes"}
    if unknown:
        die(f"{name}: pod field(s) {sorted(unknown)} not handled")
    if not spec.get("hostNetwork"):
        die(f"{name}: only hostNetwork pods are run (the node netns is the host network)")
    psc = spec.get("securityContext", {})
    if set(psc) - {"seccompProfile", "runAsUser", "runAsNonRoot"}:
        die(f"{name}: pod securityContext {sorted(set(psc))} not handled")
    return spec


def container(spec, name):
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c["name"] == name:
            return c
    die(f"no container {name}")


def host_path(p):
    identity = [x for x in os.environ.get("HOST_IDENTITY", "").split(":") if x]
    if p in identity:
        return p
    root = os.environ.get("HOST_ROOT") or die("HOST_ROOT is not set")
    return root + p


def volume_source(spec, vname):
    for v in spec.get("volumes", []):
        if v["name"] == vname:
            return v
    die(f"volume {vname} is not defined")


def cm_dir(name):
    root = os.environ.get("CM_ROOT") or die("CM_ROOT is not set")
    return f"{root}/{name}"


def image_ref(c):
    # A digest pin (name:tag@sha256:...) names the same image as the tag built here.
    return c["image"].split("@", 1)[0]


def cmd_prepare(path, ds):
    spec = pod_spec(path, ds)
    namespace = daemonset(path, ds)["metadata"].get("namespace", "default")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            hp = v["hostPath"]
            p = pathlib.Path(host_path(hp["path"]))
            kind = hp.get("type", "")
            if kind == "DirectoryOrCreate":
                p.mkdir(parents=True, exist_ok=True)
            elif kind == "Directory":
                if not p.is_dir():
                    die(f"hostPath {hp['path']} (type Directory) must exist: {p}")
            else:
                die(f"hostPath type {kind!r} of volume {v['name']} not handled")
        elif "configMap" in v:
            name = v["configMap"]["name"]
            cms = [d for d in docs(path)
                   if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name
                   and d["metadata"].get("namespace", "default") == namespace]
            if not cms:
                die(f"ConfigMap {name} is not in {path}")
            if set(v["configMap"]) - {"name"}:
                die(f"configMap volume options {sorted(v['configMap'])} not handled")
            d = pathlib.Path(cm_dir(name))
            d.mkdir(parents=True, exist_ok=True)
            for key, value in cms[0].get("data", {}).items():
                (d / key).write_text(value)
        elif "secret" in v:
            # The test node has no Secrets: an optional one is an empty volume, as the
            # kubelet mounts it when the Secret does not exist.
            if not v["secret"].get("optional"):
                die(f"volume {v['name']}: a required Secret is not handled")
            d = pathlib.Path(cm_dir("secret-" + v["secret"]["secretName"]))
            d.mkdir(parents=True, exist_ok=True)
        elif "emptyDir" in v:
            pass
        else:
            die(f"volume {v['name']}: source {sorted(set(v) - {'name'})} not handled")


def cmd_containers(path, ds):
    spec = pod_spec(path, ds)
    for c in spec.get("initContainers", []):
        print("init", c["name"])
    for c in spec["containers"]:
        print("main", c["name"])


def size_arg(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", str(q))
    if not m:
        die(f"quantity {q!r} not handled")
    return m.group(1) + {"Ki": "k", "Mi": "m", "Gi": "g", None: ""}[m.group(2)]


def cmd_run(path, ds, cname, name, netns, cgroup_parent):
    spec = pod_spec(path, ds)
    c = container(spec, cname)
    unknown = set(c) - IGNORED_CONTAINER - {"command", "args", "env", "securityContext", "volumeMounts"}
    if unknown:
        die(f"container {cname}: field(s) {sorted(unknown)} not handled")
    a = ["--name", name, "--pull=never", f"--network=ns:{netns}", f"--cgroup-parent={cgroup_parent}"]
    psc = spec.get("securityContext", {})
    sc = c.get("securityContext", {})
    known = {"runAsUser", "runAsNonRoot", "allowPrivilegeEscalation", "readOnlyRootFilesystem",
             "capabilities", "appArmorProfile", "seccompProfile", "privileged"}
    if set(sc) - known:
        die(f"container {cname}: securityContext {sorted(set(sc) - known)} not handled")
    if sc.get("privileged"):
        die(f"container {cname}: privileged containers are not run here")
    user = sc.get("runAsUser", psc.get("runAsUser"))
    if user is not None:
        a.append(f"--user={user}")
    if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) and not user:
        die(f"container {cname}: runAsNonRoot without a non-zero runAsUser")
    if sc.get("allowPrivilegeEscalation") is False:
        a.append("--security-opt=no-new-privileges")
    if sc.get("readOnlyRootFilesystem"):
        # Kubernetes adds no tmpfs of its own; /tmp comes from the manifest's emptyDir.
        a += ["--read-only", "--read-only-tmpfs=false"]
    caps = sc.get("capabilities", {})
    if set(caps) - {"drop", "add"}:
        die(f"container {cname}: capabilities {sorted(caps)} not handled")
    for cap in caps.get("drop", []):
        a.append(f"--cap-drop={cap.lower()}")
    for cap in caps.get("add", []):
        a.append(f"--cap-add={cap.lower()}")
    seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        a.append("--security-opt=seccomp=unconfined")
    elif seccomp != "RuntimeDefault":
        die(f"container {cname}: seccompProfile {seccomp} not handled")
    apparmor = sc.get("appArmorProfile", {}).get("type", "RuntimeDefault")
    if apparmor == "Unconfined":
        a.append("--security-opt=apparmor=unconfined")
    elif apparmor != "RuntimeDefault":
        die(f"container {cname}: appArmorProfile {apparmor} not handled")
    mem = c.get("resources", {}).get("limits", {}).get("memory")
    if mem is not None:
        a.append(f"--memory={size_arg(mem)}")
    for e in c.get("env", []):
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if set(e) == {"name", "value"}:
            a.append(f"--env={e['name']}={e['value']}")
        elif set(e) == {"name", "valueFrom"} and field == "spec.nodeName":
            # The node's name, as the kubelet fills it in: the test node's hostname.
            a.append(f"--env={e['name']}={os.uname().nodename}")
        else:
            die(f"container {cname}: env entry {e} not handled")
    for m in c.get("volumeMounts", []):
        if set(m) - {"name", "mountPath", "readOnly", "mountPropagation"}:
            die(f"container {cname}: volumeMount {m} not handled")
        v = volume_source(spec, m["name"])
        opts = ["ro" if m.get("readOnly") else "rw"]
        prop = m.get("mountPropagation", "None")
        opts.append({"None": "rprivate", "HostToContainer": "rslave"}.get(prop) or
                    die(f"mountPropagation {prop} not handled"))
        if "hostPath" in v:
            a.append(f"--volume={host_path(v['hostPath']['path'])}:{m['mountPath']}:{','.join(opts)}")
        elif "configMap" in v:
            # The kubelet mounts ConfigMap volumes read-only whatever the mount says.
            a.append(f"--volume={cm_dir(v['configMap']['name'])}:{m['mountPath']}:ro")
        elif "secret" in v:
            a.append(f"--volume={cm_dir('secret-' + v['secret']['secretName'])}:{m['mountPath']}:ro")
        elif "emptyDir" in v:
            ed = v["emptyDir"] or {}
            if ed.get("medium") != "Memory":
                die(f"volume {v['name']}: only emptyDir medium Memory is handled")
            t = f"--tmpfs={m['mountPath']}:rw,mode=1777"
            if "sizeLimit" in ed:
                t += f",size={size_arg(ed['sizeLimit'])}"
            a.append(t)
    command, args = c.get("command"), c.get("args", [])
    if command:
        # Kubernetes' command replaces the image's ENTRYPOINT and drops its CMD.
        a.append("--entrypoint=" + json.dumps(command))
    a.append(image_ref(c))
    a += args
    sys.stdout.write("\0".join(a) + "\0")


def cmd_probe(path, ds, cname, kind):
    c = container(pod_spec(path, ds), cname)
    p = c.get(kind)
    if not p:
        return
    if set(p) - {"exec", "initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold", "successThreshold"}:
        die(f"container {cname}: {kind} {sorted(p)} not handled (only exec probes)")
    sys.stdout.write("\0".join([str(p.get("timeoutSeconds", 1))] + p["exec"]["command"]) + "\0")


def cmd_grace(path, ds):
    print(daemonset(path, ds)["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", K8S_DEFAULT_GRACE))


def cmd_images(*paths):
    for path in paths:
        for d in docs(path):
            if d["kind"] != "DaemonSet":
                continue
            spec = d["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                print(c["image"])


def cmd_paths(path, ds):
    spec = pod_spec(path, ds)
    for c in spec.get("initContainers", []) + spec["containers"]:
        mounts = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])]
        commands = [list(c.get("command", [])) + list(c.get("args", []))]
        for kind in ("readinessProbe", "livenessProbe"):
            commands.append((c.get(kind) or {}).get("exec", {}).get("command", []))
        for words in commands:
            for i, w in enumerate(words):
                # "--flag=/path" and "/path" both name a path.
                p = w.split("=", 1)[1] if w.startswith("-") and "=" in w else w
                if not p.startswith("/"):
                    continue
                if any(p == m or p.startswith(m + "/") for m in mounts):
                    continue
                print(c["name"], p, "x" if i == 0 else "e")


def main():
    if len(sys.argv) < 2:
        die(__doc__)
    cmds = {"prepare": cmd_prepare, "containers": cmd_containers, "run": cmd_run, "probe": cmd_probe,
            "grace": cmd_grace, "images": cmd_images, "paths": cmd_paths}
    f = cmds.get(sys.argv[1]) or die(f"unknown command {sys.argv[1]}")
    f(*sys.argv[2:])


if __name__ == "__main__":
    main()
