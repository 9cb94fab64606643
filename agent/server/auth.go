package server

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// User is an authenticated client.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
	// FromCert is set for a user named by a verified client certificate:
	// only such users can be authorized while the API server is away.
	FromCert bool
}

// Reviewer asks the API server about bearer tokens (TokenReview) and
// access (SubjectAccessReview); sync/kube implements it.
type Reviewer interface {
	// ReviewToken returns the token's user; ok is false for a token the
	// API server rejects, err for a review that could not be made.
	ReviewToken(ctx context.Context, token string) (u User, ok bool, err error)
	// Authorize says whether u may do verb on nodes/<subresource> of
	// node; reason explains a denial.
	Authorize(ctx context.Context, u User, verb, subresource, node string) (allowed bool, reason string, err error)
}

// GuardConfig says whom a Guard lets in.
type GuardConfig struct {
	// ClientCAs verify client certificates; nil accepts none.
	ClientCAs *x509.CertPool
	// Anonymous lets requests without credentials in as
	// system:anonymous (they are still authorized).
	Anonymous bool
	// LocalGroups are the groups whose certificate users are authorized
	// when the API server cannot be asked.
	LocalGroups []string
}

// GuardDeps are a Guard's collaborators; Clock and Log are required.
type GuardDeps struct {
	// Reviewer is nil when nobody can be asked (standalone).
	Reviewer Reviewer
	Clock    clock.Clock
	Log      *slog.Logger
}

// Guard authenticates and authorizes kubelet API requests as kubelet
// does, for the agent's own API and for the bridge, which serves it for
// its MQTT nodes with the same rules.
type Guard struct {
	cfg       GuardConfig
	deps      GuardDeps
	clientCAs *x509.CertPool
	tokens    ttlCache[tokenResult]
	decisions ttlCache[decision]
}

// NewGuard returns a Guard.
func NewGuard(cfg GuardConfig, deps GuardDeps) *Guard {
	return &Guard{cfg: cfg, deps: deps, clientCAs: cfg.ClientCAs}
}

// Check authenticates r and authorizes it on node's kubelet API. status
// is 0 when r may go on, else 401, 403 or 500 with msg to answer, as
// kubelet answers.
func (s *Guard) Check(r *http.Request, node string) (status int, msg string) {
	u, status, msg := s.authenticate(r)
	if status != 0 {
		return status, msg
	}
	return s.authorize(r, u, node)
}

// LoadClientCAs reads a PEM file of client certificate authorities.
func LoadClientCAs(path string) (*x509.CertPool, error) { return loadClientCAs(path) }

// Cache lifetimes, kubelet's defaults for its webhook authenticator and
// authorizer; stale decisions stand in while the API server is away.
const (
	tokenOKTTL     = 2 * time.Minute
	tokenBadTTL    = 30 * time.Second
	allowedTTL     = 5 * time.Minute
	deniedTTL      = 30 * time.Second
	staleAllowance = 24 * time.Hour
	cacheMax       = 1024
)

type cached[T any] struct {
	val     T
	expires time.Time
	seen    time.Time
}

// ttlCache is a small map of decisions with expiry; when full, the
// oldest entry makes room.
type ttlCache[T any] struct {
	mu sync.Mutex
	m  map[string]cached[T]
}

// get returns the entry for key, and whether it has not expired.
func (c *ttlCache[T]) get(key string, now time.Time) (e cached[T], fresh, found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e, ok && now.Before(e.expires), ok
}

func (c *ttlCache[T]) put(key string, v T, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cached[T]{}
	}
	if _, ok := c.m[key]; !ok && len(c.m) >= cacheMax {
		oldest, first := "", true
		var t time.Time
		for k, e := range c.m {
			if first || e.seen.Before(t) {
				oldest, t, first = k, e.seen, false
			}
		}
		delete(c.m, oldest)
	}
	c.m[key] = cached[T]{val: v, expires: now.Add(ttl), seen: now}
}

type tokenResult struct {
	user User
	ok   bool
}

type decision struct {
	allowed bool
	reason  string
}

// authenticate names the request's user: a client certificate that
// verifies against the client CA, else a bearer token the API server
// accepts, else anonymous when allowed. As kubelet's union of
// authenticators, a certificate that does not verify does not stop a
// valid token, but it does stop anonymous. status is 0, or 401 with msg.
func (s *Guard) authenticate(r *http.Request) (u User, status int, msg string) {
	certErr := ""
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && s.clientCAs != nil {
		certs := r.TLS.PeerCertificates
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{
			Roots: s.clientCAs, Intermediates: inter,
			CurrentTime: s.deps.Clock.Now(),
			KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err == nil {
			return User{Name: certs[0].Subject.CommonName, Groups: slices.Clone(certs[0].Subject.Organization), FromCert: true}, 0, ""
		}
		certErr = "client certificate: " + err.Error()
	}
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, ok := strings.Cut(h, " ")
		token = strings.TrimSpace(token)
		if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
			return u, http.StatusUnauthorized, "Authorization header: not a bearer token"
		}
		return s.authenticateToken(r.Context(), token)
	}
	if certErr != "" {
		return u, http.StatusUnauthorized, certErr
	}
	if s.cfg.Anonymous {
		return User{Name: "system:anonymous", Groups: []string{"system:unauthenticated"}}, 0, ""
	}
	return u, http.StatusUnauthorized, "Unauthorized"
}

func (s *Guard) authenticateToken(ctx context.Context, token string) (User, int, string) {
	if s.deps.Reviewer == nil {
		return User{}, http.StatusUnauthorized, "bearer tokens need the API server, and the agent runs standalone"
	}
	sum := sha256.Sum256([]byte(token))
	key := hex.EncodeToString(sum[:])
	now := s.deps.Clock.Now()
	if e, fresh, _ := s.tokens.get(key, now); fresh {
		if !e.val.ok {
			return User{}, http.StatusUnauthorized, "Unauthorized"
		}
		return e.val.user, 0, ""
	}
	u, ok, err := s.deps.Reviewer.ReviewToken(ctx, token)
	if err != nil {
		// Fail closed: a token cannot be checked without the API server.
		s.deps.Log.Warn("kubelet api: token review failed", "err", err)
		return User{}, http.StatusUnauthorized, "Unauthorized: the token cannot be checked now"
	}
	ttl := tokenOKTTL
	if !ok {
		ttl = tokenBadTTL
	}
	s.tokens.put(key, tokenResult{user: u, ok: ok}, now, ttl)
	if !ok {
		return User{}, http.StatusUnauthorized, "Unauthorized"
	}
	return u, 0, ""
}

// attributes maps a request to the verb and nodes subresource kubelet
// authorizes it as.
func attributes(r *http.Request) (verb, subresource string) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		verb = "get"
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	}
	p := r.URL.Path
	switch {
	case p == "/stats" || strings.HasPrefix(p, "/stats/"):
		subresource = "stats"
	case p == "/metrics" || strings.HasPrefix(p, "/metrics/"):
		subresource = "metrics"
	case p == "/logs" || strings.HasPrefix(p, "/logs/"):
		subresource = "log"
	case p == "/spec" || strings.HasPrefix(p, "/spec/"):
		subresource = "spec"
	default:
		subresource = "proxy"
	}
	return verb, subresource
}

// fineGrained is the subresource kubelet (KubeletFineGrainedAuthz) checks
// first for a path, before falling back to proxy.
func fineGrained(path string) string {
	switch path {
	case "/pods":
		return "pods"
	case "/healthz":
		return "healthz"
	}
	return ""
}

// authorize says whether u may make request r. status is 0, or 403 with
// msg, or 500 when the API server cannot be asked and no earlier
// decision or local group stands in: kubelet's answer to an authorizer
// error, which tells the client to retry rather than that it is denied.
func (s *Guard) authorize(r *http.Request, u User, node string) (status int, msg string) {
	verb, sub := attributes(r)
	subs := []string{sub}
	if fg := fineGrained(r.URL.Path); fg != "" {
		subs = []string{fg, sub}
	}
	reason, unasked := "", ""
	for _, sr := range subs {
		d, ok := s.allowed(r.Context(), u, verb, sr, node)
		if !ok {
			// Unlike kubelet, which stops at the first error, proxy is
			// still tried: a decision kept for it may stand offline.
			unasked = sr
			continue
		}
		if d.allowed {
			return 0, ""
		}
		reason = d.reason
	}
	if unasked != "" {
		return http.StatusInternalServerError, "Authorization error (user=" + u.Name + ", verb=" + verb +
			", resource=nodes, subresource=" + unasked + "): the API server cannot be asked now"
	}
	msg = "Forbidden (user=" + u.Name + ", verb=" + verb + ", resource=nodes, subresource=" + sub + ")"
	if reason != "" {
		msg += ": " + reason
	}
	return http.StatusForbidden, msg
}

// allowed asks the API server, through the cache; ok is false when
// there is no decision. When the API server cannot be asked, a decision
// made for the same question within a day stands; failing that, only a
// certificate user in one of the local groups is let in, so an operator
// with an admin certificate can still debug an offline node while
// tokens fail closed.
func (s *Guard) allowed(ctx context.Context, u User, verb, sub, node string) (d decision, ok bool) {
	local := u.FromCert && slices.ContainsFunc(u.Groups, func(g string) bool { return slices.Contains(s.cfg.LocalGroups, g) })
	if s.deps.Reviewer == nil {
		if local {
			return decision{allowed: true}, true
		}
		return decision{reason: "the agent runs standalone: only client certificates of the groups in server.localGroups are authorized"}, true
	}
	key := strings.Join([]string{node, u.Name, u.UID, strings.Join(u.Groups, ","), verb, sub}, "\x00")
	now := s.deps.Clock.Now()
	e, fresh, found := s.decisions.get(key, now)
	if fresh {
		return e.val, true
	}
	allowed, reason, err := s.deps.Reviewer.Authorize(ctx, u, verb, sub, node)
	if err != nil {
		s.deps.Log.Warn("kubelet api: subject access review failed", "user", u.Name, "err", err)
		if found && now.Sub(e.seen) < staleAllowance {
			return e.val, true
		}
		if local {
			return decision{allowed: true}, true
		}
		return decision{}, false
	}
	ttl := allowedTTL
	if !allowed {
		ttl = deniedTTL
	}
	d = decision{allowed, reason}
	s.decisions.put(key, d, now, ttl)
	return d, true
}
