#!/usr/bin/env python3
"""Turns the benchmark lines scripts/bench-peers.sh collected into the
side-by-side table: it prints the table, writes docs/benchmarks.md and
draws the scaling rows as SVG charts with gnuplot."""

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile

OPS = [("cold", "cold sync"), ("add", "add one Service"),
       ("change", "change one EndpointSlice"), ("delete", "delete one Service")]


def parse(path):
    """Returns {(benchmark, size): {metric: [values...]}}."""
    runs = {}
    with open(path) as f:
        for line in f:
            env, _, rest = line.rstrip("\n").partition("|")
            fields = rest.split()
            if len(fields) < 2:
                continue
            name = re.sub(r"-\d+$", "", fields[0])
            size = None
            if "/" in name:
                name, size = name.split("/", 1)
            m = re.search(r"OUTPOST_BENCH_RSS_SERVICES=(\d+)", env)
            if m:
                size = m.group(1)
            m = re.search(r"BENCH_PEER=([\w-]+)", env)
            if m:
                name += ":" + m.group(1)
            metrics = runs.setdefault((name, int(size) if size else 0), {})
            vals = fields[2:]
            for v, unit in zip(vals[0::2], vals[1::2]):
                metrics.setdefault(unit, []).append(float(v))
    return runs


class Row:
    def __init__(self, what, unit, outpost, peer, peer_name):
        self.what, self.unit, self.outpost, self.peer, self.peer_name = what, unit, outpost, peer, peer_name

    @staticmethod
    def fig(vals):
        if not vals:
            return "—"
        med = statistics.median(vals)
        digits = 2 if med < 10 else 1 if med < 100 else 0
        s = f"{med:.{digits}f}"
        if len(vals) > 1:
            s += f" ({min(vals):.{digits}f}–{max(vals):.{digits}f})"
        return s

    def ratio(self):
        if not self.outpost or not self.peer or statistics.median(self.peer) == 0:
            return "—"
        return f"{statistics.median(self.outpost) / statistics.median(self.peer):.2f}"

    def cells(self):
        return [self.what, self.unit, self.fig(self.outpost), self.peer_name, self.fig(self.peer), self.ratio()]


PODS = [
    ("agent-rss-MiB", "30 pods: agent RSS", "MiB", "kubelet + kube-proxy"),
    ("agent-anon-MiB", "30 pods: agent anonymous", "MiB", "kubelet + kube-proxy"),
    ("agent-ws-MiB", "30 pods: agent working set", "MiB", "kubelet + kube-proxy"),
    ("runtime-pss-MiB", "30 pods: containerd + shims PSS", "MiB", "its containerd + shims"),
    ("runtime-pss-anon-MiB", "30 pods: containerd + shims anonymous PSS", "MiB", "its containerd + shims"),
    ("runtime-ws-MiB", "30 pods: containerd + shims working set", "MiB", "its containerd + shims"),
    ("startup-p50-ms", "pod startup, 30 at once: p50", "ms", "kubelet"),
    ("startup-p99-ms", "pod startup, 30 at once: p99", "ms", "kubelet"),
    ("paced-p50-ms", "pod startup, 30 at 5 a second: p50", "ms", "kubelet"),
    ("paced-p99-ms", "pod startup, 30 at 5 a second: p99", "ms", "kubelet"),
    ("agent-cpu-%", "idle CPU with 30 pods: agent", "% of a core", "kubelet + kube-proxy"),
    ("runtime-cpu-%", "idle CPU with 30 pods: containerd + shims", "% of a core", "its containerd + shims"),
]


def plot(chart, label, vals, n):
    """Adds the median of vals at n to the chart's series label."""
    if vals:
        chart.setdefault(label, []).append((n, statistics.median(vals)))


def rows_from(runs):
    rows, charts = [], {"cold": {}, "update": {}, "memory": {}}
    op, kl = runs.get(("BenchmarkPeersPods:outpost", 0), {}), runs.get(("BenchmarkPeersPods:kubelet", 0), {})
    if op or kl:
        for metric, what, unit, peer in PODS:
            rows.append(Row(what, unit, op.get(metric, []), kl.get(metric, []), peer))
    peers = ("outpost", "kubelet", "runc", "containerd", "crun", "outpost-crun", "containerd-crun")
    for metric, what in (("reboot-ms", "back"), ("reboot-cpu-ms", "machine CPU")):
        r = {peer: runs.get((f"BenchmarkPeersReboot:{peer}", 0), {}).get(metric, []) for peer in peers}
        if not any(r.values()):
            continue
        row = f"offline reboot, 30 static pods: {what}"
        rows.append(Row(row, "ms", r["outpost"], r["kubelet"], "kubelet"))
        rows.append(Row(row, "ms", r["outpost"], r["runc"], "bare runc (floor)"))
        if r["containerd"]:
            rows.append(Row(row, "ms", r["outpost"], r["containerd"], "bare containerd client"))
        if r["outpost-crun"]:
            row = f"offline reboot on crun, 30 static pods: {what}"
            rows.append(Row(row, "ms", r["outpost-crun"], r["crun"], "bare crun (floor)"))
            rows.append(Row(row, "ms", r["outpost-crun"], r["runc"], "bare runc"))
            if r["containerd-crun"]:
                rows.append(Row(row, "ms", r["outpost-crun"], r["containerd-crun"], "bare containerd client on crun"))
    sizes = sorted(n for (b, n) in runs if b == "BenchmarkProxyVsKubeProxy")
    for n in sizes:
        m = runs[("BenchmarkProxyVsKubeProxy", n)]
        for op, what in OPS:
            o, k = m.get(f"outpost-{op}-ms", []), m.get(f"kube-proxy-{op}-ms", [])
            rows.append(Row(f"nftables, {n:,} Services × 5 endpoints: {what}", "ms", o, k, "kube-proxy"))
            chart = charts["cold" if op == "cold" else "update"]
            plot(chart, f"outpost {what}", o, n)
            plot(chart, f"kube-proxy {what}", k, n)
    for n in sorted(n for (b, n) in runs if b == "BenchmarkAgentRSS10kServices"):
        m = runs[("BenchmarkAgentRSS10kServices", n)]
        kp = runs.get(("BenchmarkProxyVsKubeProxy", n), {})
        for field, what in [("VmRSS", "RSS"), ("RssAnon", "anonymous")]:
            o, k = m.get(f"{field}-MiB", []), kp.get(f"kube-proxy-{field}-MiB", [])
            rows.append(Row(f"memory, {n:,} Services × 5 endpoints: {what}", "MiB", o, k, "kube-proxy"))
            if field == "VmRSS":
                plot(charts["memory"], "outpost agent RSS", o, n)
                plot(charts["memory"], "kube-proxy RSS", k, n)
    return rows, charts


def table(rows):
    head = ["row", "unit", "outpost", "peer", "peer's", "ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(r.cells()) + " |")
    return "\n".join(lines)


def draw(path, title, ylabel, series):
    """Draws series {label: [(x, y)...]} on log-log axes into the SVG path."""
    if not series:
        return False
    with tempfile.TemporaryDirectory() as d:
        plots = []
        for i, (label, pts) in enumerate(sorted(series.items())):
            data = os.path.join(d, f"{i}.dat")
            with open(data, "w") as f:
                for x, y in sorted(pts):
                    f.write(f"{x} {y}\n")
            plots.append(f"'{data}' using 1:2 with linespoints title '{label}'")
        script = "\n".join([
            "set terminal svg size 720,420 dynamic background rgb 'white'",
            f"set output '{path}'",
            f"set title '{title}'",
            "set xlabel 'Services (× 5 endpoints)'",
            f"set ylabel '{ylabel}'",
            "set logscale x", "set logscale y", "set key left top", "set grid",
            "plot " + ", ".join(plots),
        ])
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--doc", required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--seconds", type=int, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--versions", required=True)
    ap.add_argument("--settings", default="")
    a = ap.parse_args()

    rows, charts = rows_from(parse(a.input))
    if not rows:
        sys.exit("bench-peers: no figures in the benchmarks' output")
    tab = table(rows)
    print()
    print(f"outpost against its peers, median of {a.runs} runs (min–max); ratio = outpost ÷ peer, lower is better for outpost")
    print(tab)
    if a.doc == "-":
        return

    img = os.path.join(os.path.dirname(a.doc) or ".", "img")
    os.makedirs(img, exist_ok=True)
    links = []
    for key, name, title, ylabel in [
        ("cold", "bench-nft-cold", "nftables cold sync", "ms"),
        ("update", "bench-nft-update", "nftables: one Service added, changed, deleted", "ms"),
        ("memory", "bench-memory-services", "memory against the number of Services", "MiB"),
    ]:
        if draw(os.path.join(img, name + ".svg"), title, ylabel, charts[key]):
            links.append(f"![{title}](img/{name}.svg)")

    now = datetime.datetime.now(datetime.timezone.utc)
    kernel = next((v for v in a.versions.splitlines() if v.startswith("kernel ")), "")
    spread = (f"Every figure is the median of {a.runs} runs, with the minimum and maximum in brackets" if int(a.runs) > 1
              else "Every figure is from one run, so there is no minimum and maximum")
    doc = f"""# Benchmarks: outpost beside its peers

Written by `sudo {a.settings + " " if a.settings else ""}make bench-peers` ({now:%Y-%m-%d %H:%M} UTC, {a.seconds // 60} min).
Machine: {a.machine}, {kernel}. Components: {", ".join(v for v in a.versions.splitlines() if not v.startswith("kernel "))}.

{spread}; the runs of outpost and of the
peer alternate (each nftables run measures kube-proxy, then outpost, on the same objects). The ratio is outpost's figure over the
peer's: below 1 outpost is faster or smaller.

{tab}

How each row is measured:
- **30 pods**: `BenchmarkPeersPods` (test/e2e) runs one node against a real API server: the `outpost agent` on a
  private containerd, or upstream kubelet on a private containerd with its CRI plugin and a CNI bridge, with
  kube-proxy (nftables mode) beside it. 30 pods (busybox httpd, httpGet readiness every 10 s) are created at once,
  bound to the node; startup is from each create's answer to a watch seeing the pod Running. With all ready and 20 s
  later, it reads RSS and anonymous memory of the node agent's processes, and PSS of containerd and its shims (they
  share pages, which summed RSS would count once per shim), then the working set (`Referenced` in smaps_rollup 60 s
  after writing 1 to `clear_refs`), then CPU over the idle window. Last it deletes the 30 and creates 30 others at 5 a
  second, timed the same way.
- **offline reboot**: `BenchmarkPeersReboot` runs 30 static pods (the same httpd, each touching a file in a hostPath
  directory before it starts) on a node with no API server until outpost has made their spares (each container's
  next attempt, made ahead 10 s after its start), then kills the agent, containerd, the shims and the
  containers at once and wipes containerd's state, runc's state and the network namespaces, as a reboot empties
  `/run`. containerd starts again, and the figure is from the node agent's start to the 30 files there again: outpost,
  or kubelet standalone with the same pods as static manifests; the machine CPU row is the CPU time all processes
  spent in that window (`/proc/stat`). The floor is bare `runc create` + `runc start` of the
  same 30 containers, all at once, from bundles made beforehand (after one pass to warm the caches). The floor on
  containerd is a bare client of the node's containerd that, after the same power cut, creates the 30 containers
  from the image and starts their tasks, all at once, in 4 shim groups as outpost's (spread evenly), with no pod network and no logs.
  The crun rows are the same with `containerd.ociRuntime: crun` against bare `crun create` + `crun start` (Debian's
  crun 1.8, which refuses a hybrid cgroup layout with a controller on v2: where the host has one, containerd and the
  bare crun run in a mount namespace without `/sys/fs/cgroup/unified`), and against the floor on containerd with
  crun as its shims' OCI runtime.
- **nftables**: `BenchmarkProxyVsKubeProxy` (test/e2e) creates the Services and EndpointSlices in a real API server,
  runs kube-proxy in nftables mode in a fresh network namespace (its time is its sync histogram: the first full
  sync, then the partial syncs each change caused), then outpost's proxy (`netproxy/proxy`) on a store holding the
  same objects, in another fresh namespace: its first Sync, then one Sync after the store writes of each change. Each one-Service change is the median of several within a run.
- **memory with N Services**: `BenchmarkAgentRSS10kServices` runs the whole `outpost agent` (static, stripped, as
  shipped) against the API server with the N Services, and reads its `/proc` status 30 s after its table holds them all;
  kube-proxy's is read in the nftables run once it has programmed the same N and made its changes.

{chr(10).join(links)}

"""
    with open(a.doc, "w") as f:
        f.write(doc)
    print(f"\nbench-peers: wrote {a.doc} and {len(links)} charts under {img}/")


if __name__ == "__main__":
    main()
