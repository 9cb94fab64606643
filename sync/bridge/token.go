package bridge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	tokenCheck          = time.Minute // how often tokens are looked at
	tokenRefreshPercent = 80
	tokenMaxAge         = 24 * time.Hour
)

// syncTokens keeps a tokens Secret (mqtt.TokensSecretName) in the node's
// store for every pod with projected serviceAccountToken sources, as a
// bridge-made (MQTT) object the publisher sends (sealed to the node, as
// every Secret); the node's publisher runs it before each pass and every
// tokenCheck. A token is requested when it is missing or due.
//
// A signing bridge also keeps a copy of each tokens Secret on the broker
// for itself, sealed to its own key (mqtt.BridgeTokensTopic): a bridge
// restarted (its store starts empty) first reads those back, so a
// restart requests and sends no token again before it is due. Without a
// signing key it has no key that outlives it: a restarted bridge
// requests every token anew.
func (n *node) syncTokens(ctx context.Context, conn mqtt.Conn) {
	recs, err := n.st.Pods().List()
	if err != nil {
		n.b.log.Warn("read pods for their tokens", "node", n.name, "err", err)
		return
	}
	var pods []*corev1.Pod
	for _, r := range recs {
		if p := r.Object; r.Source == store.SourceAPI && p.DeletionTimestamp == nil && len(tokenSources(p)) > 0 {
			pods = append(pods, p)
		}
	}
	n.recoverTokens(ctx, conn, pods)
	want := map[string]bool{}
	for _, p := range pods {
		name := mqtt.TokensSecretName(p.Name)
		want[name] = true
		old, _, err := n.st.Secrets().Get(p.Namespace, name)
		if err != nil {
			continue
		}
		sec := n.tokensSecret(ctx, p, tokenSources(p), old.Object)
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
		if r.Source != store.SourceMQTT || r.Object.Type != mqtt.TokensSecretType {
			continue
		}
		if want[r.Object.Name] {
			n.copyTokens(ctx, conn, r.Object)
			continue
		}
		n.st.Secrets().Delete(r.Object.Namespace, r.Object.Name)
		if n.b.vault != nil {
			topic := mqtt.BridgeTokensTopic(n.name, r.Object.Namespace, r.Object.Name)
			if err := n.b.request(ctx, func(ctx context.Context) error { return conn.Publish(ctx, topic, true, nil) }); err != nil {
				n.b.log.Warn("remove the bridge's copy of pod tokens", "node", n.name, "topic", topic, "err", err)
				continue
			}
			delete(n.copied, r.Object.Name)
		}
	}
}

// copyTokens publishes the bridge's own copy of a tokens Secret, sealed
// to its own key and signed, when the copy on the broker is not of it.
// A copy that failed is tried again at the next pass.
func (n *node) copyTokens(ctx context.Context, conn mqtt.Conn, sec *corev1.Secret) {
	if n.b.vault == nil {
		return
	}
	body, err := sec.Marshal()
	if err != nil {
		return
	}
	h := mqtt.BodyHash(body)
	if n.copied[sec.Name] == h {
		return
	}
	sealed, err := n.b.vault.PublicKey().Seal(body)
	if err != nil {
		n.b.log.Warn("seal the bridge's copy of pod tokens", "node", n.name, "secret", sec.Namespace+"/"+sec.Name, "err", err)
		return
	}
	topic := mqtt.BridgeTokensTopic(n.name, sec.Namespace, sec.Name)
	payload := n.b.seal(topic, mqtt.Envelope{Kind: "Secret", Generation: n.b.nextGen(), Encoding: mqtt.EncodingSealed, Issued: n.b.deps.Clock.Now(), Body: sealed})
	if err := n.b.request(ctx, func(ctx context.Context) error { return conn.Publish(ctx, topic, true, payload) }); err != nil {
		n.b.log.Warn("keep the bridge's copy of pod tokens on the broker", "node", n.name, "topic", topic, "err", err)
		return
	}
	if n.copied == nil {
		n.copied = map[string]string{}
	}
	n.copied[sec.Name] = h
}

// recoverTokens puts into the store the tokens Secrets the bridge's own
// copies on the broker hold for pods whose Secret the store lacks (and
// the node's index lists), when they are for the same pod (its UID).
func (n *node) recoverTokens(ctx context.Context, conn mqtt.Conn, pods []*corev1.Pod) {
	if n.b.vault == nil {
		return
	}
	have, _ := n.b.retainedIndex(mqtt.NodeIndexTopic(n.name))
	byTopic := map[string]*corev1.Pod{}
	for _, p := range pods {
		name := mqtt.TokensSecretName(p.Name)
		if _, ok := have.Entries[mqtt.IndexKey(mqtt.KindSecrets, p.Namespace, name)]; !ok {
			continue
		}
		if _, ok, err := n.st.Secrets().Get(p.Namespace, name); err != nil || ok {
			continue
		}
		byTopic[mqtt.BridgeTokensTopic(n.name, p.Namespace, name)] = p
	}
	if len(byTopic) == 0 {
		return
	}
	got, err := n.b.fetchRetained(ctx, conn, slices.Sorted(maps.Keys(byTopic)))
	if err != nil {
		n.b.log.Warn("read back the pods' tokens the broker retains; requesting them anew", "node", n.name, "err", err)
		return
	}
	for topic, payload := range got {
		p := byTopic[topic]
		sec, err := n.b.tokensFromPayload(topic, payload, p)
		if err != nil {
			n.b.log.Info("pod tokens on the broker not used; requesting them anew", "node", n.name, "topic", topic, "reason", err)
			continue
		}
		if err := n.st.Secrets().Put(store.SourceMQTT, sec); err != nil {
			n.b.log.Warn("keep pod tokens", "node", n.name, "pod", p.Namespace+"/"+p.Name, "err", err)
			continue
		}
		if body, err := sec.Marshal(); err == nil {
			if n.copied == nil {
				n.copied = map[string]string{}
			}
			n.copied[sec.Name] = mqtt.BodyHash(body)
		}
	}
}

// tokensFromPayload decodes the bridge's copy of pod p's tokens Secret
// at topic: signed by the bridge's key and sealed to it.
func (b *Bridge) tokensFromPayload(topic string, payload []byte, p *corev1.Pod) (*corev1.Secret, error) {
	if b.vault == nil {
		return nil, errors.New("the bridge has no key of its own")
	}
	e, err := mqtt.UnmarshalEnvelope(payload)
	if err != nil {
		return nil, err
	}
	if err := b.checkOwn(topic, payload, e); err != nil {
		return nil, err
	}
	if e.Kind != "Secret" || e.Encoding != mqtt.EncodingSealed {
		return nil, fmt.Errorf("a %s %s, not a sealed Secret", e.Kind, e.Encoding)
	}
	body, err := b.vault.Open(e.Body)
	if err != nil {
		return nil, err
	}
	sec := &corev1.Secret{}
	if err := sec.Unmarshal(body); err != nil {
		return nil, fmt.Errorf("secret: %w", err)
	}
	switch {
	case sec.Namespace != p.Namespace || sec.Name != mqtt.TokensSecretName(p.Name):
		return nil, fmt.Errorf("names %s/%s", sec.Namespace, sec.Name)
	case sec.Type != mqtt.TokensSecretType:
		return nil, fmt.Errorf("type %q", sec.Type)
	case sec.Annotations[mqtt.TokensUIDAnnotation] != string(p.UID):
		return nil, fmt.Errorf("for pod UID %q, not %q", sec.Annotations[mqtt.TokensUIDAnnotation], p.UID)
	}
	return sec, nil
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
		tok, exp, err := n.token(ctx, p, src)
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
