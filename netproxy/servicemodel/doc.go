// Package servicemodel is the model of Services the proxy programs: a
// ServicePort is one port of one Service with its addresses and its
// endpoints (model.go). Build makes every ServicePort from the stored
// Services and EndpointSlices and this node's pods with the readiness the
// agent sees now (build.go); Index makes again only those of the Services
// that changed, object by object, and says which ServicePorts changed
// (index.go). netproxy/proxy reads the store and runs them, and
// netproxy/nft renders ServicePorts into nftables rules; this package
// only turns the objects it is given into ServicePorts.
package servicemodel
