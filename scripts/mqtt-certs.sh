#!/usr/bin/env bash
# Makes the certificates of outpost's MQTT broker and its clients, with
# openssl, into a directory (default: the current one):
#
#   mqtt-certs.sh [-d DIR] [-days N] [-f] client CN
#   mqtt-certs.sh [-d DIR] [-days N] [-f] server NAME|IP...
#
# Either first makes the CA, DIR/ca.crt and DIR/ca.key, when DIR holds no
# ca.crt; an existing CA is used as it is.
#
# client CN      DIR/<CN>.crt and .key: a client certificate for a node
#                (CN = the node name, a DNS-1123 subdomain such as pi-007)
#                or the bridge (CN outpost:bridge, or outpost:bridge:N for
#                replica N; its files are named outpost_bridge.crt and
#                .key, outpost_bridge_N.*). The broker takes the CN as
#                the client's username and client id (packaging/mosquitto).
# server NAME..  DIR/server.crt and .key: the broker's certificate, valid
#                for each host name and IP address given (the first is
#                its CN). Clients check the name or IP they connect to.
#
# -days N   validity of the new certificate, in days (default 730; a
#           new CA gets 3650). A board whose certificate expires can no
#           longer connect: renew it (-f) before then.
# -f        replace an existing certificate and key of that name.
#
# Keys are ECDSA P-256, written with mode 0600. Exit status: 0 done,
# 1 failed (the reason is printed), 2 usage error.
set -euo pipefail

prog=mqtt-certs.sh

usage() {
	cat <<EOF
usage: $prog [-d DIR] [-days N] [-f] client CN
       $prog [-d DIR] [-days N] [-f] server NAME|IP...

Makes, with openssl, into DIR (default: the current directory):
  ca.crt, ca.key          the CA, when DIR has no ca.crt yet (3650 days)
  client CN               <CN>.crt, <CN>.key: a node's client certificate
                          (CN = the node name, e.g. pi-007) or the bridge's
                          (CN outpost:bridge, files outpost_bridge.crt/.key)
  server NAME|IP...       server.crt, server.key: the broker's certificate,
                          valid for each host name and IP address given

  -d DIR    where the files go (made if missing)
  -days N   validity of the new certificate in days (default 730)
  -f        replace an existing certificate of that name
  -h        this help
EOF
}

die() {
	echo "$prog: $*" >&2
	exit 1
}

usage_error() {
	echo "$prog: $*" >&2
	usage >&2
	exit 2
}

dir=.
days=730
force=false
while [[ $# -gt 0 ]]; do
	case $1 in
	-h | --help)
		usage
		exit 0
		;;
	-d)
		[[ $# -ge 2 ]] || usage_error "-d needs a directory"
		dir=$2
		shift 2
		;;
	-days)
		[[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || usage_error "-days needs a positive number of days"
		days=$2
		shift 2
		;;
	-f)
		force=true
		shift
		;;
	-*) usage_error "unknown option $1" ;;
	*) break ;;
	esac
done
[[ $# -ge 1 ]] || usage_error "say client or server"
kind=$1
shift

command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"

# valid_cn reports whether $1 is a name the broker's ACL can use: the
# bridge's CN (outpost:bridge, or outpost:bridge:N for replica N), or a
# node name, a DNS-1123 subdomain (lower case letters,
# digits, - and ., each label starting and ending with a letter or digit,
# at most 253 characters). Anything else could break the ACL's patterns
# (a / would reach into another node's topics; mosquitto denies a + or #).
valid_cn() {
	local label='[a-z0-9]([-a-z0-9]*[a-z0-9])?'
	[[ $1 =~ ^outpost:bridge(:[0-9]{1,3})?$ ]] && return 0
	[[ ${#1} -le 253 && $1 =~ ^$label(\.$label)*$ ]]
}

case $kind in
client)
	[[ $# -eq 1 ]] || usage_error "client needs exactly one CN"
	cn=$1
	valid_cn "$cn" || die "CN $cn: not a node name (a DNS-1123 subdomain such as pi-007) nor outpost:bridge[:N]"
	name=${cn//:/_}
	;;
server)
	[[ $# -ge 1 ]] || usage_error "server needs the broker's host name or IP address"
	cn=$1
	name=server
	;;
*) usage_error "unknown command $kind: say client or server" ;;
esac

mkdir -p "$dir"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# newkey writes a new ECDSA P-256 key to $1.
newkey() {
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>"$tmp/err" ||
		die "make key $1: $(cat "$tmp/err")"
}

# serial prints a random 128-bit serial number (positive: top bit clear).
serial() {
	local hex
	hex=$(openssl rand -hex 16)
	printf '0x%x%s' $((0x${hex:0:1} & 7)) "${hex:1}"
}

if [[ ! -e $dir/ca.crt ]]; then
	[[ ! -e $dir/ca.key ]] || die "$dir/ca.key exists without ca.crt: remove it or put its certificate there"
	newkey "$tmp/ca.key"
	cat >"$tmp/ca.ext" <<EOF
[req]
distinguished_name = dn
x509_extensions = ca
[dn]
[ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
	openssl req -new -x509 -config "$tmp/ca.ext" -key "$tmp/ca.key" -subj "/CN=outpost MQTT CA" \
		-days 3650 -sha256 -set_serial "$(serial)" -out "$tmp/ca.crt" 2>"$tmp/err" ||
		die "make CA: $(cat "$tmp/err")"
	mv "$tmp/ca.key" "$dir/ca.key"
	chmod 644 "$tmp/ca.crt"
	mv "$tmp/ca.crt" "$dir/ca.crt"
	echo "$prog: made the CA $dir/ca.crt (keep $dir/ca.key offline: whoever has it can make any node or the bridge)"
fi
[[ -r $dir/ca.key ]] || die "$dir/ca.key: cannot read the CA's key"

crt=$dir/$name.crt
key=$dir/$name.key
if [[ $force == false && (-e $crt || -e $key) ]]; then
	die "$crt or $key exists: -f replaces it"
fi

{
	echo "basicConstraints = critical, CA:FALSE"
	echo "subjectKeyIdentifier = hash"
	echo "authorityKeyIdentifier = keyid"
	if [[ $kind == client ]]; then
		echo "keyUsage = critical, digitalSignature"
		echo "extendedKeyUsage = clientAuth"
	else
		echo "keyUsage = critical, digitalSignature, keyEncipherment"
		echo "extendedKeyUsage = serverAuth"
		sans=()
		for n in "$@"; do
			if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then
				sans+=("IP:$n")
			elif [[ $n =~ ^[A-Za-z0-9*]([-A-Za-z0-9.]*[A-Za-z0-9])?$ ]]; then
				sans+=("DNS:$n")
			else
				die "server name $n: not a host name or IP address"
			fi
		done
		(
			IFS=,
			echo "subjectAltName = ${sans[*]}"
		)
	fi
} >"$tmp/leaf.ext"

newkey "$tmp/leaf.key"
openssl req -new -key "$tmp/leaf.key" -subj "/CN=$cn" -out "$tmp/leaf.csr" 2>"$tmp/err" ||
	die "make request for $cn: $(cat "$tmp/err")"
openssl x509 -req -in "$tmp/leaf.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -set_serial "$(serial)" \
	-days "$days" -sha256 -extfile "$tmp/leaf.ext" -out "$tmp/leaf.crt" 2>"$tmp/err" ||
	die "sign $cn: $(cat "$tmp/err")"
mv "$tmp/leaf.key" "$key"
chmod 644 "$tmp/leaf.crt"
mv "$tmp/leaf.crt" "$crt"
echo "$prog: made $crt and $key ($kind, CN $cn, $days days)"
