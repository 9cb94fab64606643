// Package nft programs outpost's nftables table (`outpost`, family inet)
// through github.com/google/nftables; it is the only package that may
// import that library.
//
// It holds the Table (table.go, services.go), which keeps the table equal
// to a State (pod egress masquerade, hostPorts and Services) and applies
// only the difference from the last applied state; the transactions (Tx)
// it applies, described in a small typed language of chains, rules, maps
// and sets (ir.go); and Netlink, which sends each Tx to the kernel as one
// atomic netlink batch (netlink.go). The Table applies through anything
// with Netlink's Apply and List (proxy.Ruleset); in tests that is
// netproxy/nfttest's Fake, which also traces packets through its rules.
package nft
