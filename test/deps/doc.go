// Package deps holds the test that keeps outpost's dependency graph as
// DESIGN.md draws it: which of our packages may import which, one adapter
// package per heavy dependency, nothing that links every Kubernetes API
// group, and a committed list of every package linked into the binary.
package deps
