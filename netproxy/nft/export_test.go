package nft

// Names the external tests (package nft_test, which can use
// netproxy/nfttest's Fake) need from inside the package.

var (
	AppendKey          = appendKey
	Conn               = conn
	EndpointReadable   = endpointReadable
	HashName           = hashName
	MatchPort          = matchPort
	NFTable            = table
	NormalizeHostPorts = normalize
)

const (
	ChainHostPorts    = chainHostPorts
	FilterInput       = filterInput
	MapNameServiceIPs = mapNameServiceIPs
	MaxGroup          = maxGroup
	NatPostrouting    = natPostrouting
	NatPrerouting     = natPrerouting
	PrefixAffinity    = prefixAffinity
	PrefixEndpoint    = prefixEndpoint
	PriorityDNAT      = priorityDNAT
)
