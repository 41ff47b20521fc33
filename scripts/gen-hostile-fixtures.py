#!/usr/bin/env python3
"""Writes the hostile admission fixtures (fixtures/admission/hostile-*, unreadable-*) from
story1-plain: the inputs of issue 11 that made one small request cost the webhook hundreds of
MiB, and JobSets parts of which cannot be read. Run from the repository root; expected.yaml is
written by hand (see docs/security.md)."""
import copy
import json
import os

ROOT = "fixtures/admission"
base = json.load(open(os.path.join(ROOT, "story1-plain", "request.json")))


def case(name, edit):
    review = copy.deepcopy(base)
    edit(review["request"]["object"])
    os.makedirs(os.path.join(ROOT, name), exist_ok=True)
    with open(os.path.join(ROOT, name, "request.json"), "w") as f:
        json.dump(review, f, separators=(",", ":"))
        f.write("\n")


def zeros(o):
    o["spec"]["replicatedJobs"] = [0] * 65000


def many_jobs(o):
    job = o["spec"]["replicatedJobs"][0]
    jobs = []
    for i in range(1000):
        j = copy.deepcopy(job)
        j["name"] = f"w{i}"
        jobs.append(j)
    o["spec"]["replicatedJobs"] = jobs


def jobs_object(o):
    o["spec"]["replicatedJobs"] = {"workers": o["spec"]["replicatedJobs"][0]}


def containers_string(o):
    o["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"] = "worker"


case("hostile-65000-zeros", zeros)
case("hostile-1000-replicated-jobs", many_jobs)
case("unreadable-replicated-jobs-object", jobs_object)
case("unreadable-containers-string", containers_string)
