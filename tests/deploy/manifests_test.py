#!/usr/bin/env python3
"""Offline validation of deploy/ (kustomize) and its agreement with the server and docker/.

Every YAML file parses; every kustomization is rendered (by a small built-in renderer of
the kustomize features deploy/ uses, and also by `kubectl kustomize` when kubectl is
installed) and the rendered objects are checked: required fields, selectors that match,
native gRPC probes on the port the config listens on, the metrics port, a grace period
longer than drain + checkpoint, the PVC, GPUs (and their tolerations) for the CUDA variants,
the multi-rank StatefulSet's rendezvous layout (RANK from the pod-index label), the same
hardening on every pod (non-root, RuntimeDefault seccomp, read-only root, no privilege
escalation, no capabilities), a PodDisruptionBudget per workload, Prometheus scrape
annotations only where /metrics is served, the model volume and the components that fill it
(deploy/components, each composed with the overlays), and the config each ConfigMap carries
plus the container's flags is accepted by `streambp-server serve ... --check-config`.
docker/ and .dockerignore are checked against deploy/ and for pinned, labelled, verified builds.

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
            if v is None:
                out.pop(k, None)  # `key: null` deletes the key
            else:
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
    directories), components, labels, configMapGenerator (files; behavior replace), images,
    patches (by the patch's kind and name, or by a target's kind/name).
    ConfigMaps keep their plain names (kustomize adds a content hash; see names())."""
    k = yaml.safe_load(open(os.path.join(kdir, "kustomization.yaml")))
    objs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(kdir, r))
        objs += render(p) if os.path.isdir(p) else [d for d in yaml.safe_load_all(open(p)) if d]
    layers = [(kdir, k)] + [(os.path.normpath(os.path.join(kdir, c)), None) for c in k.get("components", [])]
    for ldir, lk in layers:
        if lk is None:  # a Component: its resources, generators and patches apply to what is here
            lk = yaml.safe_load(open(os.path.join(ldir, "kustomization.yaml")))
            check(lk.get("kind") == "Component", f"{ldir}: listed in components but kind is {lk.get('kind')}")
            for r in lk.get("resources", []):
                objs += [d for d in yaml.safe_load_all(open(os.path.join(ldir, r))) if d]
        for g in lk.get("configMapGenerator", []):
            data = {os.path.basename(f): open(os.path.join(ldir, f)).read() for f in g.get("files", [])}
            cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data}
            if g.get("behavior") == "replace":
                objs = [o for o in objs if not (o["kind"] == "ConfigMap" and o["metadata"]["name"] == g["name"])]
            objs.append(cm)
        for p in lk.get("patches", []):
            patch = yaml.safe_load(open(os.path.join(ldir, p["path"])))
            target = p.get("target") or {"kind": patch["kind"], "name": patch["metadata"]["name"]}
            for i, o in enumerate(objs):
                if all(re.fullmatch(target[f], o["kind"] if f == "kind" else o["metadata"]["name"])
                       for f in ("kind", "name") if f in target):
                    objs[i] = merge(o, {kk: v for kk, v in patch.items() if kk not in ("apiVersion", "kind", "metadata")})
    for lab in k.get("labels", []):
        for o in objs:
            o.setdefault("metadata", {}).setdefault("labels", {}).update(lab["pairs"])
    for img in k.get("images", []):
        for o in objs:
            for c in containers(o) + init_containers(o):
                if c.get("image", "").split(":")[0] == img["name"]:
                    tag = img.get("newTag", c["image"].split(":")[1] if ":" in c["image"] else None)
                    c["image"] = img.get("newName", img["name"]) + (":" + tag if tag else "")
    return copy.deepcopy(objs)


def containers(o):
    return o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []) if o.get("kind") in (
        "Deployment", "StatefulSet") else []


def init_containers(o):
    return o.get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", []) if o.get("kind") in (
        "Deployment", "StatefulSet") else []


def check_hardened(where, pod, containers_):
    """The pod and every container in it (init containers too) run as the single server does."""
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, f"{where}: not runAsNonRoot")
    check(psc.get("runAsUser", 0) != 0, f"{where}: runAsUser must be a non-root uid")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: seccompProfile is not RuntimeDefault")
    for c in containers_:
        sc = c.get("securityContext", {})
        name = f"{where} container {c.get('name')}"
        check(sc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation is not false")
        check(sc.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem is not true")
        check("ALL" in sc.get("capabilities", {}).get("drop", []), f"{name}: capabilities do not drop ALL")
        check(not sc.get("privileged"), f"{name}: privileged")
        check(sc.get("runAsUser", 1) != 0, f"{name}: runs as root")


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
        # The image's ENTRYPOINT is `streambp-server serve`: the container's args are its flags.
        check(not c.get("command"), f"{where(w)}: overrides the image's ENTRYPOINT (command: {c.get('command')})")
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(config_text)
        flags = [f.name if a == config_path else a for a in c.get("args", [])]
        # The model folder and the GPU are the pod's, not this machine's: keys and values only.
        r = subprocess.run([server_bin, "serve", *flags, "--check-config", "--no-model-check"],
                           capture_output=True, text=True)
        os.unlink(f.name)
        check(r.returncode == 0 and "config OK" in r.stderr,
              f"{where(w)}: streambp-server serve {' '.join(c.get('args', []))} --check-config refused "
              f"ConfigMap {cm_name}/{key}: {r.stderr.strip()}")
        effective = json.loads(r.stdout) if r.returncode == 0 else config
        check_hardened(where(w), pod, pod["containers"] + pod.get("initContainers", []))
        mounts = {vm["mountPath"]: vm for vm in c.get("volumeMounts", [])}
        if check("/tmp" in mounts, f"{where(w)}: read-only root filesystem without a /tmp volume"):
            check("emptyDir" in volumes.get(mounts["/tmp"]["name"], {}), f"{where(w)}: /tmp is not an emptyDir")
        # The model volume: real weights come in at /models (read-only for the server).
        model_mount = mounts.get("/models")
        if check(model_mount and model_mount["name"] == "model" and model_mount.get("readOnly") is True,
                 f"{where(w)}: no read-only volume 'model' at /models"):
            model_vol = volumes.get("model", {})
            sources = [k for k in model_vol if k != "name"]
            check(len(sources) == 1, f"{where(w)}: volume model has sources {sources}")
            claim = model_vol.get("persistentVolumeClaim", {}).get("claimName")
            check(not claim or claim in pvcs, f"{where(w)}: volume model claims {claim}, not in the rendering")
            fillers = [ic for ic in pod.get("initContainers", [])
                       if any(vm["name"] == "model" and not vm.get("readOnly") for vm in ic.get("volumeMounts", []))]
            for ic in fillers:
                check(":" in ic.get("image", ""), f"{where(w)}: init container {ic['name']} image {ic.get('image')} has no tag")
                check("emptyDir" in model_vol and model_vol["emptyDir"].get("sizeLimit"),
                      f"{where(w)}: init container {ic['name']} fills volume model, which is not a sized emptyDir")
            model_dir = effective.get("model", {}).get("dir", "")
            if model_dir:
                check(model_dir == "/models" or model_dir.startswith("/models/"),
                      f"{where(w)}: model.dir {model_dir} is not on the model volume")
                check(claim or fillers, f"{where(w)}: --model {model_dir} on an empty volume (no claim, no init container)")
        grpc_port = port_of(config.get("listen", "127.0.0.1:50051"))
        check(config.get("listen", "").startswith("0.0.0.0:"), f"{where(w)}: listen must be 0.0.0.0:<port> in a pod")
        check(ports.get("grpc") == grpc_port, f"{where(w)}: container port grpc {ports.get('grpc')} != config listen port {grpc_port}")
        metrics = config.get("metrics", {}).get("listen", "")
        if check(metrics, f"{where(w)}: metrics are off in the config"):
            check(ports.get("metrics") == port_of(metrics), f"{where(w)}: container port metrics != config metrics.listen")
            check_scraping(label, objs, w, port_of(metrics), multi_rank)
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
            check(any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" and t.get("effect") in (None, "NoSchedule")
                      for t in pod.get("tolerations", [])), f"{where(w)}: does not tolerate the nvidia.com/gpu taint")
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
            env_from = {e["name"]: e.get("valueFrom", {}) for e in c.get("env", [])}
            check(env_from.get("RANK", {}).get("fieldRef", {}).get("fieldPath") ==
                  "metadata.labels['apps.kubernetes.io/pod-index']",
                  f"{where(w)}: RANK must come from the pod label apps.kubernetes.io/pod-index (downward API)")
            check("HOSTNAME" not in args, f"{where(w)}: the rank is parsed from the hostname")
            if gpus and int(gpus) == 1:
                check(env.get("LOCAL_RANK") == "0", f"{where(w)}: one GPU per pod needs LOCAL_RANK=0 "
                      "(model.device cuda means cuda:LOCAL_RANK, and LOCAL_RANK defaults to RANK)")
            check(env.get("WORLD_SIZE") == str(spec.get("replicas")),
                  f"{where(w)}: WORLD_SIZE {env.get('WORLD_SIZE')} != replicas {spec.get('replicas')}")
            # Context parallel splits each sequence over P ranks; WORLD_SIZE = replicas = D x P
            # (D data-parallel groups of P).
            cp = config.get("parallel", {}).get("context_parallel", 1)
            world = int(env.get("WORLD_SIZE") or 0)
            check(cp == 1 or (world > 0 and world % int(cp) == 0),
                  f"{where(w)}: parallel.context_parallel {cp} does not divide WORLD_SIZE {env.get('WORLD_SIZE')}")
            check(("context-parallel" in label) == (cp > 1),
                  f"{where(w)}: parallel.context_parallel {cp} in {label.split(' ')[0]}")
            check(cp == 1 or config.get("trainer", {}).get("engine", {}).get("kind", "stream") == "stream",
                  f"{where(w)}: context parallel runs the stream engine only")
            check(env.get("MASTER_ADDR", "").startswith(f"{w['metadata']['name']}-0.{spec.get('serviceName')}"),
                  f"{where(w)}: MASTER_ADDR {env.get('MASTER_ADDR')} is not pod 0 of the headless Service")
            check(env.get("MASTER_PORT") and int(env["MASTER_PORT"]) in ports.values(), f"{where(w)}: MASTER_PORT not a container port")
            shm = next((vm for vm in c.get("volumeMounts", []) if vm["mountPath"] == "/dev/shm"), None)
            check(shm and volumes.get(shm["name"], {}).get("emptyDir", {}).get("medium") == "Memory",
                  f"{where(w)}: /dev/shm must be an emptyDir with medium Memory")
        elif w["kind"] == "Deployment":
            check(pvcs, f"{label}: no PersistentVolumeClaim")
        check_pdb(label, objs, w)
    return True


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_pdb(label, objs, w):
    """One PodDisruptionBudget covers exactly the workload's pods and lets no voluntary eviction
    take one while the trainer is healthy (every rank is needed for every step)."""
    tmpl_labels = w["spec"]["template"]["metadata"].get("labels", {})
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    mine = [p for p in pdbs if selects(p["spec"].get("selector", {}).get("matchLabels", {}), tmpl_labels)]
    if not check(len(mine) == 1, f"{label}: {len(mine)} PodDisruptionBudgets select {w['kind']}/{w['metadata']['name']}"):
        return
    p = mine[0]
    where = f"{label}: PodDisruptionBudget/{p['metadata']['name']}"
    check(p["apiVersion"] == "policy/v1", f"{where}: apiVersion {p['apiVersion']} (policy/v1)")
    check(p["spec"]["selector"]["matchLabels"] == w["spec"]["selector"]["matchLabels"],
          f"{where}: selector differs from the workload's")
    replicas = w["spec"].get("replicas", 1)
    check(p["spec"].get("maxUnavailable") == 0 or p["spec"].get("minAvailable") == replicas,
          f"{where}: allows evicting a trainer pod (maxUnavailable {p['spec'].get('maxUnavailable')}, "
          f"minAvailable {p['spec'].get('minAvailable')}, replicas {replicas})")
    check(p["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow",
          f"{where}: unhealthyPodEvictionPolicy must be AlwaysAllow (a broken pod must not block drains)")
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet") and o is not w:
            check(not selects(p["spec"]["selector"]["matchLabels"], o["spec"]["template"]["metadata"].get("labels", {})),
                  f"{where}: also selects {o['kind']}/{o['metadata']['name']}")


def check_scraping(label, objs, w, metrics_port, multi_rank):
    """prometheus.io annotations only where /metrics is served: on the pods of a single server;
    for multi-rank (only rank 0 serves it) on a Service that selects rank 0 alone. Exactly one
    of the two, so nothing is scraped twice."""
    name = f"{label}: {w['kind']}/{w['metadata']['name']}"
    ann = w["spec"]["template"]["metadata"].get("annotations", {})
    tmpl_labels = w["spec"]["template"]["metadata"].get("labels", {})
    pod_scraped = ann.get("prometheus.io/scrape") == "true"
    services = [s for s in objs if s["kind"] == "Service"
                and s["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"
                and selects({k: v for k, v in s["spec"].get("selector", {}).items()
                             if not k.startswith("statefulset.kubernetes.io/")}, tmpl_labels)]
    check(pod_scraped + len(services) == 1,
          f"{name}: /metrics must be scraped exactly once (pod annotations: {pod_scraped}, "
          f"annotated Services: {[s['metadata']['name'] for s in services]})")
    if multi_rank:
        check(not pod_scraped, f"{name}: prometheus.io/scrape on every rank, but ranks > 0 serve no /metrics")
        for s in services:
            sel = s["spec"]["selector"]
            check(sel.get("statefulset.kubernetes.io/pod-name") == f"{w['metadata']['name']}-0",
                  f"{label}: Service/{s['metadata']['name']} is scraped but selects more than rank 0")
    for holder, a in ([("pod template", ann)] if pod_scraped else []) + [
            (f"Service/{s['metadata']['name']}", s["metadata"]["annotations"]) for s in services]:
        check(a.get("prometheus.io/port") == str(metrics_port), f"{name}: {holder} prometheus.io/port != {metrics_port}")
        check(a.get("prometheus.io/path", "/metrics") == "/metrics", f"{name}: {holder} prometheus.io/path")
    for s in services:
        check(any(sp.get("targetPort") in ("metrics", metrics_port) for sp in s["spec"]["ports"]),
              f"{label}: Service/{s['metadata']['name']} is scraped but has no port to the metrics port")


variants = [("overlays/cpu", False, False), ("overlays/cuda", True, False), ("multi-rank", True, True),
            ("overlays/context-parallel", True, True)]
# The components that bring real weights (deploy/components), each composed with the overlays the
# way docs/operations.md tells a user to: a kustomization of their own with resources + components.
compositions = [("overlays/cpu", "model-pvc", False, False), ("overlays/cuda", "model-pvc", True, False),
                ("overlays/cuda", "model-from-image", True, False), ("multi-rank", "model-from-image", True, True),
                ("multi-rank", "model-pvc", True, True)]
kubectl = shutil.which("kubectl")
renderers = ["built-in"] + (["kubectl kustomize"] if kubectl else [])
workdir = tempfile.mkdtemp(prefix="streambp-deploy-test-")
targets = [(rel, os.path.join(deploy, rel), gpu, multi, None) for rel, gpu, multi in variants]
for i, (rel, component, gpu, multi) in enumerate(compositions):
    kdir = os.path.join(workdir, f"composed-{i}")
    os.makedirs(kdir)
    with open(os.path.join(kdir, "kustomization.yaml"), "w") as f:
        # kustomize takes relative paths only; images: as a user names their model image.
        yaml.safe_dump({"resources": [os.path.relpath(os.path.join(deploy, rel), kdir)],
                        "components": [os.path.relpath(os.path.join(deploy, "components", component), kdir)],
                        "images": [{"name": "streambp-model", "newName": "registry.example.com/qwen3-4b",
                                    "newTag": "1"}]}, f)
    targets.append((f"{rel} + components/{component}", kdir, gpu, multi, component))
for label, kdir, gpu, multi, component in targets:
    rendered = {"built-in renderer": render(kdir)}
    if kubectl:
        r = subprocess.run([kubectl, "kustomize", kdir], capture_output=True, text=True)
        if check(r.returncode == 0, f"{label}: kubectl kustomize failed: {r.stderr.strip()}"):
            rendered["kubectl kustomize"] = [d for d in yaml.safe_load_all(r.stdout) if d]
    for renderer, objs in rendered.items():
        check_rendering(f"{label} ({renderer})", objs, gpu, multi)
        if component:  # the component did its job: the server reads the weights from /models
            w = next(o for o in objs if o["kind"] in ("Deployment", "StatefulSet"))
            pod = w["spec"]["template"]["spec"]
            args = pod["containers"][0].get("args", [])
            check("--model" in args and args[args.index("--model") + 1] == "/models",
                  f"{label} ({renderer}): the server does not run with --model /models: {args}")
            model_vol = next((v for v in pod.get("volumes", []) if v["name"] == "model"), {})
            if component == "model-pvc":
                check(model_vol.get("persistentVolumeClaim", {}).get("readOnly") is True,
                      f"{label} ({renderer}): volume model is not the read-only claim: {model_vol}")
            else:
                ic = pod.get("initContainers", [])
                check(len(ic) == 1 and ic[0]["image"] == "registry.example.com/qwen3-4b:1",
                      f"{label} ({renderer}): the init container does not run the named model image: {ic}")
shutil.rmtree(workdir)

# The loader pod of components/model-pvc (applied by hand, outside the kustomization).
loader = yaml.safe_load(open(os.path.join(deploy, "components", "model-pvc", "loader-pod.yaml")))
claim = yaml.safe_load(open(os.path.join(deploy, "components", "model-pvc", "pvc.yaml")))["metadata"]["name"]
check_hardened("components/model-pvc/loader-pod.yaml", loader["spec"], loader["spec"]["containers"])
check(any(v.get("persistentVolumeClaim", {}).get("claimName") == claim for v in loader["spec"]["volumes"]),
      f"components/model-pvc/loader-pod.yaml does not mount the claim {claim}")
check(loader["spec"]["securityContext"].get("runAsUser") == 10001,
      "components/model-pvc/loader-pod.yaml must write as the trainer's uid 10001")


# --- 4. docker/ agrees with deploy/ and is pinned --------------------------------------
def dockerfile_arg_defaults(text):
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", text, re.M))


def run_instruction(text, needle):
    """The shell of the first RUN instruction containing `needle` (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", text)
    return next((line[4:] for line in joined.split("\n") if line.startswith("RUN ") and needle in line), None)


def guard_accepts(script, env):
    """Runs a Dockerfile guard (a RUN's shell) with build arguments as the environment."""
    r = subprocess.run(["sh", "-c", script], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


versions = dict(line.split("=", 1) for line in open(os.path.join(repo, "docker", "versions.env")).read().splitlines()
                if line and not line.startswith("#"))
project_version = re.search(r"project\(\S+\s+VERSION\s+(\S+)", open(os.path.join(repo, "CMakeLists.txt")).read()).group(1)
good_digest = "@sha256:" + "0123456789abcdef" * 4
base_config = json.load(open(os.path.join(deploy, "base", "server.json")))
for dockerfile, base_args in (("Dockerfile", ["DEBIAN_IMAGE"]), ("Dockerfile.cuda", ["CUDA_BUILD_IMAGE", "CUDA_RUNTIME_IMAGE"])):
    text = open(os.path.join(repo, "docker", dockerfile)).read()
    where = f"docker/{dockerfile}"
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.*)$", text, re.M) for p in line.split()}
    check(exposed == {port_of(base_config["listen"]), port_of(base_config["metrics"]["listen"])},
          f"{where}: EXPOSE {exposed} != the config's ports")
    check("COPY deploy/base/server.json /etc/streambp/config.json" in text, f"{where}: does not bake the base config")
    check('ENTRYPOINT ["/usr/local/bin/streambp-server", "serve"]' in text, f"{where}: ENTRYPOINT is not serve")
    check(re.search(r"^USER 10001", text, re.M), f"{where}: not a non-root USER")
    check("HEALTHCHECK" in text and "health" in text, f"{where}: no grpc health HEALTHCHECK")
    # Every FROM is a pinned base (an ARG whose default has a digest) or an earlier stage.
    defaults = dockerfile_arg_defaults(text)
    for ref in re.findall(r"^FROM (\S+)", text, re.M):
        arg = re.fullmatch(r"\$\{(\w+)\}", ref)
        check(arg and arg.group(1) in base_args, f"{where}: FROM {ref} is not one of the pinned base arguments {base_args}")
    for a in base_args:
        check(re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", defaults.get(a, "")),
              f"{where}: ARG {a} default {defaults.get(a)!r} is not pinned by digest")
        check(versions.get(a) == defaults.get(a), f"{where}: ARG {a} default differs from docker/versions.env")
    guard = run_instruction(text, "is not pinned by digest")
    if check(guard, f"{where}: no RUN refuses an unpinned base image"):
        pinned = {a: "example/base:1" + good_digest for a in base_args}
        check(guard_accepts(guard, pinned)[0], f"{where}: the digest guard refuses pinned bases")
        for a in base_args:
            ok, err = guard_accepts(guard, {**pinned, a: "example/base:1"})
            check(not ok and "not pinned" in err, f"{where}: the digest guard accepts {a}=example/base:1 (a bare tag)")
    # OCI labels, from build arguments where they vary.
    for key in ("title", "description", "source", "licenses", "version", "revision"):
        check(re.search(rf"org\.opencontainers\.image\.{key}=\S", text), f"{where}: no org.opencontainers.image.{key} label")
    check('org.opencontainers.image.licenses="Apache-2.0"' in text, f"{where}: licenses label is not Apache-2.0")
    for key, arg in (("version", "VERSION"), ("revision", "REVISION"), ("source", "SOURCE")):
        check(f'org.opencontainers.image.{key}="${{{arg}}}"' in text, f"{where}: the {key} label is not the build argument {arg}")
    check(defaults.get("VERSION") == project_version,
          f"{where}: ARG VERSION={defaults.get('VERSION')} != the CMake project version {project_version}")
    check("COPY LICENSE " in text, f"{where}: the image does not carry the LICENSE")
    for a, v in versions.items():
        if a in defaults and a != "LIBTORCH_SHA256":
            check(defaults[a] == v, f"{where}: ARG {a}={defaults[a]} but docker/versions.env has {v}")

# The CUDA image verifies the LibTorch zip, and a missing checksum stops the build.
cuda = open(os.path.join(repo, "docker", "Dockerfile.cuda")).read()
check(re.search(r'echo "\$\{LIBTORCH_SHA256\}  /tmp/libtorch\.zip" \| sha256sum -c -', cuda) and
      not re.search(r"if \[ -n \"\$\{LIBTORCH_SHA256\}\" \]", cuda),
      "docker/Dockerfile.cuda: the LibTorch zip is not always checked against LIBTORCH_SHA256")
check(re.search(r"^ARG LIBTORCH_SHA256$", cuda, re.M), "docker/Dockerfile.cuda: LIBTORCH_SHA256 must have no default")
sha_guard = run_instruction(cuda, "is not a SHA-256")
if check(sha_guard, "docker/Dockerfile.cuda: no RUN refuses an empty LIBTORCH_SHA256"):
    env = {"LIBTORCH_VERSION": versions["LIBTORCH_VERSION"], "LIBTORCH_CUDA": versions["LIBTORCH_CUDA"]}
    for bad in ("", "abc", "G" * 64):
        ok, err = guard_accepts(sha_guard, {**env, "LIBTORCH_SHA256": bad})
        check(not ok and "sha256sum" in err, f"docker/Dockerfile.cuda: LIBTORCH_SHA256={bad!r} is accepted")
    check(guard_accepts(sha_guard, {**env, "LIBTORCH_SHA256": "0123456789abcdef" * 4})[0],
          "docker/Dockerfile.cuda: a well-formed LIBTORCH_SHA256 is refused")
check(versions.get("LIBTORCH_SHA256") == "" or re.fullmatch(r"[0-9a-f]{64}", versions.get("LIBTORCH_SHA256", "")),
      "docker/versions.env: LIBTORCH_SHA256 is neither empty (unknown) nor a SHA-256")

# .dockerignore keeps local builds, caches and installs out of the build context.
ignored = [line.strip() for line in open(os.path.join(repo, ".dockerignore")) if line.strip() and not line.startswith("#")]
for need in ("build/", "**/node_modules/", "**/.venv/", "**/__pycache__/", ".git/"):
    check(need in ignored, f".dockerignore does not exclude {need}")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"PASS: {len(yaml_files)} YAML files parse; {len(variants)} kustomizations and {len(compositions)} "
      f"compositions with deploy/components checked with {' and '.join(renderers)} (hardening, PDBs, scraping, "
      "model volume); ConfigMap configs accepted by --check-config; docker/ agrees and is pinned"
      + ("" if kubectl else " (kubectl not installed: built-in renderer only)"))
