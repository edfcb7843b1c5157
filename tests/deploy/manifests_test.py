#!/usr/bin/env python3
"""Offline validation of deploy/ (kustomize) and its agreement with the server and docker/.

Every YAML file parses; every kustomization is rendered (by a small built-in renderer of
the kustomize features deploy/ uses, and also by `kubectl kustomize` when kubectl is
installed) and the rendered objects are checked: required fields, selectors that match,
native gRPC probes on the port the config listens on, the metrics port, a grace period
longer than drain + checkpoint, the PVC, GPUs for the CUDA variants, the multi-rank
StatefulSet's rendezvous layout, and the config each ConfigMap carries is accepted by
`streambp-server serve --config FILE --check-config`.

usage: manifests_test.py STREAMBP_SERVER_BINARY REPO_ROOT
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

server_bin, repo = sys.argv[1], sys.argv[2]
deploy = os.path.join(repo, "deploy")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


# --- 1. every YAML file parses -------------------------------------------------------
yaml_files = []
for dirpath, _, files in os.walk(deploy):
    for f in sorted(files):
        if f.endswith((".yaml", ".yml")):
            path = os.path.join(dirpath, f)
            yaml_files.append(path)
            try:
                docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
                check(docs, f"{path}: no YAML document")
            except yaml.YAMLError as e:
                check(False, f"{path}: does not parse: {e}")
check(len(yaml_files) >= 8, f"expected the deploy/ manifests, found {yaml_files}")


# --- 2. rendering ----------------------------------------------------------------------
def merge(base, patch):
    """Strategic-merge subset: maps merge, lists of named maps merge by name, else replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    if (isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = [dict(x) for x in base]
        for p in patch:
            for i, b in enumerate(out):
                if b["name"] == p["name"]:
                    out[i] = merge(b, p)
                    break
            else:
                out.append(p)
        return out
    return patch


def render(kdir):
    """Renders a kustomization with the features deploy/ uses: resources (files and
    directories), labels, configMapGenerator (files; behavior replace), images, patches.
    ConfigMaps keep their plain names (kustomize adds a content hash; see names())."""
    k = yaml.safe_load(open(os.path.join(kdir, "kustomization.yaml")))
    objs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(kdir, r))
        objs += render(p) if os.path.isdir(p) else [d for d in yaml.safe_load_all(open(p)) if d]
    for g in k.get("configMapGenerator", []):
        data = {os.path.basename(f): open(os.path.join(kdir, f)).read() for f in g.get("files", [])}
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data}
        if g.get("behavior") == "replace":
            objs = [o for o in objs if not (o["kind"] == "ConfigMap" and o["metadata"]["name"] == g["name"])]
        objs.append(cm)
    for p in k.get("patches", []):
        patch = yaml.safe_load(open(os.path.join(kdir, p["path"])))
        for i, o in enumerate(objs):
            if o["kind"] == patch["kind"] and o["metadata"]["name"] == patch["metadata"]["name"]:
                objs[i] = merge(o, patch)
    for lab in k.get("labels", []):
        for o in objs:
            o.setdefault("metadata", {}).setdefault("labels", {}).update(lab["pairs"])
    for img in k.get("images", []):
        for o in objs:
            for c in containers(o):
                if c.get("image", "").split(":")[0] == img["name"]:
                    c["image"] = img.get("newName", img["name"]) + (":" + img["newTag"] if "newTag" in img else "")
    return copy.deepcopy(objs)


def containers(o):
    return o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []) if o.get("kind") in (
        "Deployment", "StatefulSet") else []


def base_name(name):
    """kustomize appends -<hash> to generated ConfigMap names."""
    return re.sub(r"-[a-z0-9]{10}$", "", name)


# --- 3. checks on one rendered kustomization -------------------------------------------
def port_of(listen):
    return int(listen.rsplit(":", 1)[1])


def check_rendering(label, objs, expect_gpu, multi_rank):
    where = lambda o: f"{label}: {o.get('kind')}/{o.get('metadata', {}).get('name')}"
    for o in objs:
        check(o.get("apiVersion") and o.get("kind") and o.get("metadata", {}).get("name"),
              f"{label}: an object lacks apiVersion/kind/metadata.name: {str(o)[:120]}")
    by_kind = lambda kind: [o for o in objs if o["kind"] == kind]
    config_maps = {base_name(o["metadata"]["name"]): o for o in by_kind("ConfigMap")}
    pvcs = {o["metadata"]["name"] for o in by_kind("PersistentVolumeClaim")}
    workloads = by_kind("Deployment") + by_kind("StatefulSet")
    check(len(workloads) == 1, f"{label}: expected one workload, got {len(workloads)}")
    for w in workloads:
        spec, pod = w["spec"], w["spec"]["template"]["spec"]
        selector = spec["selector"]["matchLabels"]
        tmpl_labels = w["spec"]["template"]["metadata"].get("labels", {})
        check(selector and all(tmpl_labels.get(k) == v for k, v in selector.items()),
              f"{where(w)}: selector {selector} does not match the template labels {tmpl_labels}")
        check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{where(w)}: not runAsNonRoot")
        check(len(pod["containers"]) == 1, f"{where(w)}: expected one container")
        c = pod["containers"][0]
        check(c.get("image", "").startswith("streambp-server:"), f"{where(w)}: image {c.get('image')} has no tag")
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        # The config the pod runs: --config <mountPath>/<key> from a ConfigMap volume.
        args = " ".join(c.get("command", []) + c.get("args", []))
        m = re.search(r"--config[ =](\S+)", args)
        if not check(m, f"{where(w)}: no --config in the container's command/args: {args}"):
            continue
        config_path = m.group(1)
        mount = next((vm for vm in c.get("volumeMounts", []) if config_path.startswith(vm["mountPath"] + "/")), None)
        if not check(mount, f"{where(w)}: {config_path} is not on a mounted volume"):
            continue
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        vol = volumes.get(mount["name"], {})
        cm_name = base_name(vol.get("configMap", {}).get("name", ""))
        key = config_path[len(mount["mountPath"]) + 1:]
        if not check(cm_name in config_maps and key in config_maps[cm_name].get("data", {}),
                     f"{where(w)}: {config_path} is not a key of a ConfigMap in the rendering"):
            continue
        config_text = config_maps[cm_name]["data"][key]
        config = json.loads(config_text)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(config_text)
        r = subprocess.run([server_bin, "serve", "--config", f.name, "--check-config"], capture_output=True, text=True)
        os.unlink(f.name)
        check(r.returncode == 0 and "config OK" in r.stderr,
              f"{where(w)}: streambp-server --check-config refused ConfigMap {cm_name}/{key}: {r.stderr.strip()}")
        grpc_port = port_of(config.get("listen", "127.0.0.1:50051"))
        check(config.get("listen", "").startswith("0.0.0.0:"), f"{where(w)}: listen must be 0.0.0.0:<port> in a pod")
        check(ports.get("grpc") == grpc_port, f"{where(w)}: container port grpc {ports.get('grpc')} != config listen port {grpc_port}")
        metrics = config.get("metrics", {}).get("listen", "")
        if check(metrics, f"{where(w)}: metrics are off in the config"):
            check(ports.get("metrics") == port_of(metrics), f"{where(w)}: container port metrics != config metrics.listen")
            ann = w["spec"]["template"]["metadata"].get("annotations", {})
            check(ann.get("prometheus.io/port") == str(port_of(metrics)), f"{where(w)}: prometheus.io/port annotation")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if check(p and "grpc" in p, f"{where(w)}: {probe} is not a native gRPC probe"):
                check(p["grpc"]["port"] == grpc_port, f"{where(w)}: {probe} port {p['grpc']['port']} != {grpc_port}")
        # Single server: ready = the Trainer service is SERVING. Multi-rank: ranks > 0 serve
        # only the server-wide health, so readiness checks that ("").
        check(c["readinessProbe"]["grpc"].get("service", "") == ("" if multi_rank else "streambp.v1.Trainer"),
              f"{where(w)}: readiness must check {'the whole server' if multi_rank else 'streambp.v1.Trainer'}")
        startup = c["startupProbe"]
        check(startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) >= 300,
              f"{where(w)}: startupProbe allows less than 5 minutes for model loading")
        shutdown = config.get("shutdown", {})
        drain = shutdown.get("grace_seconds", 30)
        checkpoint_margin = 60 if shutdown.get("checkpoint_on_exit") else 0
        check(pod.get("terminationGracePeriodSeconds", 30) > drain + checkpoint_margin,
              f"{where(w)}: terminationGracePeriodSeconds {pod.get('terminationGracePeriodSeconds')} <= drain "
              f"{drain} + checkpoint {checkpoint_margin}")
        # Checkpoints and the rollout log land on persistent storage.
        claim_templates = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
        state_dirs = [config.get("checkpoint_dir", "")] + [config.get("rollouts", {}).get("log", "")]
        for d in filter(None, state_dirs):
            vm = next((vm for vm in c.get("volumeMounts", []) if d.startswith(vm["mountPath"] + "/")), None)
            if check(vm, f"{where(w)}: {d} is not on a mounted volume"):
                v = volumes.get(vm["name"])
                persistent = (v and v.get("persistentVolumeClaim", {}).get("claimName") in pvcs) or (
                    not v and vm["name"] in claim_templates)
                check(persistent, f"{where(w)}: {d} is on volume {vm['name']}, not a PersistentVolumeClaim")
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if expect_gpu:
            check(gpus and int(gpus) >= 1, f"{where(w)}: no nvidia.com/gpu limit")
            check(config.get("model", {}).get("device", "cpu").startswith("cuda"), f"{where(w)}: GPU pod, model.device cpu")
        else:
            check(not gpus, f"{where(w)}: a GPU on the CPU variant")
            check(config.get("model", {}).get("device", "cpu") == "cpu", f"{where(w)}: CPU pod, model.device not cpu")
        if w["kind"] == "Deployment":
            check(spec.get("replicas", 1) == 1 and spec.get("strategy", {}).get("type") == "Recreate",
                  f"{where(w)}: one trainer per volume: replicas 1 and strategy Recreate")
        # Services route to this workload, by port names the container has.
        for s in by_kind("Service"):
            sel = s["spec"].get("selector", {})
            if all(tmpl_labels.get(k) == v for k, v in sel.items() if not k.startswith("statefulset.kubernetes.io/")):
                for sp in s["spec"]["ports"]:
                    tp = sp.get("targetPort", sp["port"])
                    check(tp in ports if isinstance(tp, str) else tp in ports.values(),
                          f"{label}: Service/{s['metadata']['name']} targetPort {tp} is not a container port")
            else:
                check(False, f"{label}: Service/{s['metadata']['name']} selects nothing: {sel}")
        if multi_rank:
            check(w["kind"] == "StatefulSet", f"{where(w)}: multi-rank must be a StatefulSet")
            check(spec.get("podManagementPolicy") == "Parallel", f"{where(w)}: podManagementPolicy must be Parallel")
            headless = [s for s in by_kind("Service") if s["metadata"]["name"] == spec.get("serviceName")]
            if check(headless, f"{where(w)}: serviceName {spec.get('serviceName')} is not a Service in the rendering"):
                check(headless[0]["spec"].get("clusterIP") == "None", f"{where(w)}: the governing Service is not headless")
                check(headless[0]["spec"].get("publishNotReadyAddresses") is True,
                      f"{where(w)}: the headless Service must publishNotReadyAddresses")
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            check(env.get("WORLD_SIZE") == str(spec.get("replicas")),
                  f"{where(w)}: WORLD_SIZE {env.get('WORLD_SIZE')} != replicas {spec.get('replicas')}")
            check(env.get("MASTER_ADDR", "").startswith(f"{w['metadata']['name']}-0.{spec.get('serviceName')}"),
                  f"{where(w)}: MASTER_ADDR {env.get('MASTER_ADDR')} is not pod 0 of the headless Service")
            check(env.get("MASTER_PORT") and int(env["MASTER_PORT"]) in ports.values(), f"{where(w)}: MASTER_PORT not a container port")
            check("RANK" in env or "${HOSTNAME##*-}" in args, f"{where(w)}: RANK is not taken from the pod ordinal")
            shm = next((vm for vm in c.get("volumeMounts", []) if vm["mountPath"] == "/dev/shm"), None)
            check(shm and volumes.get(shm["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
                  f"{where(w)}: /dev/shm must be an emptyDir with medium Memory")
        elif w["kind"] == "Deployment":
            check(pvcs, f"{label}: no PersistentVolumeClaim")
    return True


variants = [("overlays/cpu", False, False), ("overlays/cuda", True, False), ("multi-rank", True, True)]
kubectl = shutil.which("kubectl")
renderers = ["built-in"] + (["kubectl kustomize"] if kubectl else [])
for rel, gpu, multi in variants:
    kdir = os.path.join(deploy, rel)
    check_rendering(f"{rel} (built-in renderer)", render(kdir), gpu, multi)
    if kubectl:
        r = subprocess.run([kubectl, "kustomize", kdir], capture_output=True, text=True)
        if check(r.returncode == 0, f"{rel}: kubectl kustomize failed: {r.stderr.strip()}"):
            check_rendering(f"{rel} (kubectl kustomize)", [d for d in yaml.safe_load_all(r.stdout) if d], gpu, multi)

# --- 4. docker/ agrees with deploy/ ----------------------------------------------------
base_config = json.load(open(os.path.join(deploy, "base", "server.json")))
for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
    text = open(os.path.join(repo, "docker", dockerfile)).read()
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.*)$", text, re.M) for p in line.split()}
    check(exposed == {port_of(base_config["listen"]), port_of(base_config["metrics"]["listen"])},
          f"docker/{dockerfile}: EXPOSE {exposed} != the config's ports")
    check("COPY deploy/base/server.json /etc/streambp/config.json" in text, f"docker/{dockerfile}: does not bake the base config")
    check('ENTRYPOINT ["/usr/local/bin/streambp-server", "serve"]' in text, f"docker/{dockerfile}: ENTRYPOINT is not serve")
    check(re.search(r"^USER 10001", text, re.M), f"docker/{dockerfile}: not a non-root USER")
    check("HEALTHCHECK" in text and "health" in text, f"docker/{dockerfile}: no grpc health HEALTHCHECK")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"PASS: {len(yaml_files)} YAML files parse; {len(variants)} kustomizations checked with "
      f"{' and '.join(renderers)}; ConfigMap configs accepted by --check-config; docker/ agrees"
      + ("" if kubectl else " (kubectl not installed: built-in renderer only)"))
