#!/usr/bin/env python3
"""Validates every object of Kubernetes manifests against a Kubernetes version's schema.

Built-in kinds: against the OpenAPI schema of that version that the PyPI package
kubernetes-validate carries, in strict mode (an unknown field is an error). Instances of custom
resources: against the openAPIV3Schema of their CustomResourceDefinition when one is at hand (in
the manifests themselves or given with --crd); otherwise skipped, with the reason printed. Run by
scripts/dist.sh with the virtualenv's python.

Usage: validate-manifests.py --kubernetes 1.35 [--crd CRD.yaml]... MANIFEST.yaml...
Exits 1 when an object is invalid; prints one line per object.
"""

import argparse
import sys

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kv
import yaml


def load(path):
    with open(path) as f:
        return [o for o in yaml.safe_load_all(f) if o]


def crd_schemas(objects):
    """(group, version, kind) -> openAPIV3Schema of every CRD among `objects`."""
    out = {}
    for o in objects:
        if o.get("kind") != "CustomResourceDefinition":
            continue
        spec = o["spec"]
        for v in spec.get("versions", []):
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if schema:
                out[(spec["group"], v["name"], spec["names"]["kind"])] = schema
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubernetes", required=True, help="e.g. 1.35")
    parser.add_argument("--crd", action="append", default=[])
    parser.add_argument("manifests", nargs="+")
    args = parser.parse_args()

    def key(v):
        return tuple(int(p) for p in v.split("."))

    known = sorted({kv.major_minor(v) for v in kv.all_versions()}, key=key)
    if kv.major_minor(args.kubernetes) not in known:
        newest = known[-1]
        print(
            f"kubernetes-validate {kubernetes_validate.__version__} has no schemas for "
            f"{args.kubernetes}: validating against the newest it has, {newest}"
        )
        args.kubernetes = newest
    print(f"Kubernetes {args.kubernetes} schemas of kubernetes-validate "
          f"{kubernetes_validate.__version__}")

    extra_crds = {}
    for path in args.crd:
        extra_crds.update(crd_schemas(load(path)))

    failed = 0
    for path in args.manifests:
        objects = load(path)
        crds = dict(extra_crds)
        crds.update(crd_schemas(objects))
        counts = {"valid": 0, "skipped": 0, "invalid": 0}
        for o in objects:
            kind = o.get("kind", "?")
            name = (o.get("metadata") or {}).get("name", "?")
            what = f"{path}: {kind} {name}"
            group, _, version = o.get("apiVersion", "").rpartition("/")
            try:
                kv.validate(o, args.kubernetes, strict=True)
                counts["valid"] += 1
                continue
            except kv.ValidationError as e:
                failed += 1
                counts["invalid"] += 1
                print(f"INVALID {what}: {e.message} (at {'.'.join(map(str, e.path))})")
                continue
            except kv.SchemaNotFoundError:
                pass
            schema = crds.get((group, version, kind))
            if schema is None:
                counts["skipped"] += 1
                print(f"skipped {what}: a custom resource ({o.get('apiVersion')}) whose "
                      "CustomResourceDefinition is not in the repository")
                continue
            # The CRD's structural schema as JSON Schema (x-kubernetes-* keys are ignored);
            # apiVersion, kind and metadata are the API server's and checked by it.
            errors = sorted(
                jsonschema.Draft7Validator(schema).iter_errors(o), key=lambda e: list(e.path)
            )
            if errors:
                failed += 1
                counts["invalid"] += 1
                for e in errors:
                    print(f"INVALID {what} (its CRD's schema): {e.message} "
                          f"(at {'.'.join(map(str, e.path))})")
            else:
                counts["valid"] += 1
                print(f"valid   {what} (against its CustomResourceDefinition)")
        print(f"{path}: {counts['valid']} valid, {counts['skipped']} skipped, "
              f"{counts['invalid']} invalid")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
