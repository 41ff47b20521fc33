#!/usr/bin/env bash
# deploy/'s objects come from one source, the Helm chart charts/jobset-inplace: every file of
# deploy/ that holds objects the chart also renders is `helm template` of one chart template with
# fixed values (the table below), with what only Helm adds taken out (its four labels and the
# pods' checksum/config annotation; the part-of label stays, kustomize adds the same). Each such
# file starts with a header saying so. What stays hand-written in deploy/ has no copy in the
# chart: the kustomizations, the patches that select a variant (components/self-signed/webhook.yaml,
# components/cert-manager/inject-ca.yaml, the attempt dialect's and overlays/jobset-native's JSON
# patches), base/namespace.yaml, base/image-fields.yaml, components/epoch-status-fields/.
# tests/helm/ renders them again and fails, naming the first differing file and line, while a
# tracked file differs from its rendering (a hand edit of a generated file, or a chart change not
# rendered).
#
#   scripts/render-deploy.sh             (re)write the generated files of deploy/
#   scripts/render-deploy.sh --out DIR   write them under DIR instead (DIR/base/..., as in deploy/)
#   scripts/render-deploy.sh --list      print the generated files (paths relative to deploy/)
#
# Env: HELM, the helm binary (default: scripts/helm.sh build's, helm built from its pinned Go module).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

# deploy/PATH  chart template (`:KEY`: only that key of the ConfigMap's data)  values besides the defaults
table=(
  "base/agent-policy.yaml                        agent-policy.yaml"
  "base/agent-rbac.yaml                          agent-rbac.yaml"
  "base/config.yaml                              config.yaml:config.yaml"
  "base/flowcontrol.yaml                         flowcontrol.yaml"
  "base/jobsetepoch-crd.yaml                     jobsetepoch-crd.yaml                crds.keep=false"
  "base/metrics-rbac.yaml                        metrics-rbac.yaml"
  "base/metrics-services.yaml                    metrics-services.yaml"
  "base/reconciler-policy.yaml                   reconciler-policy.yaml"
  "base/reconciler-rbac.yaml                     reconciler-rbac.yaml"
  "base/reconciler.yaml                          reconciler.yaml"
  "base/webhook-configurations.yaml              webhook-configurations.yaml"
  "base/webhook-rbac.yaml                        webhook-rbac.yaml"
  "base/webhook.yaml                             webhook.yaml                        certificates=cert-manager"
  "components/attempt-dialect/config.yaml        config.yaml:config.yaml             dialect=jobset-native"
  "components/cert-manager/certificates.yaml     cert-manager-certificates.yaml      certificates=cert-manager"
  "components/monitoring/prometheusrule.yaml     prometheusrule.yaml                 metrics.prometheusRule.enabled=true"
  "components/monitoring/servicemonitors.yaml    servicemonitors.yaml                metrics.serviceMonitor.enabled=true"
  "components/network-policy/network-policy.yaml network-policy.yaml                 networkPolicy.enabled=true"
  "components/self-signed/ca-bundle-policy.yaml  self-signed-ca-bundle-policy.yaml"
  "components/self-signed/rbac.yaml              self-signed-rbac.yaml"
  "components/self-signed/secret-policy.yaml     self-signed-secret-policy.yaml"
)

die() {
  echo "render-deploy: $*" >&2
  exit 1
}

out="$repo/deploy"
case "${1:-}" in
  "") ;;
  --out)
    [[ $# -eq 2 && -n "$2" ]] || die "usage: --out DIR"
    out=$2
    ;;
  --list)
    for row in "${table[@]}"; do
      read -r path _ <<<"$row"
      echo "$path"
    done
    exit 0
    ;;
  *) die "unknown option $1 (--out DIR, --list)" ;;
esac

helm=${HELM:-}
if [[ -z "$helm" ]]; then
  helm=$(scripts/helm.sh build | tail -n 1) || die "scripts/helm.sh build failed"
fi

# Reads `helm template --show-only` of one template on stdin; writes the generated file: the
# header (argv[1]), then the objects without Helm's source lines, labels and checksum, in the
# template's order (argv[3]; helm sorts them by kind); or, with a key (argv[2]), only that key of
# the ConfigMap's data, a block scalar.
filter() {
  python3 -c '
import re, sys
header, key, template = sys.argv[1], sys.argv[2], sys.argv[3]
lines = sys.stdin.read().split("\n")
if key:
    start = next(i for i, l in enumerate(lines) if l.strip() == key + ": |")
    indent = len(lines[start]) - len(lines[start].lstrip()) + 2
    body = []
    for l in lines[start + 1:]:
        if l.strip() and len(l) - len(l.lstrip()) < indent:
            break
        body.append(l[indent:])
    while body and not body[-1]:
        body.pop()
    sys.stdout.write(header + "\n".join(body) + "\n")
    sys.exit(0)

def documents(lines):
    docs = [[]]
    for l in lines:
        if l == "---":
            docs.append([])
        else:
            docs[-1].append(l)
    return [d for d in docs if any(x.strip() and not x.startswith("#") for x in d)]

def identity(doc):
    kind = next((m.group(1) for m in map(re.compile(r"kind: (\S+)$").match, doc) if m), "")
    name = next((m.group(1) for m in map(re.compile(r"  name: (\S+)$").match, doc) if m), "")
    return kind, name

order = [identity(d) for d in documents(open(template).read().split("\n"))]
helm_only = re.compile(r"\s*(app\.kubernetes\.io/(instance|managed-by|version)|helm\.sh/chart|checksum/config): ")
docs = documents([l for l in lines if not helm_only.match(l) and not l.startswith("# Source: ")])
docs.sort(key=lambda d: order.index(identity(d)) if identity(d) in order else len(order))
out = []
for doc in docs:
    if out:
        out.append("---")
    for i, l in enumerate(doc):
        # A labels: or annotations: key left with nothing under it goes too.
        m = re.fullmatch(r"(\s*)(labels|annotations):", l)
        if m:
            rest = [n for n in doc[i + 1:] if n.strip() and not n.lstrip().startswith("#")]
            if not rest or len(rest[0]) - len(rest[0].lstrip()) <= len(m.group(1)):
                continue
        out.append(l.rstrip())
    while out and not out[-1]:
        out.pop()
sys.stdout.write(header + "\n".join(out) + "\n")
' "$@"
}

for row in "${table[@]}"; do
  read -r path template sets <<<"$row"
  key=""
  if [[ "$template" == *:* ]]; then
    key=${template#*:}
    template=${template%%:*}
  fi
  args=()
  for s in $sets; do args+=(--set "$s"); done
  values="the defaults"
  [[ -z "$sets" ]] || values=${sets// /, }
  header="# Generated from charts/jobset-inplace/templates/$template (values: $values) by
# scripts/render-deploy.sh: do not edit; change the chart and run it (tests/helm/ checks).
"
  err=$(mktemp)
  rendered=$("$helm" template jobset-inplace charts/jobset-inplace --namespace jobset-inplace-system \
    --show-only "templates/$template" "${args[@]}" 2>"$err") || {
    cat "$err" >&2
    rm -f "$err"
    die "helm template --show-only templates/$template failed"
  }
  rm -f "$err"
  mkdir -p "$(dirname "$out/$path")"
  filter "$header" "$key" "charts/jobset-inplace/templates/$template" <<<"$rendered" >"$out/$path"
done
echo "render-deploy: ${#table[@]} files of $out rendered from charts/jobset-inplace" >&2
