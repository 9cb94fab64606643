// Package nft programs outpost's nftables table (`outpost`, family inet)
// through github.com/google/nftables; it is the only package that may
// import that library.
//
// It holds the Table (table.go, services.go), which keeps the table equal
// to a State (pod egress masquerade, hostPorts and Services) and applies
// only the difference from the last applied state; the Ruleset seam it
// applies through, whose transactions (Tx) are described in a small typed
// language of chains, rules, maps and sets (ir.go); Netlink, the Ruleset
// that sends each Tx to the kernel as one atomic netlink batch
// (netlink.go); and Fake, the in-memory Ruleset for tests, which dumps
// canonical nft text and traces packets through its rules (fake.go,
// trace.go).
package nft
