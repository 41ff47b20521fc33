# shellcheck shell=bash
# Images into the real nodes (scripts/lib/node.sh sources it): `load-image DIR ARCHIVE` imports
# an archive into every live node's containerd.
#
# Needs: functions die, node_dirs (scripts/lib/node-network.sh); ctr, flock.
# Provides: load_image DIR ARCHIVE.

# Imports a docker-archive or OCI archive into every node's containerd (namespace k8s.io, where
# the kubelets' images are).
# Imports are serialised per cluster (flock on DIR/load-image.lock, bounded): containerd refuses
# the second of two concurrent imports of the same image ("already exists"), which is what rows
# of the failure matrix running side by side do with the test image.
load_image() {
  local dir="$1" archive="$2" nd
  [[ -f "$dir/node.env" ]] || die "$dir has no node (up DIR --node)"
  [[ -f "$archive" ]] || die "$archive: no such file"
  (
    flock -w 300 9 || die "load-image: $dir/load-image.lock held for over 300 s"
    for nd in $(node_dirs "$dir"); do
      [[ ! -e "$nd/killed" ]] || continue
      ctr --address "$nd/containerd.sock" -n k8s.io images import "$archive" >&2 ||
        die "import of $archive into $nd failed"
    done
  ) 9>"$dir/load-image.lock"
}
