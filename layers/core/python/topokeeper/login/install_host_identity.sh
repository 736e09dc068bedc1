#!/bin/sh
# topokeeper: install the cluster's login host identity on this login node (run as root, at creation
# and at replacement, from a lifecycle script). Only sshd_config's HostKey/HostCertificate lines change;
# sshd is reloaded only after `sshd -t` accepts the new config, and everything is restored otherwise.
# Usage: sh install.sh                  fetch the bundle from Secrets Manager (the login nodes' role)
#        sh install.sh --bundle-file F  install a bundle from a file
set -eu
umask 077
SECRET_ID='@SECRET_ID@'
REGION='@REGION@'
KEY_DIR=/etc/ssh/topokeeper
CONFIG=/etc/ssh/sshd_config
SSHD=/usr/sbin/sshd
BEGIN_MARK='# topokeeper: login host identity (topokeeper login install-script)'
END_MARK='# topokeeper: end of login host identity'

fail() { echo "topokeeper-host-identity: $*" >&2; exit 1; }

stage=$(mktemp -d /etc/ssh/.topokeeper-stage.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/keys"
if [ "${1:-}" = "--bundle-file" ]; then
  cp "$2" "$stage/bundle"
else
  aws secretsmanager get-secret-value --region "$REGION" --secret-id "$SECRET_ID" \
    --query SecretString --output text > "$stage/bundle"
fi

{
  read -r header || fail "empty bundle"
  [ "$header" = "topokeeper-host-identity/1" ] || fail "not a topokeeper host identity bundle"
  while read -r name mode data; do
    [ -n "$name" ] || continue
    case "$name" in
      ssh_host_ed25519_key|ssh_host_ed25519_key.pub|ssh_host_ed25519_key-cert.pub) ;;
      *) fail "unexpected file in bundle: $name" ;;
    esac
    case "$mode" in 600|644) ;; *) fail "unexpected mode for $name: $mode" ;; esac
    printf '%s\n' "$data" | base64 -d > "$stage/keys/$name" || fail "bad base64 for $name"
    chmod "$mode" "$stage/keys/$name"
  done
} < "$stage/bundle"
[ -s "$stage/keys/ssh_host_ed25519_key" ] || fail "the bundle has no host key"
chown -R root:root "$stage/keys"
chmod 755 "$stage/keys"

# The new config: our block first (HostKey is cumulative, so it must replace every other HostKey line),
# then every line of the current config except HostKey/HostCertificate directives and our old block.
{
  printf '%s\n' "$BEGIN_MARK"
  printf 'HostKey %s\n' "$KEY_DIR/ssh_host_ed25519_key"
  if [ -s "$stage/keys/ssh_host_ed25519_key-cert.pub" ]; then
    printf 'HostCertificate %s\n' "$KEY_DIR/ssh_host_ed25519_key-cert.pub"
  fi
  printf '%s\n' "$END_MARK"
  awk -v begin="$BEGIN_MARK" -v end="$END_MARK" '
    $0 == begin { skipping = 1; next }
    skipping { if ($0 == end) skipping = 0; next }
    { keyword = tolower($1); sub(/=.*/, "", keyword) }
    keyword == "hostkey" || keyword == "hostcertificate" { next }
    { print }
  ' "$CONFIG"
} > "$stage/sshd_config"

restore_keys() {
  rm -rf "$KEY_DIR"
  if [ -d "$KEY_DIR.previous" ]; then mv "$KEY_DIR.previous" "$KEY_DIR"; fi
}

rm -rf "$KEY_DIR.previous"
if [ -d "$KEY_DIR" ]; then mv "$KEY_DIR" "$KEY_DIR.previous"; fi
mv "$stage/keys" "$KEY_DIR"
cp -p "$CONFIG" "$CONFIG.topokeeper-new"  # the owner and mode of the current file
cat "$stage/sshd_config" > "$CONFIG.topokeeper-new"
if ! "$SSHD" -t -f "$CONFIG.topokeeper-new"; then
  rm -f "$CONFIG.topokeeper-new"
  restore_keys
  fail "sshd -t rejected the new config; nothing changed"
fi
cp -p "$CONFIG" "$CONFIG.topokeeper-previous"
mv "$CONFIG.topokeeper-new" "$CONFIG"

reload() {
  # Ubuntu and Debian name the unit ssh, Amazon Linux and RHEL sshd.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet ssh 2>/dev/null; then
    systemctl reload ssh
  elif command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet sshd 2>/dev/null; then
    systemctl reload sshd
  elif [ -s /run/sshd.pid ] && kill -0 "$(cat /run/sshd.pid)" 2>/dev/null; then
    kill -HUP "$(cat /run/sshd.pid)"
  else
    echo "topokeeper-host-identity: sshd is not running; it uses the new identity when it starts"
  fi
}
if ! reload; then
  mv "$CONFIG.topokeeper-previous" "$CONFIG"
  restore_keys
  reload || true
  fail "sshd reload failed; the previous identity is restored"
fi
rm -rf "$KEY_DIR.previous"
echo "topokeeper-host-identity: installed"
