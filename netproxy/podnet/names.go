package podnet

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
)

// podIfName is the pod side of every veth pair, inside the pod's netns.
const podIfName = "eth0"

// hostVethPrefix starts the host-side veth name; with 11 hex characters
// of the pod UID's hash the name is 13 bytes, under IFNAMSIZ-1 (15).
const hostVethPrefix = "vo"

// netnsUIDChars is how many characters of the dashless pod UID name its
// netns.
const netnsUIDChars = 12

// checkUID returns an error when uid cannot name a pod's netns file.
func checkUID(uid string) error {
	if uid == "" {
		return fmt.Errorf("pod uid is empty")
	}
	if strings.ContainsAny(uid, "/\x00") || uid == "." || uid == ".." {
		return fmt.Errorf("pod uid %q: contains a path separator or NUL", uid)
	}
	if strings.ReplaceAll(uid, "-", "") == "" {
		return fmt.Errorf("pod uid %q: has no characters besides dashes", uid)
	}
	return nil
}

// netnsName returns the name of uid's netns: prefix plus the first 12
// characters of the UID with its dashes removed.
func netnsName(prefix, uid string) string {
	s := strings.ReplaceAll(uid, "-", "")
	if len(s) > netnsUIDChars {
		s = s[:netnsUIDChars]
	}
	return prefix + s
}

// hostVethName returns the host-side veth name for uid: "vo" and 11 hex
// characters of the UID's SHA-256, so it is stable across restarts,
// independent of the UID's alphabet, and fits IFNAMSIZ.
func hostVethName(uid string) string {
	sum := sha256.Sum256([]byte(uid))
	return hostVethPrefix + hex.EncodeToString(sum[:])[:11]
}

// bridgeMAC returns a stable, locally administered unicast MAC for the
// bridge. A bridge whose address was set explicitly keeps it; otherwise
// it takes the lowest port MAC and changes as pods come and go, which
// makes every pod's ARP entry for the gateway go stale.
func bridgeMAC(name string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("outpost bridge " + name))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&0xfc | 0x02
	return mac
}
