# outpost — see README.md. `make demo` and `make test` install what they
# need on a fresh Debian or Ubuntu machine (as root).

SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# grpcnotrace keeps golang.org/x/net/trace (and html/template) out of the
# binary: 22 MB instead of 28 MB. test/deps checks every build uses it.
BUILDTAGS := grpcnotrace
PLATFORMS := linux/arm64 linux/arm linux/amd64
# build-all writes its binaries here, and packages its packages.
DIST ?= dist
# Tools built for the tests (etcd, kube-apiserver, kubectl, registry) live here.
export OUTPOST_TOOLS ?= /var/cache/outpost-testenv

.PHONY: build build-all packages test test-unit test-arm test-e2e testenv bench bench-fleet bench-peers soak demo lint clean conformance

# SHIM is the shim start binary packaged beside outpost
# (cmd/containerd-shim-outpost-v2).
SHIM := containerd-shim-outpost-v2

build:
	CGO_ENABLED=0 $(GO) build -tags '$(BUILDTAGS)' -trimpath -ldflags '$(LDFLAGS)' -o bin/outpost ./cmd/outpost
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/$(SHIM) ./cmd/$(SHIM)

build-all:
	@mkdir -p $(DIST)
	@for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=$(DIST)/outpost-$$os-$$arch; [ $$arch = arm ] && out=$$out-v7; \
		echo "build $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch GOARM=7 $(GO) build -tags '$(BUILDTAGS)' -trimpath -ldflags '$(LDFLAGS)' -o $$out ./cmd/outpost || exit 1; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch GOARM=7 $(GO) build -trimpath -ldflags '-s -w' -o $(DIST)/$(SHIM)$${out#$(DIST)/outpost} ./cmd/$(SHIM) || exit 1; \
	done

# packages builds .deb and .rpm packages of build-all's binaries with nfpm
# (built at a pinned version into $(OUTPOST_TOOLS)/bin on first use); see
# packaging/README.md.
packages: build-all
	@VERSION='$(VERSION)' scripts/packaging/build.sh $(DIST)

# testenv installs the packages and builds the tools the end-to-end tests
# run. It needs root; without root the e2e tests skip and say why.
testenv:
	@if [ "$$(id -u)" = 0 ]; then scripts/testenv/install.sh && scripts/testenv/build-tools.sh; \
	else echo "make: not root, so the end-to-end environment is not installed; e2e tests will skip"; fi

test-unit:
	$(GO) test -race -short ./...

# test runs every test beside another outpost (scripts/testenv/beside.sh,
# as root), which it checks was left alone, then a quick subset of make
# conformance where its tools are built (scripts/conformance/quick.sh).
test: testenv lint
	scripts/testenv/beside.sh $(GO) test -race -count=1 -timeout 60m ./...
	@scripts/conformance/quick.sh
	@$(MAKE) --no-print-directory test-arm

# test-arm runs the unit tests for linux/arm64 and linux/arm (ARMv7) under
# qemu-user, and the binaries of build-all (see scripts/test-arm.sh).
test-arm: build-all
	@GO='$(GO)' BUILDTAGS='$(BUILDTAGS)' scripts/test-arm.sh

# bench: the store, the reconnect replay against a real API server (root;
# it skips without), the proxy's sync from the store, the binary sizes and
# the idle agent's memory, then scripts/bench-proxy.sh: the service proxy
# against the kernel and against kube-proxy (built on first use), and the
# agent's memory with 10,000 Services, then the kubelet API through a real
# API server (exec round trip, followed log throughput, the API's memory;
# root). The pod startup benchmark needs containerd and network
# namespaces: see docs/testing.md.
bench:
	OUTPOST_BENCH_DIR=$${OUTPOST_BENCH_DIR:-/var/tmp} $(GO) test -run '^$$' -bench . -benchtime 2s ./store/...
	OUTPOST_BENCH_DIR=$${OUTPOST_BENCH_DIR:-/var/tmp} $(GO) test -run '^$$' -bench BenchmarkReplayAfterOutage -benchtime 1x ./sync/kube/
	$(GO) test -run '^$$' -bench BenchmarkSyncUnchanged -benchtime 5x ./netproxy/proxy/
	$(GO) test -run '^$$' -bench 'BenchmarkVerify|BenchmarkSign' ./sync/mqtt/
	$(GO) test -run '^$$' -bench BenchmarkStreamThroughput ./sync/mqtt/tunnel/
	@scripts/bench-size.sh
	@scripts/bench-proxy.sh
	$(GO) test -run '^$$' -bench BenchmarkKubeletAPI -benchtime 1x -timeout 20m ./test/e2e/
	$(GO) test -run '^$$' -bench 'BenchmarkMQTT[^F]' -benchtime 1x -timeout 60m ./test/e2e/

# bench-fleet: one `outpost bridge` for 2,000 nodes × 30 pods that
# test/fleetsim simulates (BENCH_FLEET_NODES, BENCH_FLEET_PODS,
# BENCH_FLEET_DURATION), beside mosquitto, kube-apiserver and etcd
# (root; about 10 minutes). docs/mqtt.md, "Fleet size".
bench-fleet:
	$(GO) test -run '^$$' -bench BenchmarkMQTTFleet -benchtime 1x -timeout 90m ./test/e2e/

# bench-peers: outpost beside upstream kubelet and kube-proxy v1.37.2 (30
# pods through an API server, an offline reboot, the service proxy) and
# bare runc (the reboot's floor) in one run, the runs alternating; prints
# one table with the ratios and writes it to docs/benchmarks.md with
# charts in docs/img/ (root; see docs/testing.md).
bench-peers:
	@GO='$(GO)' scripts/bench-peers.sh

# soak: the reliability trials (docs/soak.md): agent kills during churn,
# power cuts, a dying disk, the API server away, containerd restarts, a
# flapping broker, fuzzing and the kubelet API's who-gets-in matrix (root).
# SOAK_SCALE=quick (default, under 15 minutes) or full (under 90); prints
# a line per trial and writes dist/soak/report.md.
soak: testenv
	@GO='$(GO)' scripts/soak.sh

demo: build
	@scripts/demo.sh

# conformance runs Kubernetes' [NodeConformance] specs against the agent
# (root; see docs/conformance.md). CONFORMANCE_FOCUS=REGEX runs a subset.
conformance: testenv
	@scripts/conformance/build.sh
	@scripts/conformance/run.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin dist
