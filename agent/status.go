package agent

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/outpost-edge/outpost/agent/staticpods"
	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/report"
	"github.com/outpost-edge/outpost/store"
	corev1 "k8s.io/api/core/v1"
)

// Status is what `outpost status` shows: what the store holds and, when the
// agent is running, what it knows beyond that.
type Status struct {
	Node string `json:"node"`
	// From is "agent" when a running agent answered, "store" when the
	// store file was read directly.
	From           string       `json:"from"`
	Store          StoreInfo    `json:"store"`
	JournalBacklog int          `json:"journalBacklog"`
	Pods           []PodInfo    `json:"pods"`
	Services       []ServiceRow `json:"services"`
	Agent          *AgentInfo   `json:"agent,omitempty"`
}

// StoreInfo describes the store file.
type StoreInfo struct {
	Path   string `json:"path"`
	Bytes  int64  `json:"bytes"`
	Schema int    `json:"schema"`
}

// PodInfo is one desired pod and, when known, its status.
type PodInfo struct {
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	Source     string `json:"source"`
	Containers int    `json:"containers"`
	Images     string `json:"images"`
	// Status is the newest computed status: from the running agent, or
	// from the journal when reading the store alone (absent once a sink
	// has sent it).
	Status *corev1.PodStatus `json:"status,omitempty"`
	// Synced reports whether Status was computed by this running agent
	// from what the runtime says now, rather than read from the journal.
	Synced bool    `json:"synced"`
	Events []Event `json:"events,omitempty"`
}

// ServiceRow is one desired service.
type ServiceRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Source    string `json:"source"`
	Type      string `json:"type"`
	ClusterIP string `json:"clusterIP,omitempty"`
	Ports     string `json:"ports"`
}

// AgentInfo is what only a running agent knows.
type AgentInfo struct {
	Version string `json:"version"`
	// Board is what the board said about itself at start, with its
	// health as read for this status.
	Board          arm.Facts `json:"board"`
	PID            int       `json:"pid"`
	Started        time.Time `json:"started"`
	LastSync       time.Time `json:"lastManifestSync,omitzero"`
	ManifestErrors []string  `json:"manifestErrors,omitempty"`
	// StoreWrites says whether the store takes writes.
	StoreWrites StoreWrites `json:"storeWrites"`
	// Link is the API server or MQTT broker connection; absent when
	// standalone.
	Link *report.Link `json:"link,omitempty"`
	// Proxy is the service proxy's last sync; absent when the agent runs
	// no pods.
	Proxy *report.Proxy `json:"proxy,omitempty"`
}

// ReadStatus reads a Status from the store alone.
func ReadStatus(st *store.Store) (Status, error) {
	s := Status{From: "store", Store: StoreInfo{Path: st.Path()}, Pods: []PodInfo{}, Services: []ServiceRow{}}
	if fi, err := os.Stat(st.Path()); err == nil {
		s.Store.Bytes = fi.Size()
	}
	meta, err := st.Meta()
	if err != nil {
		return s, fmt.Errorf("read store meta: %w", err)
	}
	s.Node, s.Store.Schema = meta.NodeName, meta.Schema
	if s.JournalBacklog, err = st.Backlog(); err != nil {
		return s, fmt.Errorf("read journal: %w", err)
	}
	journaled := map[string]*corev1.PodStatus{}
	if pend, err := st.Pending(0, 0); err == nil {
		for _, e := range pend {
			var p corev1.Pod
			if strings.HasPrefix(e.Key, "pod/") && p.Unmarshal(e.Value) == nil {
				journaled[string(p.UID)] = &p.Status
			}
		}
	}
	pods, err := st.Pods().List()
	for _, r := range pods {
		p := r.Object
		status := journaled[string(p.UID)]
		if msg, invalid := staticpods.Invalid(p); invalid && status == nil {
			// Never run, so its status is known without a worker.
			st := invalidStatus(p, rejection{ReasonInvalidPod, msg}, "")
			status = &st
		}
		s.Pods = append(s.Pods, PodInfo{
			Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Source: r.Source.String(),
			Containers: len(p.Spec.Containers), Images: podImages(p), Status: status,
		})
	}
	if err != nil {
		return s, fmt.Errorf("read pods: %w", err)
	}
	svcs, err := st.Services().List()
	for _, r := range svcs {
		v := r.Object
		var ports []string
		for _, p := range v.Spec.Ports {
			port := strconv.Itoa(int(p.Port))
			if p.NodePort != 0 {
				port += ":" + strconv.Itoa(int(p.NodePort))
			}
			ports = append(ports, port+"/"+string(cmp.Or(p.Protocol, corev1.ProtocolTCP)))
		}
		s.Services = append(s.Services, ServiceRow{
			Namespace: v.Namespace, Name: v.Name, Source: r.Source.String(), Type: string(cmp.Or(v.Spec.Type, corev1.ServiceTypeClusterIP)),
			ClusterIP: v.Spec.ClusterIP, Ports: strings.Join(ports, ","),
		})
	}
	if err != nil {
		return s, fmt.Errorf("read services: %w", err)
	}
	return s, nil
}

// Status returns the running agent's status.
func (a *Agent) Status() (Status, error) {
	s, err := ReadStatus(a.deps.Store)
	s.From = "agent"
	if a.pods != nil {
		views := a.pods.views()
		for i := range s.Pods {
			// A worker that has not synced yet leaves the journal's
			// last-known status in place.
			if v, ok := views[s.Pods[i].UID]; ok && v.Status.Phase != "" {
				st := v.Status
				s.Pods[i].Status, s.Pods[i].Events, s.Pods[i].Synced = &st, v.Events, true
			}
		}
	}
	board := a.cfg.Board
	if a.deps.BoardHealth != nil {
		board.Health = a.deps.BoardHealth()
	}
	a.mu.Lock()
	s.Agent = &AgentInfo{
		Version: a.cfg.Version, Board: board, PID: os.Getpid(), Started: a.started, LastSync: a.lastSync,
		ManifestErrors: append([]string(nil), a.manifestErrors...), StoreWrites: a.storeWrites,
	}
	a.mu.Unlock()
	if a.deps.Link != nil {
		l := a.deps.Link()
		s.Agent.Link = &l
	}
	if a.deps.Proxy != nil {
		p := a.deps.Proxy()
		s.Agent.Proxy = &p
	}
	return s, err
}

func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		s, err := a.Status()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s)
	})
	return mux
}

// PodViews returns the pods the agent runs, by UID, as it last saw them. A
// pod whose worker has not computed a status since the agent started has
// an empty Status.Phase.
func (a *Agent) PodViews() map[string]PodView {
	if a.pods == nil {
		return nil
	}
	return a.pods.views()
}
