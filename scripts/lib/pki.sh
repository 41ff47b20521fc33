# shellcheck shell=bash
# The throwaway PKI of scripts/control-plane.sh (sourced by it): the CA, the API server's serving
# certificate, the admin's client certificate, JobSet's and the addons' webhook serving
# certificates, the service-account signing keys, the nodes' client certificates, and kubeconfigs
# naming them. All under DIR/pki, valid 2 days.
#
# Needs: openssl, base64; functions node_dirs, node_load (scripts/lib/node-network.sh; node_pki
#   only).
# Provides: issue PKI NAME SUBJECT EXTENSIONS, pki PKI [EXTRA_IP], kubeconfig PKI PORT [HOST
#   [USER]], addon_certs DIR NAME CERTS, node_pki DIR.

# A certificate signed by the CA: name, subject, extensions.
issue() {
  local pki="$1" name="$2" subj="$3" ext="$4"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" \
    -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile <(printf '%s\n' "$ext") -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr"
}

pki() {
  local pki="$1" extra_san="${2:+,IP:$2}"
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 \
    -subj "/CN=jobset-inplace-test-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  issue "$pki" apiserver "/CN=kube-apiserver" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1${extra_san},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue "$pki" admin "/O=system:masters/CN=jobset-inplace-test-admin" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  # JobSet's webhook server, called by the API server at 127.0.0.1.
  issue "$pki" jobset-webhook "/CN=jobset-webhook" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1"
  # Service-account tokens: signed with sa.key, verified with sa.pub.
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  chmod 600 "$pki"/*.key
}

# A kubeconfig for the client certificate NAME (default admin) of the PKI, server at HOST.
kubeconfig() {
  local pki="$1" port="$2" host="${3:-127.0.0.1}" user="${4:-admin}"
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: control-plane
  cluster:
    server: https://$host:$port
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 "$pki/$user.crt")
    client-key-data: $(base64 -w0 "$pki/$user.key")
contexts:
- name: control-plane
  context:
    cluster: control-plane
    user: admin
current-context: control-plane
EOF
}

# A serving certificate for an addon's webhook at 127.0.0.1, as CERTS/tls.{crt,key}.
addon_certs() {
  local dir="$1" name="$2" certs="$3"
  issue "$dir/pki" "$name-webhook" "/CN=$name-webhook" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1"
  mkdir -p "$certs"
  cp "$dir/pki/$name-webhook.crt" "$certs/tls.crt"
  cp "$dir/pki/$name-webhook.key" "$certs/tls.key"
}

# Each node's client certificates, and the API server's for calling kubelets.
node_pki() {
  local dir="$1" pki="$1/pki" nd client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    # shellcheck disable=SC2153 # NODE_NAME: from node_load
    issue "$pki" "node-$NODE_INDEX" "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
  done
  issue "$pki" kube-proxy "/CN=system:kube-proxy" "$client"
  issue "$pki" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  chmod 600 "$pki"/*.key
}
