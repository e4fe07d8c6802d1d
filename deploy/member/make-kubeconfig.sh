#!/bin/sh
# Turns the pgfleet-manager token of a member cluster into a kubeconfig for
# the central manager. Run it with kubectl pointed at the member cluster
# (after `kubectl apply --server-side -k deploy/member`):
#
#   deploy/member/make-kubeconfig.sh [NAME] > NAME.kubeconfig
#
# NAME (default: the current context's name) names the cluster, user and
# context inside the file. The API server URL is the current context's; set
# SERVER=https://… to override it (e.g. when the manager reaches the member
# through another address). KUBECTL and KUBECONFIG are honoured.
#
# The output holds a credential: write it to a file only you can read and
# put it straight into the manager's Secret (docs/deploy.md). Nothing is
# printed to stderr but errors.
set -eu

KUBECTL=${KUBECTL:-kubectl}
NS=pgfleet-system
SECRET=pgfleet-manager-token

ctx=$("$KUBECTL" config current-context)
name=${1:-$ctx}
case $name in
  ''|*[!a-z0-9-]*) echo "make-kubeconfig.sh: name must be lowercase letters, digits and -: '$name'" >&2; exit 2 ;;
esac

if [ -z "${SERVER:-}" ]; then
  SERVER=$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
fi

# The token controller fills the Secret shortly after it is created.
token=
i=0
while [ $i -lt 60 ]; do
  token=$("$KUBECTL" -n "$NS" get secret "$SECRET" -o jsonpath='{.data.token}' 2>/dev/null || true)
  [ -n "$token" ] && break
  i=$((i + 1))
  sleep 1
done
if [ -z "$token" ]; then
  echo "make-kubeconfig.sh: secret $NS/$SECRET has no token (was deploy/member applied to this cluster?)" >&2
  exit 1
fi
ca=$("$KUBECTL" -n "$NS" get secret "$SECRET" -o jsonpath='{.data.ca\.crt}')
token=$(printf '%s' "$token" | base64 -d)

cat <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: $name
  cluster:
    server: $SERVER
    certificate-authority-data: $ca
contexts:
- name: $name
  context:
    cluster: $name
    user: pgfleet-manager
    namespace: $NS
current-context: $name
users:
- name: pgfleet-manager
  user:
    token: $token
KUBECONFIG
