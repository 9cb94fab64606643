package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/outpost-edge/outpost/store"
)

// ownedStatusFields are the top-level fields of a pod's status that the
// node owns, as kubelet does. A status patch sets each of them: to the
// journaled value, or to null when the journaled status has none, so a
// value the server kept from before (an agent restart, an outage) is
// cleared. The other fields belong to someone else and are never sent:
// qosClass (computed by the API server at creation and immutable),
// nominatedNodeName (the scheduler), the resource claim statuses (the
// scheduler and DRA drivers, which NodeRestriction forbids a node to
// change), observedGeneration, resize, allocatedResources, resources
// and volumeHealth (features this agent does not have).
var ownedStatusFields = []string{
	"phase", "conditions", "message", "reason",
	"hostIP", "hostIPs", "podIP", "podIPs", "startTime",
	"initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses",
}

// ownedConditions are the pod conditions the node sets, as kubelet does.
// Others (DisruptionTarget from an eviction, readiness gates' conditions)
// belong to whoever set them and are kept.
var ownedConditions = []corev1.PodConditionType{
	corev1.PodScheduled, corev1.PodReadyToStartContainers, corev1.PodInitialized,
	corev1.ContainersReady, corev1.PodReady,
}

// replacedLists are the owned list fields with a merge key (the IP) that
// a patch replaces whole, as a full status has them, with a "$patch:
// replace" element. The container status lists have no patch strategy:
// a strategic merge patch replaces them whole already, and would take
// such an element for a container status of its own.
var replacedLists = map[string]bool{"hostIPs": true, "podIPs": true}

// statusPatch returns the strategic merge patch that makes the status of
// the pod with the given UID on the server equal st in every field the
// node owns, without touching the others. metadata.uid in the patch is a
// precondition: the API server refuses it (422, uid is immutable) when the
// pod of that name has another UID (it was deleted and created again).
//
// kubelet computes its patch against the status it read; a node may PATCH
// pods/status but not GET it, and after an agent restart or an outage it
// does not know what the server holds. So every owned field is set: a
// scalar to its value or null; the lists whole (the IP lists, which have
// a merge key, with a "$patch: replace" element); the conditions merged by type, ours
// set and those of ours that no longer apply deleted, so that conditions
// others set, such as the DisruptionTarget of an eviction, stay.
func statusPatch(uid types.UID, st *corev1.PodStatus) ([]byte, error) {
	if uid == "" {
		return nil, errors.New("status patch: no pod uid")
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("status patch: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("status patch: %w", err)
	}
	status := make(map[string]any, len(ownedStatusFields))
	for _, f := range ownedStatusFields {
		v, ok := fields[f]
		switch {
		case f == "conditions":
			status[f] = conditionsPatch(st.Conditions)
		case !ok:
			status[f] = nil
		case replacedLists[f]:
			var items []json.RawMessage
			if err := json.Unmarshal(v, &items); err != nil {
				return nil, fmt.Errorf("status patch: %s: %w", f, err)
			}
			status[f] = append(items, json.RawMessage(`{"$patch":"replace"}`))
		default:
			status[f] = v
		}
	}
	// encoding/json sorts map keys: the same status gives the same bytes.
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": uid},
		"status":   status,
	})
}

// conditionsPatch is the conditions part of a status patch: the status's
// conditions, merged by type on the server, and a delete directive for
// each condition the node owns that the status lacks.
func conditionsPatch(conds []corev1.PodCondition) []any {
	out := make([]any, 0, len(ownedConditions)+len(conds))
	have := map[corev1.PodConditionType]bool{}
	for _, c := range conds {
		// A merged condition keeps the fields the patch omits: a reason
		// and message left from when it was False would stay on it once
		// True. Empty ones are deleted (null).
		m := map[string]any{"type": c.Type, "status": c.Status, "lastTransitionTime": c.LastTransitionTime,
			"lastProbeTime": nil, "reason": nil, "message": nil}
		if !c.LastProbeTime.IsZero() {
			m["lastProbeTime"] = c.LastProbeTime
		}
		if c.Reason != "" {
			m["reason"] = c.Reason
		}
		if c.Message != "" {
			m["message"] = c.Message
		}
		if c.ObservedGeneration != 0 {
			m["observedGeneration"] = c.ObservedGeneration
		}
		out = append(out, m)
		have[c.Type] = true
	}
	for _, t := range ownedConditions {
		if !have[t] {
			out = append(out, map[string]string{"type": string(t), "$patch": "delete"})
		}
	}
	return out
}

// journalPod decodes a journal entry of a pod status: the pod's
// namespace, name and UID, and its status. The key must name the same
// pod as the value. The bytes come from the store, but a store written
// by another version, or damaged, is outside input: nothing here may
// panic on it.
func journalPod(e store.Entry) (*corev1.Pod, error) {
	rest, ok := strings.CutPrefix(e.Key, "pod/")
	if !ok {
		return nil, fmt.Errorf("journal entry %s: not a pod status", e.Key)
	}
	ns, name, ok := strings.Cut(rest, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("journal entry %s: key is not pod/NAMESPACE/NAME", e.Key)
	}
	var p corev1.Pod
	if err := p.Unmarshal(e.Value); err != nil {
		return nil, fmt.Errorf("journal entry %s: %w", e.Key, err)
	}
	if p.Namespace != ns || p.Name != name {
		return nil, fmt.Errorf("journal entry %s: holds the status of pod %s/%s", e.Key, p.Namespace, p.Name)
	}
	if p.UID == "" {
		return nil, fmt.Errorf("journal entry %s: no pod uid", e.Key)
	}
	return &p, nil
}

// statusPatchOf is journalPod then statusPatch, for the fuzz test: the
// whole path from journal bytes to request body.
func statusPatchOf(e store.Entry) ([]byte, error) {
	p, err := journalPod(e)
	if err != nil {
		return nil, err
	}
	return statusPatch(p.UID, &p.Status)
}

// terminalStatus reports whether st is the status of a pod that is over:
// its phase is Succeeded or Failed and none of its containers runs. For a
// pod being deleted, it is what kubelet's status manager waits for before
// the final delete (canBeDeleted).
func terminalStatus(st *corev1.PodStatus) bool {
	if st.Phase != corev1.PodSucceeded && st.Phase != corev1.PodFailed {
		return false
	}
	for _, list := range [][]corev1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses, st.EphemeralContainerStatuses} {
		for _, cs := range list {
			if cs.State.Running != nil {
				return false
			}
		}
	}
	return true
}
