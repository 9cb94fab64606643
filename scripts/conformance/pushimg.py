#!/usr/bin/env python3
"""pushimg.py REGISTRY REPO:TAG ROOTFS_DIR [--entrypoint JSON] [--cmd JSON] [--user U] [--env K=V ...] [--workdir D]
Tar a rootfs dir into one gzip layer, build an OCI image manifest, push it to a plain-HTTP
registry (distribution v3) using the /v2 API. stdlib only."""
import argparse, gzip, hashlib, io, json, os, sys, tarfile, urllib.request
p = argparse.ArgumentParser()
p.add_argument("registry"); p.add_argument("ref"); p.add_argument("rootfs")
p.add_argument("--entrypoint"); p.add_argument("--cmd"); p.add_argument("--user")
p.add_argument("--env", action="append", default=[]); p.add_argument("--workdir")
p.add_argument("--expose", action="append", default=[])
a = p.parse_args()
repo, tag = a.ref.rsplit(":", 1)
def sha(b): return "sha256:" + hashlib.sha256(b).hexdigest()
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
    def filt(ti):
        ti.uid = ti.gid = 0; ti.uname = ti.gname = ""; ti.mtime = 0
        return ti
    for name in sorted(os.listdir(a.rootfs)):
        t.add(os.path.join(a.rootfs, name), arcname=name, filter=filt)
layer = raw.getvalue()
gz = gzip.compress(layer, compresslevel=6, mtime=0)
cfgd = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env}
if a.entrypoint: cfgd["Entrypoint"] = json.loads(a.entrypoint)
if a.cmd: cfgd["Cmd"] = json.loads(a.cmd)
if a.user: cfgd["User"] = a.user
if a.workdir: cfgd["WorkingDir"] = a.workdir
if a.expose: cfgd["ExposedPorts"] = {p + "/tcp": {} for p in a.expose}
arch = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(os.uname().machine, os.uname().machine)
cfg = json.dumps({"architecture": arch, "os": "linux", "config": cfgd,
                  "rootfs": {"type": "layers", "diff_ids": [sha(layer)]}}).encode()
man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(cfg), "size": len(cfg)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(gz), "size": len(gz)}]}).encode()
base = "http://%s/v2/%s" % (a.registry, repo)
def req(method, url, data=None, headers={}):
    r = urllib.request.Request(url, data=data, method=method, headers=headers)
    return urllib.request.urlopen(r)
for blob in (gz, cfg):
    try:
        req("HEAD", "%s/blobs/%s" % (base, sha(blob))); continue
    except urllib.error.HTTPError: pass
    loc = req("POST", base + "/blobs/uploads/").headers["Location"]
    if loc.startswith("/"): loc = "http://" + a.registry + loc
    req("PUT", loc + ("&" if "?" in loc else "?") + "digest=" + sha(blob), blob,
        {"Content-Type": "application/octet-stream"})
req("PUT", "%s/manifests/%s" % (base, tag), man, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
print("pushed %s/%s:%s %s layer=%dB" % (a.registry, repo, tag, sha(man), len(gz)))
