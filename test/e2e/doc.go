// Package e2e holds outpost's end-to-end tests: real kube-apiserver and
// etcd, real containerd and runc, real nftables in network namespaces the
// tests create, real mosquitto. They need root and skip without it.
package e2e
