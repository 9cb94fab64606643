// Package nfttest is test support for netproxy/nft, as agent/runtimetest
// is for the agent: Fake, an in-memory table that applies Txs
// transactionally, refuses what the kernel refuses and dumps canonical
// nft text (fake.go); Trace, which pushes a packet through the Fake's
// rules (trace.go); each statement's checks and effect on a packet, one
// entry a statement type (stmt.go); and the helpers that compare the kernel's table with
// the Fake's in a network namespace of the test's own (kernel.go). Only
// tests import it.
package nfttest
