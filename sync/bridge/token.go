package bridge

import (
	"context"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/sync/mqtt"
)

// The tokens of an MQTT node's pods (sync/mqtt's token.go says how they
// travel). The bridge asks the API server for them as kubelet does for
// its pods, and renews them on kubelet's schedule: once 80 % of a token's
// lifetime passed, or it is a day old.
const (
	tokenCheck          = time.Minute
	tokenRefreshPercent = 80
	tokenMaxAge         = 24 * time.Hour
)

// runTokens keeps a tokens Secret (mqtt.TokensSecretName) in the node's
// store for every pod with projected serviceAccountToken sources, as a
// bridge-made (MQTT) object the publisher sends, until ctx ends.
func (n *node) runTokens(ctx context.Context) {
	pods, cancel := n.st.Subscribe(store.KindPod)
	defer cancel()
	tick := n.b.deps.Clock.NewTicker(tokenCheck)
	defer tick.Stop()
	for {
		n.syncTokens(ctx)
		select {
		case <-ctx.Done():
			return
		case <-pods:
		case <-tick.C():
		}
	}
}

func (n *node) syncTokens(ctx context.Context) {
	recs, err := n.st.Pods().List()
	if err != nil {
		n.b.log.Warn("read pods for their tokens", "node", n.name, "err", err)
		return
	}
	want := map[string]bool{}
	for _, r := range recs {
		p := r.Object
		if r.Source != store.SourceAPI || p.DeletionTimestamp != nil {
			continue
		}
		srcs := tokenSources(p)
		if len(srcs) == 0 {
			continue
		}
		name := mqtt.TokensSecretName(p.Name)
		want[name] = true
		old, _, err := n.st.Secrets().Get(p.Namespace, name)
		if err != nil {
			continue
		}
		sec := n.tokensSecret(ctx, p, srcs, old.Object)
		if sec == nil {
			continue
		}
		if err := n.st.Secrets().Put(store.SourceMQTT, sec); err != nil {
			n.b.log.Warn("keep pod tokens", "node", n.name, "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	}
	secs, err := n.st.Secrets().List()
	if err != nil {
		return
	}
	for _, r := range secs {
		if r.Source == store.SourceMQTT && r.Object.Type == mqtt.TokensSecretType && !want[r.Object.Name] {
			n.st.Secrets().Delete(r.Object.Namespace, r.Object.Name)
		}
	}
}

// tokensSecret returns the pod's tokens Secret with every token that is
// missing or due requested anew, or nil when old needs no change.
func (n *node) tokensSecret(ctx context.Context, p *corev1.Pod, srcs []*corev1.ServiceAccountTokenProjection, old *corev1.Secret) *corev1.Secret {
	now := n.b.deps.Clock.Now()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: mqtt.TokensSecretName(p.Name), Annotations: map[string]string{mqtt.TokensUIDAnnotation: string(p.UID)}},
		Type:       mqtt.TokensSecretType,
		Data:       map[string][]byte{},
	}
	if old != nil && old.Annotations[mqtt.TokensUIDAnnotation] == string(p.UID) {
		maps.Copy(sec.Data, old.Data)
	}
	changed := old == nil || old.Annotations[mqtt.TokensUIDAnnotation] != string(p.UID)
	keep := map[string]bool{}
	for _, src := range srcs {
		key := mqtt.TokenDataKey(p, src)
		keep[key], keep[key+".expires"], keep[key+".issued"] = true, true, true
		if !tokenDue(sec.Data, key, now) {
			continue
		}
		tok, exp, err := n.pods.PodToken(ctx, p, src)
		if err != nil {
			n.b.log.Warn("request a pod's service account token", "node", n.name, "pod", p.Namespace+"/"+p.Name, "err", err)
			continue
		}
		sec.Data[key] = []byte(tok)
		sec.Data[key+".expires"] = []byte(exp.UTC().Format(time.RFC3339))
		sec.Data[key+".issued"] = []byte(now.UTC().Format(time.RFC3339))
		changed = true
	}
	for k := range sec.Data {
		if !keep[k] {
			delete(sec.Data, k)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return sec
}

// tokenDue reports whether the token under key is missing or due for
// renewal at now.
func tokenDue(data map[string][]byte, key string, now time.Time) bool {
	if len(data[key]) == 0 {
		return true
	}
	exp, err1 := time.Parse(time.RFC3339, string(data[key+".expires"]))
	issued, err2 := time.Parse(time.RFC3339, string(data[key+".issued"]))
	if err1 != nil || err2 != nil || now.Before(issued) {
		return true
	}
	life := exp.Sub(issued)
	return !now.Before(issued.Add(tokenMaxAge)) || !now.Before(issued.Add(life*tokenRefreshPercent/100))
}

// tokenSources returns the projected serviceAccountToken sources of the
// pod's volumes.
func tokenSources(p *corev1.Pod) []*corev1.ServiceAccountTokenProjection {
	var out []*corev1.ServiceAccountTokenProjection
	for i := range p.Spec.Volumes {
		pr := p.Spec.Volumes[i].Projected
		if pr == nil {
			continue
		}
		for j := range pr.Sources {
			if s := pr.Sources[j].ServiceAccountToken; s != nil {
				out = append(out, s)
			}
		}
	}
	return out
}
