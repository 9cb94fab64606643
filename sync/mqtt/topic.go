package mqtt

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Prefix is the root of every topic outpost uses.
const Prefix = "outpost/v1/"

// The kinds of desired objects, as they are spelled in topics.
const (
	KindPods           = "pods"
	KindConfigMaps     = "configmaps"
	KindSecrets        = "secrets"
	KindServices       = "services"
	KindEndpointSlices = "endpointslices"
)

// nodeKinds are the kinds published per node; clusterKinds once for all.
var (
	nodeKinds    = []string{KindPods, KindConfigMaps, KindSecrets}
	clusterKinds = []string{KindServices, KindEndpointSlices}
)

// Scope says whether a desired topic is one node's or the cluster's.
type Scope uint8

// The scopes of desired topics.
const (
	ScopeNode    Scope = 1
	ScopeCluster Scope = 2
)

// Topic is a parsed outpost topic.
type Topic struct {
	// Node is the node a node topic belongs to; empty for cluster topics.
	Node string
	// Scope is set for desired objects and indexes.
	Scope Scope
	// Kind is the desired kind (pods, services, …), empty for an index.
	Kind string
	// Namespace and Name name a desired object or a pod status.
	Namespace, Name string
	// Index marks the retained index of a scope.
	Index bool
	// Status is "node" or "pods" for status topics.
	Status string
	// Events and Online mark those topics.
	Events, Online bool
	// RPC is "down" or "up" for the tunnel's topics.
	RPC string
}

// DesiredTopic is the topic of a desired object of node (kind pods,
// configmaps or secrets).
func DesiredTopic(node, kind, namespace, name string) string {
	return Prefix + "nodes/" + node + "/desired/" + kind + "/" + namespace + "/" + name
}

// ClusterTopic is the topic of a Service or EndpointSlice (kind services
// or endpointslices), one copy for all nodes.
func ClusterTopic(kind, namespace, name string) string {
	return Prefix + "cluster/" + kind + "/" + namespace + "/" + name
}

// NodeIndexTopic is the retained index of node's desired objects.
func NodeIndexTopic(node string) string { return Prefix + "nodes/" + node + "/desired/index" }

// ClusterIndexTopic is the retained index of the Services and
// EndpointSlices.
const ClusterIndexTopic = Prefix + "cluster/index"

// NodeStatusTopic is where node publishes its Node status.
func NodeStatusTopic(node string) string { return Prefix + "nodes/" + node + "/status/node" }

// PodStatusTopic is where node publishes a pod's status.
func PodStatusTopic(node, namespace, name string) string {
	return Prefix + "nodes/" + node + "/status/pods/" + namespace + "/" + name
}

// EventsTopic is where node publishes its events.
func EventsTopic(node string) string { return Prefix + "nodes/" + node + "/events" }

// OnlineTopic holds node's retained online flag, "true" or "false".
func OnlineTopic(node string) string { return Prefix + "nodes/" + node + "/online" }

// BridgeTokensTopic holds the bridge's own copy of a node's tokens
// Secret (namespace/name), sealed to the bridge's key, retained: only
// the bridge may read or write outpost/v1/bridge/ (packaging/mosquitto's
// ACL grants nodes nothing there). ParseTopic does not take it.
func BridgeTokensTopic(node, namespace, name string) string {
	return Prefix + "bridge/tokens/" + node + "/" + namespace + "/" + name
}

// RPCDownTopic carries the bridge's tunnel frames to node: the kubelet
// API requests the API server makes of it (rpc.go). Only the bridge
// may write there, and only node read.
func RPCDownTopic(node string) string { return Prefix + "nodes/" + node + "/rpc/down" }

// RPCUpTopic carries node's tunnel frames to the bridge.
func RPCUpTopic(node string) string { return Prefix + "nodes/" + node + "/rpc/up" }

// Online flag payloads.
const (
	OnlineTrue  = "true"
	OnlineFalse = "false"
)

// ParseTopic parses an outpost topic, checking each name in it.
func ParseTopic(topic string) (Topic, error) {
	rest, ok := strings.CutPrefix(topic, Prefix)
	if !ok {
		return Topic{}, fmt.Errorf("topic %q: not under %s", topic, Prefix)
	}
	parts := strings.Split(rest, "/")
	bad := func(format string, args ...any) (Topic, error) {
		return Topic{}, fmt.Errorf("topic %q: %s", topic, fmt.Sprintf(format, args...))
	}
	switch parts[0] {
	case "cluster":
		if len(parts) == 2 && parts[1] == "index" {
			return Topic{Scope: ScopeCluster, Index: true}, nil
		}
		if len(parts) != 4 || !oneOf(parts[1], clusterKinds) {
			return bad("not cluster/index or cluster/{services,endpointslices}/NAMESPACE/NAME")
		}
		if err := checkName(parts[2], parts[3]); err != nil {
			return bad("%v", err)
		}
		return Topic{Scope: ScopeCluster, Kind: parts[1], Namespace: parts[2], Name: parts[3]}, nil
	case "nodes":
		if len(parts) < 3 {
			return bad("no node topic after nodes/NODE")
		}
		node := parts[1]
		if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
			return bad("node %q: %s", node, errs[0])
		}
		t := Topic{Node: node}
		switch {
		case len(parts) == 3 && parts[2] == "online":
			t.Online = true
		case len(parts) == 3 && parts[2] == "events":
			t.Events = true
		case len(parts) == 4 && parts[2] == "rpc" && (parts[3] == "down" || parts[3] == "up"):
			t.RPC = parts[3]
		case len(parts) == 4 && parts[2] == "status" && parts[3] == "node":
			t.Status = "node"
		case len(parts) == 6 && parts[2] == "status" && parts[3] == "pods":
			if err := checkName(parts[4], parts[5]); err != nil {
				return bad("%v", err)
			}
			t.Status, t.Namespace, t.Name = "pods", parts[4], parts[5]
		case len(parts) == 4 && parts[2] == "desired" && parts[3] == "index":
			t.Scope, t.Index = ScopeNode, true
		case len(parts) == 6 && parts[2] == "desired" && oneOf(parts[3], nodeKinds):
			if err := checkName(parts[4], parts[5]); err != nil {
				return bad("%v", err)
			}
			t.Scope, t.Kind, t.Namespace, t.Name = ScopeNode, parts[3], parts[4], parts[5]
		default:
			return bad("not an outpost node topic")
		}
		return t, nil
	}
	return bad("neither nodes/ nor cluster/")
}

// String is the topic t was parsed from.
func (t Topic) String() string {
	switch {
	case t.Scope == ScopeCluster && t.Index:
		return ClusterIndexTopic
	case t.Scope == ScopeCluster:
		return ClusterTopic(t.Kind, t.Namespace, t.Name)
	case t.Scope == ScopeNode && t.Index:
		return NodeIndexTopic(t.Node)
	case t.Scope == ScopeNode:
		return DesiredTopic(t.Node, t.Kind, t.Namespace, t.Name)
	case t.Online:
		return OnlineTopic(t.Node)
	case t.Events:
		return EventsTopic(t.Node)
	case t.RPC == "down":
		return RPCDownTopic(t.Node)
	case t.RPC == "up":
		return RPCUpTopic(t.Node)
	case t.Status == "node":
		return NodeStatusTopic(t.Node)
	case t.Status == "pods":
		return PodStatusTopic(t.Node, t.Namespace, t.Name)
	}
	return ""
}

// kindLabel is the topic's kind for metrics: a desired kind, index,
// status-node, status-pods, events or online.
func (t Topic) kindLabel() string {
	switch {
	case t.Index:
		return "index"
	case t.Kind != "":
		return t.Kind
	case t.Status != "":
		return "status-" + t.Status
	case t.Events:
		return "events"
	case t.Online:
		return "online"
	case t.RPC != "":
		return "rpc"
	}
	return "other"
}

func checkName(namespace, name string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", namespace, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("name %q: %s", name, errs[0])
	}
	return nil
}

func oneOf(s string, set []string) bool {
	for _, x := range set {
		if s == x {
			return true
		}
	}
	return false
}
