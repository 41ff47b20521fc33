#!/usr/bin/env bash
# Checks the monitoring that ships in deploy/: the monitoring component renders with
# `kubectl kustomize` (two ServiceMonitors and the PrometheusRule), its rules pass
# `promtool check rules`, and the cases of tests/monitoring/rules-test.yaml pass
# `promtool test rules` (every alert fires on what should fire it, and only then). The Grafana
# dashboard must be valid JSON with a uid and panels. That the alerts and the dashboard only read
# metrics the binaries export is tests/it/observability.rs (a cargo test).
#
# promtool comes from Debian's `prometheus` package (installed with apt-get, without the
# recommended node exporter, when missing and running as root; its service is not started: this
# machine runs no init). Without it the promtool steps are SKIPPED, loudly, and the script says so
# in its last line. Work files in target/check-monitoring/.
#
# Usage: scripts/check-monitoring.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work="$repo/target/check-monitoring"
rm -rf "$work"
mkdir -p "$work"

start=$(date +%s)
step() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - start))"; }
fail() {
  echo "check-monitoring: FAILED: $*" >&2
  exit 1
}

step "tools"
if ! command -v promtool >/dev/null && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  # policy-rc.d: a package's maintainer scripts must not start services here.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  # shellcheck source=scripts/lib/apt.sh
  source scripts/lib/apt.sh
  if apt_get update -qq &&
    apt_get install -y -qq --no-install-recommends prometheus >"$work/apt.log" 2>&1; then
    echo "installed Debian's prometheus package (for promtool)"
  else
    tail -n 20 "$work/apt.log" >&2 || true
  fi
fi
promtool=$(command -v promtool || true)
[[ -n "$promtool" ]] && "$promtool" --version 2>&1 | sed -n 1p
command -v kubectl >/dev/null || fail "kubectl is missing (its built-in kustomize renders deploy/)"
# PyYAML, for taking the rules out of the PrometheusRule: python3's own, or a virtualenv's.
python=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
  venv="$repo/target/tools-venv"
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "pyyaml==6.0.4"
  python="$venv/bin/python"
fi

step "the monitoring component renders"
mkdir -p "$work/render"
cat >"$work/render/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
components:
- $(realpath --relative-to="$work/render" "$repo/deploy/components/monitoring")
EOF
kubectl kustomize "$work/render" >"$work/monitoring.yaml"
"$python" - "$work/monitoring.yaml" "$work/rules.yaml" <<'PY'
import sys, yaml
objects = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
print("\n".join(kinds))
monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
rules = [o for o in objects if o["kind"] == "PrometheusRule"]
assert len(monitors) == 2 and len(rules) == 1, kinds
for o in objects:
    assert o["metadata"]["namespace"] == "jobset-inplace-system", o["metadata"]
    assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "jobset-inplace", o["metadata"]
for m in monitors:
    assert [e["port"] for e in m["spec"]["endpoints"]] == ["metrics"], m["spec"]
# The rules file promtool reads: the PrometheusRule's spec (groups) as it is.
yaml.safe_dump(rules[0]["spec"], open(sys.argv[2], "w"), sort_keys=False)
groups = rules[0]["spec"]["groups"]
print(f"{sum(len(g['rules']) for g in groups)} rules in {len(groups)} groups")
PY

step "the dashboard is well-formed"
"$python" - deploy/grafana/jobset-inplace.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["uid"] and d["title"], "uid and title"
panels = [p for p in d["panels"] if p["type"] != "row"]
exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
assert panels and all(e.strip() for e in exprs)
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), "panel ids repeat"
print(f"{len(panels)} panels, {len(exprs)} queries")
PY

if [[ -z "$promtool" ]]; then
  step "promtool"
  echo "check-monitoring: promtool SKIPPED: not on PATH and Debian's prometheus package could not be installed" >&2
  echo "check-monitoring: rendered and the dashboard checked; promtool check/test rules SKIPPED"
  exit 0
fi

step "promtool check rules"
"$promtool" check rules "$work/rules.yaml"

step "promtool test rules (tests/monitoring/rules-test.yaml)"
cp tests/monitoring/rules-test.yaml "$work/"
"$promtool" test rules "$work/rules-test.yaml"

step "monitoring checks passed"
