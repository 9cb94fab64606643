// Package prober runs Kubernetes container probes (liveness, readiness and
// startup) the way kubelet does.
//
// # Basics
//
// [Do] runs one attempt of a probe (exec, httpGet, tcpSocket or grpc)
// against a [Target] and returns [Success], [Failure] or [Unknown] (the
// attempt errored and says nothing about the container). A [Worker] runs
// one probe of one container instance periodically on an injected clock,
// applies initialDelaySeconds, periodSeconds, successThreshold and
// failureThreshold, and reports only changes of the thresholded result.
//
// # Caveats
//
//   - A Worker probes one container instance. After a liveness or startup
//     probe fails, the container is to be restarted: the worker stops and
//     the caller starts a new one for the new instance.
//   - Liveness and readiness probes are not meant to run before the startup
//     probe, if any, has succeeded; the caller starts their workers then.
//   - The per-attempt timeout (timeoutSeconds) is a network deadline and
//     uses the wall clock; everything else uses the injected clock.
package prober
