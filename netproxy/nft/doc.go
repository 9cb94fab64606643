// Package nft programs outpost's nftables table (`outpost`, family inet)
// through github.com/google/nftables; it is the only package that may
// import that library.
//
// It holds the Table (table.go, services.go), which keeps the table equal
// to a State (pod egress masquerade, hostPorts, and Services as
// netproxy/servicemodel's ServicePorts) and applies only the difference
// from the last applied state; the transactions (Tx)
// it applies, described in a small typed language of chains, rules, maps
// and sets (ir.go) and statements (stmt.go); and Netlink, which sends
// each Tx to the kernel as one atomic netlink batch (netlink.go). The
// Table applies through anything with Netlink's Apply and List
// (proxy.Ruleset); in tests that is netproxy/nfttest's Fake, which also
// traces packets through its rules.
//
// Each statement kind is one block of stmt.go: its type, its nft syntax
// (String), what it is (Info: terminal or not, the address family it
// loads, the chain, map and set it names, the chains it may run in) and
// its netlink expressions (encode). Netlink and the Fake both read Info,
// so that knowledge is written once. What only the Fake needs, a
// statement's checks against an in-memory table and its effect on a
// traced packet, is one entry per kind in nfttest's stmt.go, keyed by the
// statement's type: a method here would put test code in the binary,
// and an interface the statements satisfy for nfttest would need those
// methods here too. So a new statement is a block in stmt.go and an entry
// in nfttest's stmt.go, which TestEveryStatementHasAFake demands.
package nft
