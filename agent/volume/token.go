package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// TokenFunc asks the API server for a service account token for one
// projected serviceAccountToken source of pod, bound to the pod, and
// returns it with the expiry the API server gives.
type TokenFunc func(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (token string, expires time.Time, err error)

const (
	// tokenMaxAge and tokenRefreshPercent are kubelet's token manager's
	// (requiresRefresh): a token is replaced once 80% of its lifetime has
	// passed, or when it is a day old.
	tokenMaxAge         = 24 * time.Hour
	tokenRefreshPercent = 80
	// tokenDefaultLife stands for a lifetime that the node's clock makes
	// zero or negative (it is far ahead of the API server's).
	tokenDefaultLife = time.Hour
	// tokenRetry is how long a failed refresh waits before the next one
	// while the pod still has its token, so an unreachable API server is
	// not asked at every pod sync.
	tokenRetry = time.Minute
	// tokensDirName is the directory in PodsDir/<uid> that keeps the pod's
	// tokens on disk, so they survive a reboot without the API server.
	tokensDirName = "tokens"
)

// tokenKey names one serviceAccountToken source of a pod.
type tokenKey struct {
	uid    string
	volume string
	source int // index in projected.sources
}

// podToken is a token a pod has, cached in memory and kept on disk.
type podToken struct {
	Token string `json:"token"`
	// Issued is when the token was received, on the node's clock;
	// Expires is when the API server said it expires.
	Issued  time.Time `json:"issued"`
	Expires time.Time `json:"expires"`

	// retryAt is when a refresh may be tried again after one failed;
	// stale says a refresh failed and was logged.
	retryAt time.Time
	stale   bool
}

// refreshDue reports whether the token should be replaced at now, as
// kubelet's token manager decides: 80% of its lifetime has passed, it is
// older than a day, or the clock is before the time it was issued.
func (t *podToken) refreshDue(now time.Time) bool {
	life := t.Expires.Sub(t.Issued)
	if life <= 0 {
		life = tokenDefaultLife
	}
	return now.Before(t.Issued) ||
		!now.Before(t.Issued.Add(tokenMaxAge)) ||
		!now.Before(t.Issued.Add(life*tokenRefreshPercent/100))
}

// serviceAccountToken adds the token file of one projected
// serviceAccountToken source to files, like kubelet's projected volume
// with its token manager. The token is requested from the API server the
// first time and refreshed when refreshDue says so; between refreshes it
// comes from memory, or after a restart from PodsDir/<uid>/tokens. When a
// refresh fails (the API server is unreachable, or the agent has none) the
// pod keeps the token it has, logged once; only a pod that never had one
// gets an error, naming the volume and the source.
func (m *Manager) serviceAccountToken(ctx context.Context, podDir string, pod *corev1.Pod, vol, field string, idx int, src *corev1.ServiceAccountTokenProjection, mode fs.FileMode, files map[string]file) error {
	field += ".serviceAccountToken"
	key := tokenKey{uid: string(pod.UID), volume: vol, source: idx}
	tok := m.cachedToken(podDir, pod, key)
	now := m.deps.Clock.Now()
	if tok == nil || (tok.refreshDue(now) && !now.Before(tok.retryAt)) {
		fresh, err := m.requestToken(ctx, pod, src)
		switch {
		case err == nil:
			if tok != nil && tok.stale {
				m.deps.Log.Info("service account token refreshed", "pod", podName(pod), "volume", vol, "source", field)
			}
			tok = fresh
			m.setToken(key, tok)
			if err := saveToken(podDir, key, tok); err != nil {
				m.deps.Log.Warn("keep service account token on disk", "pod", podName(pod), "volume", vol, "err", err)
			}
		case tok == nil:
			return volErr(pod, vol, "%s: no token: %w", field, err)
		default:
			if !tok.stale {
				m.deps.Log.Warn("service account token not refreshed; the pod keeps the one it has",
					"pod", podName(pod), "volume", vol, "source", field, "expires", tok.Expires, "err", err)
			}
			tok.stale, tok.retryAt = true, now.Add(tokenRetry)
		}
	}
	owner := fsUser(pod)
	if owner != nil || fsGroup(pod) >= 0 {
		// kubelet: 0600, made 0640 by the fsGroup's group read bits.
		mode = 0o600
	}
	clean, err := cleanPath(src.Path)
	if err != nil {
		return volErr(pod, vol, "%s: path %q: %w", field, src.Path, err)
	}
	files[clean] = file{data: []byte(tok.Token), mode: mode, owner: owner}
	return nil
}

// requestToken asks for a token through deps.Tokens: the API server's,
// or the MQTT bridge's. A static pod has no service account there.
func (m *Manager) requestToken(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (*podToken, error) {
	rec, found, err := m.deps.Store.Pods().Get(pod.Namespace, pod.Name)
	switch {
	case err != nil:
		return nil, fmt.Errorf("get the pod from the store: %w", err)
	case !found || rec.Object.UID != pod.UID:
		return nil, errors.New("the pod is not in the store")
	case rec.Source == store.SourceStatic:
		return nil, fmt.Errorf("a pod from source %s has no service account in the API server", rec.Source)
	case m.deps.Tokens == nil:
		return nil, errors.New("the agent is not connected to an API server")
	}
	token, expires, err := m.deps.Tokens(ctx, pod, src)
	if err != nil {
		return nil, err
	}
	if token == "" {
		return nil, errors.New("the API server sent an empty token")
	}
	return &podToken{Token: token, Issued: m.deps.Clock.Now(), Expires: expires}, nil
}

// cachedToken returns the token of key from memory, else from disk (after
// a restart of the agent or a reboot), else nil.
func (m *Manager) cachedToken(podDir string, pod *corev1.Pod, key tokenKey) *podToken {
	m.tokMu.Lock()
	tok := m.tokens[key]
	m.tokMu.Unlock()
	if tok != nil {
		return tok
	}
	tok, err := loadToken(podDir, key)
	if err != nil {
		m.deps.Log.Warn("read service account token kept on disk", "pod", podName(pod), "volume", key.volume, "err", err)
		return nil
	}
	if tok != nil {
		m.setToken(key, tok)
	}
	return tok
}

func (m *Manager) setToken(key tokenKey, tok *podToken) {
	m.tokMu.Lock()
	defer m.tokMu.Unlock()
	m.tokens[key] = tok
}

// forgetTokens drops the cached tokens of a pod.
func (m *Manager) forgetTokens(uid string) {
	m.tokMu.Lock()
	defer m.tokMu.Unlock()
	for k := range m.tokens {
		if k.uid == uid {
			delete(m.tokens, k)
		}
	}
}

// tokenPath is where key's token is kept: PodsDir/<uid>/tokens/<volume>.<source>.
func tokenPath(podDir string, key tokenKey) string {
	return filepath.Join(podDir, tokensDirName, fmt.Sprintf("%s.%d", key.volume, key.source))
}

// loadToken reads key's token from disk; nil when there is none.
func loadToken(podDir string, key tokenKey) (*podToken, error) {
	p := tokenPath(podDir, key)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var tok podToken
	if err := json.Unmarshal(b, &tok); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if tok.Token == "" {
		return nil, fmt.Errorf("%s: no token", p)
	}
	return &tok, nil
}

// saveToken writes key's token to disk, readable by root only, replacing
// the old one with a rename so a crash leaves one or the other.
func saveToken(podDir string, key tokenKey, tok *podToken) error {
	dir := filepath.Join(podDir, tokensDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(tok)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), tokenPath(podDir, key))
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// fsUser is kubelet's FsUserFrom: the user every container of the pod runs
// as (its own runAsUser, else the pod's), nil when one sets none or two
// differ. The token file belongs to that user.
func fsUser(pod *corev1.Pod) *int64 {
	var user *int64
	runAs := func(sc *corev1.SecurityContext) bool {
		var u *int64
		if psc := pod.Spec.SecurityContext; psc != nil && psc.RunAsUser != nil {
			u = psc.RunAsUser
		}
		if sc != nil && sc.RunAsUser != nil {
			u = sc.RunAsUser
		}
		if u == nil || (user != nil && *user != *u) {
			return false
		}
		user = u
		return true
	}
	for i := range pod.Spec.InitContainers {
		if !runAs(pod.Spec.InitContainers[i].SecurityContext) {
			return nil
		}
	}
	for i := range pod.Spec.Containers {
		if !runAs(pod.Spec.Containers[i].SecurityContext) {
			return nil
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		if !runAs(pod.Spec.EphemeralContainers[i].SecurityContext) {
			return nil
		}
	}
	if user == nil {
		return nil
	}
	u := *user
	return &u
}
