package imageio

import (
	"errors"
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"
)

// What Normalize fills in, from distribution/reference's normalize.go
// (v0.6.0, Apache-2.0).
const (
	defaultDomain       = "docker.io"
	legacyDefaultDomain = "index.docker.io"
	officialRepoPrefix  = "library/"
	defaultTag          = "latest"
	// maxPathLen is reference.RepositoryNameTotalLengthMax: the longest
	// repository path (the name without its domain).
	maxPathLen = 255
)

var (
	errRefIdentifier = errors.New("invalid repository name: cannot specify 64-byte hexadecimal strings")
	errRefUppercase  = errors.New("repository name must be lowercase")
	errRefFormat     = errors.New("invalid reference format")
	errRefTooLong    = fmt.Errorf("repository name must not be more than %d characters", maxPathLen)
)

// Normalize returns the fully qualified form of an image reference
// (busybox → docker.io/library/busybox:latest), as distribution/reference's
// ParseDockerRef(ref).String() does: a reference with both a tag and a
// digest keeps the digest alone.
//
// It follows that package's grammar (regexp.go) with a hand-written
// parser instead of its package-level regular expressions, so it costs
// no memory before it is called.
func Normalize(ref string) (string, error) {
	s, err := normalize(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	return s, nil
}

// normalize is ParseDockerRef(s).String(), by way of ParseNormalizedNamed.
func normalize(s string) (string, error) {
	if isIdentifier(s) {
		return "", errRefIdentifier
	}
	domain, remainder := splitDockerDomain(s)
	remote := remainder
	if i := strings.IndexByte(remainder, ':'); i >= 0 {
		remote = remainder[:i]
	}
	if strings.ToLower(remote) != remote {
		return "", errRefUppercase
	}
	name, tag, dgst, err := parseRef(domain + "/" + remainder)
	if err != nil {
		return "", err
	}
	switch {
	case dgst != "":
		return name + "@" + dgst, nil
	case tag != "":
		return name + ":" + tag, nil
	default:
		return name + ":" + defaultTag, nil
	}
}

// splitDockerDomain splits a name into its domain and the rest, the
// default domain when it has none: distribution/reference's function of
// the same name, as is.
func splitDockerDomain(name string) (domain, remoteName string) {
	maybeDomain, maybeRemoteName, ok := strings.Cut(name, "/")
	if !ok {
		// A familiar name, such as "ubuntu" or "ubuntu:latest".
		return defaultDomain, officialRepoPrefix + name
	}
	switch {
	case maybeDomain == "localhost":
		domain, remoteName = maybeDomain, maybeRemoteName
	case maybeDomain == legacyDefaultDomain:
		domain, remoteName = defaultDomain, maybeRemoteName
	case strings.ContainsAny(maybeDomain, ".:"):
		domain, remoteName = maybeDomain, maybeRemoteName
	case strings.ToLower(maybeDomain) != maybeDomain:
		// Uppercase namespaces are not allowed: a domain.
		domain, remoteName = maybeDomain, maybeRemoteName
	default:
		domain, remoteName = defaultDomain, name
	}
	if domain == defaultDomain && !strings.ContainsRune(remoteName, '/') {
		remoteName = officialRepoPrefix + remoteName
	}
	return domain, remoteName
}

// parseRef splits s into name, tag and digest as reference.Parse does:
// s must match ReferenceRegexp, anchored
// (name)(?::(tag))?(?:@(digest))?, the repository path must not be
// longer than maxPathLen, and the digest must be one go-digest accepts.
// A match of s in lower case names the uppercase as the fault.
func parseRef(s string) (name, tag, dgst string, err error) {
	name, tag, dgst, ok := splitRef(s)
	if !ok {
		if lower := strings.ToLower(s); lower != s {
			if _, _, _, ok := splitRef(lower); ok {
				return "", "", "", errRefUppercase
			}
		}
		return "", "", "", errRefFormat
	}
	if len(repoPath(name)) > maxPathLen {
		return "", "", "", errRefTooLong
	}
	if dgst != "" {
		if _, err := digest.Parse(dgst); err != nil {
			return "", "", "", err
		}
	}
	return name, tag, dgst, nil
}

// splitRef matches s against ReferenceRegexp. Neither the name nor the
// tag holds an '@', so the digest is what follows the first one; a tag
// holds neither ':' nor '/' and a name has ':' only in its domain, before
// its first '/', so the tag is what follows a last ':' after the last '/'.
func splitRef(s string) (name, tag, dgst string, ok bool) {
	name = s
	if i := strings.IndexByte(s, '@'); i >= 0 {
		name, dgst = s[:i], s[i+1:]
		if !isDigestPat(dgst) {
			return "", "", "", false
		}
	}
	if i := strings.LastIndexByte(name, ':'); i >= 0 && i > strings.LastIndexByte(name, '/') {
		name, tag = name[:i], name[i+1:]
		if !isTag(tag) {
			return "", "", "", false
		}
	}
	if repoPath(name) == "" {
		return "", "", "", false
	}
	return name, tag, dgst, true
}

// repoPath returns the path of name, which follows its domain, or ""
// when name is not one: namePat is optional(domainAndPort "/")
// remoteName, and a domain holds no '/', so it is all before the first
// '/' when that is a domain and the rest a remote name.
func repoPath(name string) string {
	if d, rest, ok := strings.Cut(name, "/"); ok && isDomainAndPort(d) && isRemoteName(rest) {
		return rest
	}
	if isRemoteName(name) {
		return name
	}
	return ""
}

// isRemoteName matches remoteName: path components joined by '/'.
func isRemoteName(s string) bool {
	for {
		c, rest, more := strings.Cut(s, "/")
		if !isPathComponent(c) {
			return false
		}
		if !more {
			return true
		}
		s = rest
	}
}

// isPathComponent matches pathComponent: runs of [a-z0-9] joined by one
// separator each, a separator being '.', '_', "__" or one or more '-'.
func isPathComponent(s string) bool {
	if s == "" || !isLowerAlnum(s[0]) {
		return false
	}
	for i := 0; i < len(s); {
		if isLowerAlnum(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && !isLowerAlnum(s[j]) {
			j++
		}
		if j == len(s) {
			return false // ends in a separator
		}
		switch sep := s[i:j]; {
		case sep == "." || sep == "_" || sep == "__":
		case strings.Trim(sep, "-") == "":
		default:
			return false
		}
		i = j
	}
	return true
}

// isDomainAndPort matches domainAndPort: a host name of components
// joined by '.' or an IPv6 address in brackets, and an optional port.
func isDomainAndPort(s string) bool {
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return false
		}
		host, port = s[:end+1], s[end+1:]
		if len(host) == 2 || strings.Trim(host[1:end], "0123456789abcdefABCDEF:") != "" {
			return false
		}
	} else {
		if i := strings.IndexByte(s, ':'); i >= 0 {
			host, port = s[:i], s[i:]
		}
		if !isDomainName(host) {
			return false
		}
	}
	if port == "" {
		return true
	}
	return len(port) > 1 && port[0] == ':' && strings.Trim(port[1:], "0123456789") == ""
}

// isDomainName matches domainName: components of [a-zA-Z0-9-], each
// starting and ending with a letter or digit, joined by '.'.
func isDomainName(s string) bool {
	for {
		c, rest, more := strings.Cut(s, ".")
		if c == "" || !isAlnum(c[0]) || !isAlnum(c[len(c)-1]) {
			return false
		}
		for i := 0; i < len(c); i++ {
			if !isAlnum(c[i]) && c[i] != '-' {
				return false
			}
		}
		if !more {
			return true
		}
		s = rest
	}
}

// isTag matches tag: [\w][\w.-]{0,127}.
func isTag(s string) bool {
	if s == "" || len(s) > 128 || !isWord(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isWord(s[i]) && s[i] != '.' && s[i] != '-' {
			return false
		}
	}
	return true
}

// isDigestPat matches digestPat: an algorithm of components each
// starting with a letter, joined by one of "-_+.", then ':' and at least
// 32 hexadecimal digits.
func isDigestPat(s string) bool {
	alg, hex, ok := strings.Cut(s, ":")
	if !ok || len(hex) < 32 || strings.Trim(hex, "0123456789abcdefABCDEF") != "" {
		return false
	}
	start := true // at the start of an algorithm component
	for i := 0; i < len(alg); i++ {
		c := alg[i]
		switch {
		case start:
			if !isLetter(c) {
				return false
			}
			start = false
		case strings.IndexByte("-_+.", c) >= 0:
			start = true
		case !isLetter(c) && !isDigit(c):
			return false
		}
	}
	return !start
}

// isIdentifier matches anchoredIdentifierRegexp: 64 of [a-f0-9].
func isIdentifier(s string) bool {
	return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == ""
}

func isDigit(c byte) bool      { return '0' <= c && c <= '9' }
func isLetter(c byte) bool     { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isAlnum(c byte) bool      { return isLetter(c) || isDigit(c) }
func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || isDigit(c) }
func isWord(c byte) bool       { return isAlnum(c) || c == '_' }
