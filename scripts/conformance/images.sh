#!/usr/bin/env bash
# images.sh REGISTRY WORKDIR: builds, from local binaries, a substitute
# for every image the NodeConformance specs pull, and pushes each to the
# plain-HTTP registry at REGISTRY under the names repo-list.yaml maps the
# test registries to. Run it where REGISTRY is reachable (the cluster's
# network namespace). The substitutes:
#   busybox, nonroot, glibc-dns-testing: busybox-static with every applet;
#     /bin/sh is shsel/sh.c, which runs busybox's ash as upstream's images
#     do (the specs match ash's messages), or Debian's bash when the
#     environment holds names that are not identifiers (EnvFrom makes
#     them; busybox 1.35's ash drops them, upstream's 1.37 does not);
#   agnhost, kitten, nautilus: agnhost built from k8s.io/kubernetes, with
#     that userland, bash as /bin/sh (Debian's ash prefers its own applets
#     to PATH: its nc has no -u), curl and netcat-openbsd;
#   pause: a static pause; nonewprivs: a setuid binary that prints its
#     effective UID; nginx: busybox httpd on :80.
set -euo pipefail
REG=${1:?registry}
W=${2:?work dir}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${OUTPOST_TOOLS:-/var/cache/outpost-testenv}/conformance/bin
E=e2e-test-images
push() { python3 "$HERE/pushimg.py" "$REG" "$@" >/dev/null; }
rm -rf "$W"
mkdir -p "$W"

# copybin ROOT BINARY AS: BINARY at AS in ROOT, with its shared libraries.
copybin() {
	local d=$1 b=$2 as=$3 l
	mkdir -p "$d$(dirname "$as")"
	cp -L "$b" "$d$as"
	for l in $(ldd "$b" | grep -oE '/[^ ]+'); do
		mkdir -p "$d$(dirname "$l")"
		cp -L "$l" "$d$l"
	done
}
# mkbase ROOT [ash]: a busybox userland with bash as /bin/sh, or with
# ash: shsel's choice of ash or bash.
mkbase() {
	local d=$1 a
	mkdir -p "$d"/{bin,etc,tmp,root,home,proc,sys,dev,usr/bin,usr/local/bin,var}
	chmod 1777 "$d/tmp"
	cp /bin/busybox "$d/bin/busybox"
	for a in $(/bin/busybox --list); do
		[[ $a == busybox ]] || ln -sf busybox "$d/bin/$a"
	done
	ln -sf ../../bin/env "$d/usr/bin/env"
	rm -f "$d/bin/sh" "$d/bin/bash"
	copybin "$d" /bin/bash /bin/bash
	if [[ ${2:-} == ash ]]; then
		cp "$W/shsel" "$d/bin/sh"
	else
		ln -s bash "$d/bin/sh"
	fi
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$d/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$d/etc/group"
}

gcc -static -O2 -o "$W/shsel" "$HERE/shsel/sh.c"
mkbase "$W/busybox" ash
for t in 1.37.0-2 1.36.1-1; do push "$E/busybox:$t" "$W/busybox" --cmd '["sh"]'; done
push "$E/nonroot:1.5" "$W/busybox" --cmd '["sh"]' --user 1234
push "$E/glibc-dns-testing:2.1.1" "$W/busybox" --cmd '["sh"]'

mkbase "$W/agnhost"
cp "$BIN/agnhost" "$W/agnhost/agnhost"
ln -s agnhost "$W/agnhost/agnhost-2"
mkdir -p "$W/agnhost/uploads"
echo 'user-defined-in-image:x:1000:1000::/home:/bin/sh' >>"$W/agnhost/etc/passwd"
printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$W/agnhost/etc/group"
cp "$BIN/localhost.crt" "$BIN/localhost.key" "$W/agnhost/"
copybin "$W/agnhost" /usr/bin/curl /usr/bin/curl
rm -f "$W/agnhost/bin/nc"
copybin "$W/agnhost" /bin/nc.openbsd /usr/bin/nc
ln -sf ../usr/bin/nc "$W/agnhost/bin/nc"
mkdir -p "$W/agnhost/etc/ssl/certs"
cp /etc/ssl/certs/ca-certificates.crt "$W/agnhost/etc/ssl/certs/" 2>/dev/null || true
for t in 2.66.1 2.55; do
	push "$E/agnhost:$t" "$W/agnhost" --entrypoint '["/agnhost"]' --cmd '["pause"]' --expose 80 --expose 8080
done
for i in kitten nautilus; do
	push "$E/$i:1.8" "$W/agnhost" --entrypoint '["/agnhost"]' --cmd '["test-webserver"]' --expose 80
done

mkdir -p "$W/pause"
cp "$BIN/pause" "$W/pause/pause"
for t in 3.10.2 3.10; do push "pause:$t" "$W/pause" --entrypoint '["/pause"]' --user 65535:65535; done

mkbase "$W/nnp"
cp "$BIN/nnp" "$W/nnp/usr/local/bin/nnp"
chmod 4755 "$W/nnp/usr/local/bin/nnp"
push "$E/nonewprivs:1.4" "$W/nnp" --cmd '["nnp"]'

mkbase "$W/nginx"
mkdir -p "$W/nginx/usr/share/nginx/html"
echo '<h1>Welcome to nginx!</h1>' >"$W/nginx/usr/share/nginx/html/index.html"
for t in 1.27.0-2 1.28.0-2; do
	push "$E/nginx:$t" "$W/nginx" --cmd '["httpd","-f","-p","80","-h","/usr/share/nginx/html"]' --expose 80
done
echo "conformance: images pushed to $REG"
