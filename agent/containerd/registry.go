package containerd

import (
	"net/http"
	"time"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
)

// registryResponseTimeout bounds the wait for a registry's response
// headers (not for a download's body).
const registryResponseTimeout = time.Minute

// registryHosts maps a registry host to how it is reached, as containerd's
// ctr and its default hosts configuration do: HTTPS with the registry's
// token authentication, except a registry on the loopback (localhost,
// 127.0.0.1, ::1), which is spoken to over plain HTTP. The client and its
// connections are shared by every request of one pull; a registry that
// accepts a connection and then says nothing fails the pull after
// registryResponseTimeout instead of holding the pod's worker forever.
func registryHosts() docker.RegistryHosts {
	transport := docker.DefaultHTTPTransport(nil)
	transport.ResponseHeaderTimeout = registryResponseTimeout
	client := &http.Client{Transport: transport}
	return docker.ConfigureDefaultRegistries(
		docker.WithClient(client),
		docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthClient(client))),
		docker.WithPlainHTTP(docker.MatchLocalhost),
	)
}

// pullResolver returns the resolver of one pull. Each pull gets its own:
// the client sets per-pull options on the resolver it is given.
func pullResolver() remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: registryHosts()})
}
