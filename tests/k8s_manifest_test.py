#!/usr/bin/env python3
"""The Kubernetes manifests (docker/k8s/) agree with each other and with the repository, with no cluster at hand:
the learner pod runs `scripts/farm learners CONFIG --port P` (a script and a config the image has, an argument list
scripts/farm accepts), its container and the Service open the consecutive ports P, P+1, ... that the learners of a
config with policies bind (the i-th policy's on P + i), every Service port targets one of the container's, and the
workers use the learner's config and reach the Service's name on P. Passes when all hold, for the shipped
manifests; the consecutive-ports check is also run on a broken copy (a gap) and must fail there.
Usage: k8s_manifest_test.py REPO_ROOT
"""
import copy
import os
import re
import shlex
import sys

import yaml


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(items, kind, name):
    found = [d for d in items if d.get("kind") == kind and d["metadata"]["name"] == name]
    if len(found) != 1:
        fail(f"expected one {kind} '{name}', found {len(found)}")
    return found[0]


def check_ports(deployment, service, port):
    """The container's and the Service's ports: P, P+1, ... in order, each Service port aimed at the container's
    port of the same number. Returns an error or None."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    by_name = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    numbers = [p["containerPort"] for p in container.get("ports", [])]
    if numbers != list(range(port, port + len(numbers))) or not numbers:
        return f"the learner container's ports {numbers} are not {port}, {port + 1}, ... (policy i's learner: P + i)"
    served = []
    for p in service["spec"]["ports"]:
        target = p.get("targetPort", p["port"])
        target = by_name.get(target, target)
        if target != p["port"] or target not in numbers:
            return f"Service port {p['port']} targets {p.get('targetPort')}, not the container's port {p['port']}"
        served.append(p["port"])
    if served != numbers:
        return f"the Service's ports {served} differ from the container's {numbers}"
    return None


def main():
    root = sys.argv[1]
    learner = docs(os.path.join(root, "docker/k8s/learner.yaml"))
    worker = docs(os.path.join(root, "docker/k8s/worker.yaml"))
    deployment = one(learner, "Deployment", "farm-learner")
    service = one(learner, "Service", "farm-learner")
    one(learner, "PersistentVolumeClaim", "farm-runs")
    if service["spec"]["selector"] != deployment["spec"]["template"]["metadata"]["labels"]:
        fail("the Service's selector does not select the learner's pod")

    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    if command[:2] != ["scripts/farm", "learners"] or len(command) != 5 or command[3] != "--port":
        fail(f"the learner runs {command}; expected scripts/farm learners CONFIG --port P")
    config, port = command[2], int(command[4])
    for path in ("scripts/farm", config):
        if not os.path.isfile(os.path.join(root, path)):
            fail(f"the learner's command names {path}, which the repository (and so the image) lacks")
    error = check_ports(deployment, service, port)
    if error:
        fail(error)
    # The checker itself: a gap in the ports (a policy's learner with no port) must be caught.
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][1]["containerPort"] += 1
    if check_ports(broken, service, port) is None:
        fail("the port check passed a container whose ports have a gap")

    workers = one(worker, "Deployment", "farm-worker")
    script = workers["spec"]["template"]["spec"]["containers"][0]["command"]
    words = shlex.split(script[-1])
    if words[:2] != ["exec", "farm-worker"]:
        fail(f"the worker pod runs {script}; expected exec farm-worker ...")
    value = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
    if value.get("--config") != config:
        fail(f"the workers' config {value.get('--config')} is not the learner's {config}")
    expected = f"tcp://{service['metadata']['name']}:{port}"
    if value.get("--learner") != expected:
        fail(f"the workers connect to {value.get('--learner')}, not the Service's {expected}")
    if not re.search(r"--index \$\$\(\(", script[-1]):
        fail("the workers' --index is not taken from the pod's name ($$((...)), Kubernetes' escape of $)")
    ports = [p["port"] for p in service["spec"]["ports"]]
    print(f"ok: learner pod runs scripts/farm learners {config} --port {port}; Service {service['metadata']['name']} "
          f"on ports {ports} (up to {len(ports)} policies); workers reach {expected}")


if __name__ == "__main__":
    main()
